"""The chart against the real kube-apiserver: every value set passes ``kubectl apply --dry-run=server`` (schemas,
RBAC objects, CRD-backed validation by the real thing), and the RBAC it grants, applied for real, allows each
component exactly what its code calls (``kubectl auth can-i`` as each ServiceAccount)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.chart import CHART, helm, run_helm, value_sets
from tests.k8s.cluster import KubeCluster
from tests.support.waiting import wait_until

RELEASE = "loopd"


def _rendered(namespace: str, values: Path | None = None, *extra: str) -> str:
    helm()  # skip (fail under CI=true) without the binary
    args = ["template", RELEASE, str(CHART), "--namespace", namespace, *extra]
    if values is not None:
        args += ["-f", str(values)]
    run = run_helm(args)
    assert run.code == 0, run.stderr
    return run.stdout


def test_the_crds_apply_with_a_server_side_dry_run(kube_cluster: KubeCluster) -> None:
    result = kube_cluster.kubectl("apply", "--dry-run=server", "--server-side", "-f", str(CHART / "crds"))
    assert result.stdout.count("serverside-applied (server dry run)") == 4, result.stdout


@pytest.mark.parametrize("values", value_sets(), ids=lambda path: path.name)
def test_every_value_set_passes_a_server_side_dry_run(
    kube_cluster: KubeCluster, loopd_crds: list[str], values: Path
) -> None:
    namespace = kube_cluster.create_namespace("chart")
    manifests = _rendered(namespace, values)
    result = kube_cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=manifests)
    assert "(server dry run)" in result.stdout
    assert "Deployment" in manifests and "deployment.apps/loopd-server created (server dry run)" in result.stdout


def _can(cluster: KubeCluster, namespace: str, account: str, verb: str, resource: str, *flags: str) -> bool:
    result = cluster.kubectl(
        "auth",
        "can-i",
        verb,
        resource,
        "-n",
        namespace,
        f"--as=system:serviceaccount:{namespace}:{account}",
        *flags,
        check=False,
    )
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stdout + result.stderr
    return answer == "yes"


def test_each_service_account_can_do_exactly_what_its_component_calls(
    kube_cluster: KubeCluster, loopd_crds: list[str]
) -> None:
    namespace = kube_cluster.create_namespace("rbac")
    kube_cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=_rendered(namespace, None, "--show-only", "templates/rbac.yaml")
    )
    server, router, longhorizon = "loopd-server", "loopd-router", "loopd-longhorizon"

    def can(account: str, verb: str, resource: str, *flags: str) -> bool:
        return _can(kube_cluster, namespace, account, verb, resource, *flags)

    # The API server's RBAC cache takes a moment to see new Roles and bindings: wait for one grant of each account.
    crd = "customresourcedefinitions.apiextensions.k8s.io"
    wait_until(
        lambda: (
            can(server, "create", "tasks.loopd.dev")
            and can(router, "update", "leases.coordination.k8s.io")
            and can(longhorizon, "create", "runs.longhorizon.loopd.dev")
            and can(longhorizon, "get", f"{crd}/runs.longhorizon.loopd.dev")
        ),
        what="the chart's RBAC to take effect",
    )

    for verb in ("get", "list", "watch", "create", "patch", "delete"):
        assert can(server, verb, "tasks.loopd.dev")
    assert can(server, "patch", "tasks.loopd.dev", "--subresource=status")
    assert not can(server, "update", "tasks.loopd.dev")
    assert not can(server, "get", "leases.coordination.k8s.io")
    assert not can(server, "get", "secrets")

    for account in (router, longhorizon):
        for verb in ("get", "list", "watch"):
            assert can(account, verb, "tasks.loopd.dev")
        assert can(account, "patch", "tasks.loopd.dev", "--subresource=status")
        assert not can(account, "create", "tasks.loopd.dev")
        assert not can(account, "delete", "tasks.loopd.dev")
        for verb in ("get", "create", "update"):
            assert can(account, verb, "leases.coordination.k8s.io")
        assert not can(account, "delete", "leases.coordination.k8s.io")
        assert not can(account, "get", "secrets") and not can(account, "list", "pods")

    assert not can(router, "get", "runs.longhorizon.loopd.dev")
    for verb in ("get", "list", "watch", "create", "patch", "delete"):
        assert can(longhorizon, verb, "runs.longhorizon.loopd.dev")
    assert can(longhorizon, "update", "runs.longhorizon.loopd.dev", "--subresource=status")
    assert can(longhorizon, "create", "executions.longhorizon.loopd.dev")
    assert not can(longhorizon, "delete", "executions.longhorizon.loopd.dev")
    assert can(longhorizon, "get", f"{crd}/runs.longhorizon.loopd.dev")
    assert not can(longhorizon, "get", f"{crd}/tasks.loopd.dev")
    assert not can(longhorizon, "create", crd) and not can(longhorizon, "update", f"{crd}/runs.longhorizon.loopd.dev")
    # Nothing in another namespace.
    other = kube_cluster.create_namespace("other")
    for account in (server, router, longhorizon):
        result = kube_cluster.kubectl(
            "auth", "can-i", "get", "tasks.loopd.dev", "-n", other,
            f"--as=system:serviceaccount:{namespace}:{account}", check=False,
        )  # fmt: skip
        assert result.stdout.strip() == "no"
