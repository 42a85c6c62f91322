"""The Helm chart's RBAC on the real API server: render ``deploy/helm/loopd``'s ``templates/rbac.yaml`` with the
cached helm, apply it in a namespace, and hand out a kubeconfig of one component's ServiceAccount, so a test runs
with exactly the permissions the chart grants that component (nothing more)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from tests.k8s.cluster import REPO, KubeCluster, cached_tool

CHART = REPO / "deploy" / "helm" / "loopd"
RELEASE = "t"


def helm_path() -> Path | None:
    """The cached helm binary (``scripts/k8s_tools.py``), or None."""
    return cached_tool("helm")


def render_rbac(namespace: str, *, release: str = RELEASE, values: Sequence[str] = ()) -> str:
    """``helm template RELEASE deploy/helm/loopd -n NAMESPACE -s templates/rbac.yaml`` (``values``: ``--set`` items)."""
    helm = helm_path()
    if helm is None:
        raise AssertionError("helm is not built: run `python scripts/k8s_tools.py ensure`")
    argv = [str(helm), "template", release, str(CHART), "--namespace", namespace, "--show-only", "templates/rbac.yaml"]
    for item in values:
        argv += ["--set", item]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise AssertionError(f"helm template failed ({result.returncode}): {result.stderr}")
    return result.stdout


def chart_component_kubeconfig(
    cluster: KubeCluster, namespace: str, component: str, *, release: str = RELEASE, values: Sequence[str] = ()
) -> Path:
    """Apply the chart's RBAC in ``namespace`` and return a kubeconfig of ``component``'s ServiceAccount
    (``server``, ``router`` or ``longhorizon``), authenticated with a TokenRequest token."""
    cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    cluster.apply(render_rbac(namespace, release=release, values=values), namespace=namespace)
    account = f"{release}-loopd-{component}"
    return cluster.service_account_kubeconfig(namespace, account, create_namespace=False)
