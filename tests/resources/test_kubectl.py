"""Conformance with the real kubectl (a client nobody here wrote) over real TLS with a bearer token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from loopd.resources import TASK_KIND, ApiCredentials, builtin_crds
from tests.resources.conftest import RunningApi, open_running_api, require_kubectl
from tests.support.kubectl import Kubectl
from tests.support.waiting import eventually

pytestmark = pytest.mark.kubectl

TASK_YAML = """\
apiVersion: loopd.dev/v1alpha1
kind: Task
metadata:
  name: {name}
  labels:
    team: "{team}"
spec:
  target:
    kind: operator
    key: router
"""

WIDGET_CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {kind: Widget, plural: widgets, singular: widget, shortNames: [wd]}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer, minimum: 1}
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


async def test_task_lifecycle_with_kubectl(kubectl: Kubectl, tmp_path: Path) -> None:
    manifest = write(tmp_path, "t1.yaml", TASK_YAML.format(name="t1", team="a"))
    assert "task.loopd.dev/t1 created" in await kubectl.ok("apply", "-f", manifest)
    assert "task.loopd.dev/t1 unchanged" in await kubectl.ok("apply", "-f", manifest)
    await kubectl.ok("apply", "-f", write(tmp_path, "t2.yaml", TASK_YAML.format(name="t2", team="b")))

    obj = yaml.safe_load(await kubectl.ok("get", "task", "t1", "-o", "yaml"))
    assert obj["spec"]["target"] == {"kind": "operator", "key": "router"}
    assert obj["metadata"]["uid"] and obj["metadata"]["generation"] == 1
    assert "kubectl.kubernetes.io/last-applied-configuration" in obj["metadata"]["annotations"]

    table = await kubectl.ok("get", "tasks")
    assert table.splitlines()[0].split() == ["NAME", "TARGET-KIND", "TARGET", "REVISION", "PHASE", "RESPONDER", "AGE"]

    watcher = await kubectl.start("get", "tasks", "-w", "--output-watch-events")
    try:
        await watcher.read_until("t2")  # the initial list
        await kubectl.ok(
            "patch", "task", "t1", "--subresource", "status", "--type", "merge", "-p", '{"status":{"phase":"Running"}}'
        )
        lines = await watcher.read_until("Running")
        assert lines[-1].split()[:2] == ["MODIFIED", "t1"]
    finally:
        await watcher.stop()

    assert "patched" in await kubectl.ok("patch", "task", "t1", "--type", "merge", "-p", '{"spec":{"revision":2}}')
    patched = json.loads(await kubectl.ok("get", "tk", "t1", "-o", "json"))
    assert patched["spec"]["revision"] == 2 and patched["metadata"]["generation"] == 2
    assert patched["status"] == {"phase": "Running"}

    def names(output: str) -> list[str]:
        return [line.split()[0] for line in output.splitlines()[1:]]

    assert names(await kubectl.ok("get", "tasks", "-l", "team=a")) == ["t1"]
    assert names(await kubectl.ok("get", "tasks", "-l", "team!=a")) == ["t2"]
    assert names(await kubectl.ok("get", "tasks", "-l", "team in (a,b)")) == ["t1", "t2"]
    everywhere = await kubectl.ok("get", "tasks", "-A", "--show-labels")
    assert "default" in everywhere and "team=a" in everywhere

    assert 'task.loopd.dev "t1" deleted' in await kubectl.ok("delete", "task", "t1")
    missing = await kubectl.run("get", "task", "t1")
    assert missing.returncode != 0
    assert 'Error from server (NotFound): tasks.loopd.dev "t1" not found' in missing.stderr


async def test_stale_update_is_conflict(kubectl: Kubectl, tmp_path: Path) -> None:
    await kubectl.ok("apply", "-f", write(tmp_path, "t1.yaml", TASK_YAML.format(name="t1", team="a")))
    stale = await kubectl.ok("get", "task", "t1", "-o", "json")
    await kubectl.ok("patch", "task", "t1", "--type", "merge", "-p", '{"spec":{"revision":3}}')
    result = await kubectl.run("replace", "-f", "-", stdin=stale)
    assert result.returncode != 0
    assert "Error from server (Conflict)" in result.stderr
    assert "the object has been modified" in result.stderr


async def test_invalid_task_names_the_field(kubectl: Kubectl, tmp_path: Path) -> None:
    bad = write(tmp_path, "bad.yaml", TASK_YAML.format(name="bad", team="a").replace("    key: router\n", ""))
    for verb in ("apply", "create"):
        result = await kubectl.run(verb, "-f", bad)
        assert result.returncode != 0
        assert 'The Task "bad" is invalid: spec.target.key: Required value' in result.stderr


async def test_watch_resume_from_a_resource_version(kubectl: Kubectl, api: RunningApi) -> None:
    collection = "/apis/loopd.dev/v1alpha1/namespaces/default/tasks"
    start = json.loads(await kubectl.ok("get", "--raw", collection))["metadata"]["resourceVersion"]
    await api.store.create(TASK_KIND, yaml.safe_load(TASK_YAML.format(name="t1", team="a")))
    await api.store.patch(TASK_KIND, "t1", {"spec": {"revision": 2}})
    raw = await kubectl.ok("get", "--raw", f"{collection}?watch=true&timeoutSeconds=1&resourceVersion={start}")
    lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
    assert [(e["type"], e["object"]["spec"]["revision"]) for e in lines] == [("ADDED", 1), ("MODIFIED", 2)]


async def test_expired_watch_then_relist(tmp_path: Path, credentials: ApiCredentials) -> None:
    async with open_running_api(tmp_path, credentials, event_window=3, poll_interval=0.05) as api:
        kubectl = Kubectl(require_kubectl(), api.kubeconfig, tmp_path / "home")
        collection = "/apis/loopd.dev/v1alpha1/namespaces/default/tasks"
        start = json.loads(await kubectl.ok("get", "--raw", collection))["metadata"]["resourceVersion"]
        for index in range(20):
            await api.store.create(TASK_KIND, yaml.safe_load(TASK_YAML.format(name=f"t{index}", team="a")))

        async def expired_watch() -> dict[str, Any] | None:
            raw = await kubectl.ok("get", "--raw", f"{collection}?watch=true&timeoutSeconds=1&resourceVersion={start}")
            event: dict[str, Any] = json.loads(raw.splitlines()[0])
            return event if event["type"] == "ERROR" else None

        # Compaction runs in the background: wait until a watch from `start` expires, not for time.
        event = await eventually(expired_watch, timeout=30.0, what="the watch from a compacted version to expire")
        assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")
        relisted = json.loads(await kubectl.ok("get", "--raw", collection))
        assert len(relisted["items"]) == 20
        resumed = relisted["metadata"]["resourceVersion"]
        await api.store.delete(TASK_KIND, "t0")
        raw = await kubectl.ok("get", "--raw", f"{collection}?watch=true&timeoutSeconds=1&resourceVersion={resumed}")
        assert [json.loads(line)["type"] for line in raw.splitlines() if line.strip()] == ["DELETED"]


async def test_crds_apply_the_same_way_as_on_a_cluster(kubectl: Kubectl, tmp_path: Path) -> None:
    crds = tmp_path / "crds"
    crds.mkdir()
    for crd in builtin_crds():
        (crds / f"{crd['metadata']['name']}.yaml").write_text(yaml.safe_dump(crd, sort_keys=False))
    (crds / "widgets.example.com.yaml").write_text(WIDGET_CRD)
    applied = await kubectl.ok("apply", "-f", str(crds))
    assert "customresourcedefinition.apiextensions.k8s.io/widgets.example.com created" in applied
    assert "tasks.loopd.dev" in await kubectl.ok("get", "crd")
    widget = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 3}\n"
    assert "widget.example.com/w1 created" in await kubectl.ok("apply", "-f", "-", stdin=widget)
    assert (await kubectl.ok("get", "wd")).splitlines()[1].split() == ["w1", "3"]
    invalid = await kubectl.run("apply", "-f", "-", stdin=widget.replace("w1", "w2").replace("3", "0"))
    assert "spec.size" in invalid.stderr and invalid.returncode != 0
    await kubectl.ok("delete", "crd", "widgets.example.com")
    gone = await kubectl.run("get", "widgets")
    assert gone.returncode != 0


async def test_namespaces_and_leases(kubectl: Kubectl) -> None:
    assert "default" in await kubectl.ok("get", "namespaces")
    lease = "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: leader}\nspec: {holderIdentity: me}\n"
    await kubectl.ok("apply", "-f", "-", stdin=lease)
    got = json.loads(await kubectl.ok("get", "lease", "leader", "-o", "json"))
    assert got["spec"]["holderIdentity"] == "me"
