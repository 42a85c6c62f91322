"""A responder's token on the Kubernetes-compatible API, through the real `loopd up` and the real kubectl: it reads
Tasks and writes only the status of Tasks addressed to it; the admin token keeps every verb (issue 10, item 7)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import httpx

from tests.support.availability import missing
from tests.support.kubectl import Kubectl, find_kubectl

from .conftest import LOOPD, UpProcess, env_for

TASK_YAML = """apiVersion: loopd.dev/v1alpha1
kind: Task
metadata: {{name: {name}}}
spec: {{target: {{kind: operator, key: {key}}}, revision: 1}}
"""


def _loopd(up: UpProcess, *args: str) -> str:
    done = subprocess.run(
        [LOOPD, *args, "--data-dir", str(up.data_dir)], env=env_for(up.data_dir), capture_output=True, timeout=30
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def test_a_responder_kubeconfig_has_only_the_responders_rights(up: UpProcess, tmp_path: Path) -> None:
    binary = find_kubectl()
    if binary is None:
        missing("kubectl is not installed")
        return
    token = _loopd(up, "token", "create", "operator:router").strip()
    admin_config, router_config = tmp_path / "admin.kubeconfig", tmp_path / "router.kubeconfig"
    admin_config.write_text(_loopd(up, "kubeconfig"))
    router_config.write_text(_loopd(up, "kubeconfig", "--token", token))
    admin = Kubectl(binary, admin_config, tmp_path / "home-admin")
    router = Kubectl(binary, router_config, tmp_path / "home-router")

    async def scenario() -> None:
        await admin.ok("apply", "-f", "-", stdin=TASK_YAML.format(name="mine", key="router"))
        await admin.ok("apply", "-f", "-", stdin=TASK_YAML.format(name="theirs", key="echo"))
        names = await router.ok("get", "tasks", "-o", "name")
        assert "task.loopd.dev/mine" in names and "task.loopd.dev/theirs" in names
        status = '{"status":{"phase":"Running","responder":"operator:router"}}'
        await router.ok("patch", "task", "mine", "--subresource=status", "--type=merge", "-p", status)
        refused = await router.run("patch", "task", "theirs", "--subresource=status", "--type=merge", "-p", status)
        assert refused.returncode != 0 and "Forbidden" in refused.output, refused.output
        deleted = await router.run("delete", "task", "mine")
        assert deleted.returncode != 0 and "Forbidden" in deleted.output, deleted.output
        assert "Running" in await admin.ok("get", "task", "mine", "-o", "jsonpath={.status.phase}")
        await admin.ok("delete", "task", "mine", "theirs")

    asyncio.run(scenario())
    # The same token on the HTTP API is exactly operator:router, never the admin.
    me = httpx.get(up.url + "/v1/me", headers={"Authorization": f"Bearer {token}"}, timeout=15.0)
    assert me.json()["kind"] == "operator" and me.json()["key"] == "router", me.text
