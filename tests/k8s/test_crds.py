"""loopd's CRDs on the real kube-apiserver: they install with kubectl, become Established, and their schemas and
CEL rules are enforced by the real server (not only by loopd's embedded API)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.k8s.cluster import KubeCluster
from tests.support.waiting import wait_until

MERGE = "application/merge-patch+json"


def _run(name: str, namespace: str, goal: str = "Find the answer") -> dict[str, Any]:
    return {
        "apiVersion": "longhorizon.loopd.dev/v1alpha1",
        "kind": "Run",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"conversation": {"name": "c1"}, "inputMessageID": "m1", "goal": goal},
    }


def test_every_loopd_crd_is_established(kube_cluster: KubeCluster, loopd_crds: list[str]) -> None:
    assert {"tasks.loopd.dev", "runs.longhorizon.loopd.dev", "executions.longhorizon.loopd.dev"} <= set(loopd_crds)
    listing = json.loads(kube_cluster.kubectl("get", "crd", "-o", "json").stdout)
    conditions = {
        item["metadata"]["name"]: {c["type"]: c["status"] for c in item.get("status", {}).get("conditions", [])}
        for item in listing["items"]
    }
    for name in loopd_crds:
        assert conditions[name].get("Established") == "True", (name, conditions.get(name))
        assert conditions[name].get("NamesAccepted") == "True", (name, conditions.get(name))
    # Re-applying the same manifests is a no-op (what an upgrade or a second replica does).
    out = kube_cluster.kubectl("apply", "-f", "-", input=_crd_yaml()).stdout
    assert "unchanged" in out and "configured" not in out, out


def _crd_yaml() -> str:
    import yaml

    from tests.k8s.conftest import loopd_crd_manifests

    return yaml.safe_dump_all(loopd_crd_manifests(), sort_keys=False)


def test_the_real_server_enforces_run_spec_immutability(
    kube_cluster: KubeCluster, loopd_crds: list[str], k8s_namespace: str
) -> None:
    created = kube_cluster.apply([_run("r1", k8s_namespace)])
    assert "created" in created
    base = f"/apis/longhorizon.loopd.dev/v1alpha1/namespaces/{k8s_namespace}/runs/r1"
    status, run = kube_cluster.request("GET", base)
    assert status == 200
    assert run["spec"]["maxRounds"] == 25  # the schema's default, applied by the real server

    status, body = kube_cluster.request("PATCH", base, {"spec": {"goal": "Something else"}}, content_type=MERGE)
    assert status == 422, body
    assert body["reason"] == "Invalid"
    causes = body["details"]["causes"]
    assert any(c.get("field") == "spec" and "spec is immutable" in c.get("message", "") for c in causes), causes

    failed = kube_cluster.kubectl(
        "-n", k8s_namespace, "patch", "runs.longhorizon.loopd.dev", "r1", "--type=merge", "-p",
        '{"spec":{"maxRounds":3}}', check=False,
    )  # fmt: skip
    assert failed.returncode != 0 and "spec is immutable" in failed.stderr, failed.stderr

    # Metadata and status stay writable.
    status, _ = kube_cluster.request("PATCH", base, {"metadata": {"labels": {"a": "b"}}}, content_type=MERGE)
    assert status == 200
    status, after = kube_cluster.request("GET", base)
    assert after["spec"]["goal"] == "Find the answer" and after["metadata"]["labels"] == {"a": "b"}


def test_the_real_server_validates_task_specs(
    kube_cluster: KubeCluster, loopd_crds: list[str], k8s_namespace: str
) -> None:
    path = f"/apis/loopd.dev/v1alpha1/namespaces/{k8s_namespace}/tasks"
    status, body = kube_cluster.request(
        "POST", path, {"apiVersion": "loopd.dev/v1alpha1", "kind": "Task", "metadata": {"name": "bad"}, "spec": {}}
    )
    assert status == 422, body
    assert body["reason"] == "Invalid"
    good = {
        "apiVersion": "loopd.dev/v1alpha1",
        "kind": "Task",
        "metadata": {"name": "good"},
        "spec": {"target": {"kind": "operator", "key": "router"}, "revision": 1},
    }
    status, body = kube_cluster.request("POST", path, good)
    assert status == 201, body
    assert body["metadata"]["generation"] == 1


def test_an_execution_is_collected_with_its_run(
    kube_cluster: KubeCluster, loopd_crds: list[str], k8s_namespace: str
) -> None:
    """The real garbage collector (kube-controller-manager) deletes a LongHorizon Execution whose controlling
    owner, its Run, was deleted — what the embedded API's owner cascade does for the all-in-one process."""
    if not kube_cluster.has_controller_manager:
        pytest.fail("kube-controller-manager is not built: run `python scripts/k8s_tools.py ensure`")
    kube_cluster.apply([_run("owner", k8s_namespace)])
    base = f"/apis/longhorizon.loopd.dev/v1alpha1/namespaces/{k8s_namespace}"
    _, run = kube_cluster.request("GET", f"{base}/runs/owner")
    execution = {
        "apiVersion": "longhorizon.loopd.dev/v1alpha1",
        "kind": "Execution",
        "metadata": {
            "name": "owner-1",
            "ownerReferences": [
                {
                    "apiVersion": "longhorizon.loopd.dev/v1alpha1",
                    "kind": "Run",
                    "name": "owner",
                    "uid": run["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"run": "owner", "round": 1, "contractVersion": 1, "plan": "look it up"},
    }
    status, body = kube_cluster.request("POST", f"{base}/executions", execution)
    assert status == 201, body
    status, _ = kube_cluster.request("DELETE", f"{base}/runs/owner")
    assert status == 200

    def collected() -> bool:
        return kube_cluster.request("GET", f"{base}/executions/owner-1")[0] == 404

    wait_until(collected, timeout=30, what="the garbage collector to delete the Execution")
