"""The kubectl conformance suite (tests/conformance/suite.py) against the real kube-apiserver + etcd.

The same checks as tests/resources/test_conformance_embedded.py, with the same kubectl binary, against H1's
``kube_cluster`` (loopd's CRDs applied by ``loopd_crds``, the Gadget test CRD by ``install``). Without
kube-controller-manager nothing collects dependents, so the checks that need a garbage collector stop short.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.suite import CHECKS, Target, install, run_check
from tests.k8s.cluster import KubeCluster
from tests.resources.conftest import require_kubectl
from tests.support.kubectl import Kubectl


@pytest.fixture
async def real_target(kube_cluster: KubeCluster, loopd_crds: list[str], tmp_path: Path) -> Target:
    target = Target(
        name="real",
        url=kube_cluster.server,
        token=kube_cluster.admin_token,
        ca_file=Path(kube_cluster.ca_path),
        kubectl=Kubectl(require_kubectl(), Path(kube_cluster.kubeconfig), tmp_path / "kube-home"),
        garbage_collector=kube_cluster.has_controller_manager,
    )
    await install(target, tmp_path / "work")  # idempotent: the first test applies the CRD, the others see it
    return target


# The first check may start the cluster, and the garbage-collector checks wait for kube-controller-manager to
# discover the test CRD (its discovery resync is 30 s).
@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", sorted(CHECKS))
async def test_conformance(name: str, real_target: Target, tmp_path: Path) -> None:
    await run_check(real_target, tmp_path / "work", name)
