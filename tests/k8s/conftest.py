"""Fixtures for tests against a real kube-apiserver + etcd (``make test-k8s``).

Collected only with ``LOOPD_K8S=1`` (``make test`` never runs them). The binaries come from
``scripts/k8s_tools.py`` (cached builds); when they are missing a test skips locally and fails under ``CI=true``.

Fixtures:
- ``kube_cluster`` (session): a ``tests.k8s.cluster.KubeCluster`` — ``server``, ``ca_path``, ``admin_token``,
  ``kubeconfig`` (admin, a file), ``kubectl(*args, input=None, kubeconfig=None, check=True)``,
  ``apply(yaml_or_objects)``, ``request(method, path, body)``, ``create_namespace(prefix)``,
  ``kubeconfig_dict(token=None, namespace=...)`` and ``service_account_kubeconfig(namespace, name)`` (creates the SA,
  returns a kubeconfig path with a TokenRequest token: exactly the RBAC bound to it).
- ``k8s_namespace``: a fresh namespace per test.
- ``loopd_crds`` (session): every loopd CRD (``loopd manifests crds`` + LongHorizon's) applied and Established.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.cluster import ClusterError, KubeCluster, cached_tool, start_cluster
from tests.support.availability import missing

if os.environ.get("LOOPD_K8S") != "1":
    collect_ignore_glob = ["*.py"]  # `make test` skips this folder; `make test-k8s` sets LOOPD_K8S=1


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeCluster]:
    """etcd + kube-apiserver for the whole session (one per xdist worker), stopped by pid at the end."""
    absent = [name for name in ("etcd", "kube-apiserver") if cached_tool(name) is None]
    if absent:
        missing(f"{', '.join(absent)} not built: run `python scripts/k8s_tools.py ensure` (make test-k8s does)")
    workdir = Path(tempfile.mkdtemp(prefix="loopd-k8s-"))
    try:
        try:
            cluster = start_cluster(workdir)
        except ClusterError as exc:
            pytest.fail(f"the real Kubernetes API server did not start: {exc}")
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # etcd's WAL alone is 64 MB


@pytest.fixture
def k8s_namespace(kube_cluster: KubeCluster) -> str:
    """A new namespace for one test."""
    return kube_cluster.create_namespace("t")


def loopd_crd_manifests() -> list[dict[str, Any]]:
    """Every loopd CRD: what ``loopd manifests crds`` prints, plus LongHorizon's (deduplicated by name)."""
    import yaml

    from loopd.cli._resources_commands import render_crds
    from loopd.operators.longhorizon import crds as longhorizon_crds

    found: dict[str, dict[str, Any]] = {}
    for doc in yaml.safe_load_all(render_crds()):
        if doc:
            found[doc["metadata"]["name"]] = doc
    for doc in longhorizon_crds():
        found.setdefault(doc["metadata"]["name"], doc)
    return list(found.values())


@pytest.fixture(scope="session")
def loopd_crds(kube_cluster: KubeCluster) -> list[str]:
    """Apply every loopd CRD with kubectl and wait until each is Established; their names."""
    manifests = loopd_crd_manifests()
    kube_cluster.apply(manifests)
    names = [m["metadata"]["name"] for m in manifests]
    kube_cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{name}" for name in names], timeout=90
    )
    return names
