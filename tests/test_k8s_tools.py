"""scripts/k8s_tools.py without building anything: the generated Go modules, the cache layout, a cached binary found
(never rebuilt), and the typed error for an unknown tool or a missing Go toolchain."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.k8s.cluster import REPO, _load_tools

tools = _load_tools()
SCRIPT = REPO / "scripts" / "k8s_tools.py"


def test_the_kube_apiserver_module_pins_every_staging_module_to_the_release() -> None:
    tool = tools.TOOLS["kube-apiserver"]
    go_mod = tool.go_mod()
    assert f"require k8s.io/kubernetes {tools.KUBERNETES_VERSION}" in go_mod
    minor = tools.KUBERNETES_VERSION.split(".")[1]
    for module in ("api", "apimachinery", "apiserver", "client-go", "component-base", "kms", "apiextensions-apiserver"):
        assert f"\tk8s.io/{module} => k8s.io/{module} v0.{minor}." in go_mod
    assert tool.sources() == {
        "tools.go": '//go:build tools\n\npackage tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n)\n'
    }
    assert tool.build_target() == "k8s.io/kubernetes/cmd/kube-apiserver"


def test_etcd_is_built_from_a_main_of_our_own() -> None:
    tool = tools.TOOLS["etcd"]
    assert "replace" not in tool.go_mod()
    assert "etcdmain.Main(os.Args)" in tool.sources()["main.go"]
    assert tool.build_target() == "."


def test_helm_is_stamped_with_its_version_and_the_kubernetes_it_targets() -> None:
    flags = " ".join(tools.TOOLS["helm"].ldflags)
    assert f"internal/version.version={tools.HELM_VERSION}" in flags
    assert "chartutil.k8sVersionMinor=37" in flags and "lint/rules.k8sVersionMinor=37" in flags
    assert "component-base/version.gitVersion=v1.37.2" in " ".join(tools.TOOLS["kube-apiserver"].ldflags)


def _fake_binary(cache: Path, name: str, *, fingerprint: str | None) -> Path:
    tool = tools.TOOLS[name]
    binary = cache / "loopd" / "k8s-tools" / f"{name}-{tool.version}" / name
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    if fingerprint is not None:
        (binary.parent / "fingerprint").write_text(fingerprint + "\n")
    return binary


def test_a_cached_binary_of_this_recipe_is_found_and_never_rebuilt(tmp_path: Path) -> None:
    binary = _fake_binary(tmp_path, "helm", fingerprint=tools.TOOLS["helm"].fingerprint())
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "GO": str(tmp_path / "no-go")}
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "path", "helm"], env=env, capture_output=True, text=True, timeout=30, check=True
    )
    assert out.stdout.strip() == str(binary)


@pytest.mark.parametrize("fingerprint", [None, "another-recipe"])
def test_a_binary_of_another_recipe_is_rebuilt(tmp_path: Path, fingerprint: str | None) -> None:
    _fake_binary(tmp_path, "etcd", fingerprint=fingerprint)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "GO": "", "PATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "path", "etcd"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert out.returncode == 1  # it tried to rebuild: no Go here
    assert "rebuilding" in out.stderr and "no Go toolchain" in out.stderr


def test_a_missing_toolchain_is_a_clear_error(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "GO": "", "PATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "path", "etcd"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert out.returncode == 1
    assert "no Go toolchain" in out.stderr
    with pytest.raises(tools.ToolError, match="unknown tool"):
        tools.ensure_tool("kubelet")
