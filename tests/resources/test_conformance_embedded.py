"""The kubectl conformance suite (tests/conformance/suite.py) against loopd's embedded API.

Each check gets a fresh embedded API (real TLS on 127.0.0.1, a real SQLite store) with the Gadget CRD applied
through kubectl; tests/k8s/test_conformance_real.py runs the same checks against a real kube-apiserver.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd.resources import ApiCredentials
from tests.conformance.suite import CHECKS, Target, install, run_check
from tests.resources.conftest import open_running_api, require_kubectl
from tests.support.kubectl import Kubectl

pytestmark = pytest.mark.kubectl


@pytest.mark.parametrize("name", sorted(CHECKS))
async def test_conformance(name: str, tmp_path: Path, credentials: ApiCredentials) -> None:
    # A small event window so that a watch from an early resourceVersion expires after a few dozen writes.
    async with open_running_api(tmp_path, credentials, event_window=40, poll_interval=0.05) as api:
        target = Target(
            name="embedded",
            url=api.url,
            token=credentials.token,
            ca_file=credentials.ca_cert_file,
            kubectl=Kubectl(require_kubectl(), api.kubeconfig, tmp_path / "kube-home"),
            garbage_collector=True,
            auto_namespaces=True,
            consistent_pages=False,
            bookmarks_guaranteed=True,
            protobuf=False,
            apply_conflicts=False,
        )
        await install(target, tmp_path / "work")
        await run_check(target, tmp_path / "work", name)
