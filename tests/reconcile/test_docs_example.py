"""The controller example in ``loopd.resources.reconcile``'s docstring runs as written, against the embedded API
through a kubeconfig found the way kubectl finds it ($KUBECONFIG)."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

import loopd.resources.reconcile as reconcile
from loopd.resources.client import LEASES, TASKS, open_http_client
from tests.support.waiting import eventually

from .conftest import serve_api
from .helpers import task


def docstring_example() -> str:
    doc = reconcile.__doc__ or ""
    block = doc.split("A controller in twenty lines::", 1)[1]
    return textwrap.dedent(block)


async def test_the_docstring_controller_runs_against_the_embedded_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace: dict[str, Any] = {}
    exec(compile(docstring_example(), "reconcile-docstring-example", "exec"), namespace)
    async with serve_api(tmp_path) as kubeconfig:
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig))
        monkeypatch.setenv("KUBECONFIG", str(path))
        runner = asyncio.ensure_future(namespace["main"]())
        async with open_http_client(path) as client:
            try:
                await client.create(TASKS, task("hello"))

                async def phase() -> str | None:
                    return ((await client.get(TASKS, "hello")).get("status") or {}).get("phase")

                async def succeeded() -> bool:
                    return await phase() == "Succeeded"

                await eventually(succeeded, timeout=15, what="the task to succeed")
                lease = await client.get(LEASES, "greeter", namespace="loopd")
                assert lease["spec"]["holderIdentity"]
            finally:
                runner.cancel()
                await asyncio.gather(runner, return_exceptions=True)
            # Cancelling main() shut the manager down gracefully: the lease was released.
            lease = await client.get(LEASES, "greeter", namespace="loopd")
            assert lease["spec"]["holderIdentity"] in ("", None)
