"""The chart under test and the real ``helm`` binary: render value sets into objects, lint, read failures.

``helm`` is the one scripts/k8s_tools.py builds and caches (``python scripts/k8s_tools.py ensure helm``): a test
never builds it (a build takes minutes), it skips when the binary is missing, and fails under ``CI=true``.
Must not do: talk to a Kubernetes API (tests/k8s does that).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import yaml

from tests.support.availability import missing

ROOT: Final = Path(__file__).resolve().parents[2]
CHART: Final = ROOT / "deploy" / "helm" / "loopd"
VALUE_SETS: Final = CHART / "ci"
RELEASE: Final = "loopd"
NAMESPACE: Final = "loopd"
HELM_TIMEOUT: Final = 60.0


@cache
def _k8s_tools() -> ModuleType | None:
    path = ROOT / "scripts" / "k8s_tools.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("loopd_k8s_tools", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module


def cached_helm() -> Path | None:
    """The helm binary scripts/k8s_tools.py cached (or $LOOPD_HELM, or helm on PATH); None when there is none."""
    explicit = os.environ.get("LOOPD_HELM")
    if explicit:
        return Path(explicit)
    tools = _k8s_tools()
    if tools is not None:
        binary = Path(tools.binary_path(tools.TOOLS["helm"]))
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    on_path = shutil.which("helm")
    return Path(on_path) if on_path else None


def helm() -> Path:
    """The helm binary, or skip (fail under CI=true) naming the command that builds it."""
    binary = cached_helm()
    if binary is None:
        missing("no helm binary: run `.venv/bin/python scripts/k8s_tools.py ensure helm` (builds it once, cached)")
        raise AssertionError("unreachable")  # missing() skips or fails
    return binary


@dataclass(frozen=True)
class Run:
    """One helm invocation's outcome."""

    code: int
    stdout: str
    stderr: str


def run_helm(args: Sequence[str]) -> Run:
    """Run ``helm args`` (bounded; no cluster: HOME and the helm caches in a throwaway place)."""
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/loopd-helm-cache", "HELM_CONFIG_HOME": "/tmp/loopd-helm-config"}
    env["HELM_DATA_HOME"] = "/tmp/loopd-helm-data"
    env.pop("KUBECONFIG", None)
    result = subprocess.run(
        [str(helm()), *args], capture_output=True, text=True, timeout=HELM_TIMEOUT, env=env, check=False
    )
    return Run(result.returncode, result.stdout, result.stderr)


def _value_args(values: Iterable[Path | Mapping[str, Any]], tmp: Path | None) -> list[str]:
    args: list[str] = []
    for index, item in enumerate(values):
        if isinstance(item, Path):
            args += ["-f", str(item)]
            continue
        if tmp is None:
            raise ValueError("inline values need a tmp directory")
        path = tmp / f"values-{index}.yaml"
        path.write_text(yaml.safe_dump(dict(item)))
        args += ["-f", str(path)]
    return args


def template(
    *values: Path | Mapping[str, Any], tmp: Path | None = None, extra: Sequence[str] = (), namespace: str = NAMESPACE
) -> Run:
    """``helm template`` of the chart with these value files / inline values (later ones win)."""
    args = ["template", RELEASE, str(CHART), "--namespace", namespace, *_value_args(values, tmp), *extra]
    return run_helm(args)


def render(*values: Path | Mapping[str, Any], tmp: Path | None = None, namespace: str = NAMESPACE) -> Objects:
    """The objects ``helm template`` renders (an AssertionError with helm's stderr when it refuses). Renderings of
    value files only are made once per process (tests must not change the objects)."""
    if all(isinstance(item, Path) for item in values):
        return Objects(_render_files(tuple(Path(str(item)) for item in values), namespace))
    return Objects(_parse(template(*values, tmp=tmp, namespace=namespace)))


@cache
def _render_files(files: tuple[Path, ...], namespace: str) -> list[dict[str, Any]]:
    return _parse(template(*files, namespace=namespace))


def _parse(run: Run) -> list[dict[str, Any]]:
    assert run.code == 0, f"helm template failed:\n{run.stderr}"
    return [doc for doc in yaml.safe_load_all(run.stdout) if doc]


class Objects:
    """Rendered objects, found by kind and name."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def of(self, kind: str) -> list[dict[str, Any]]:
        """Every object of ``kind``."""
        return [item for item in self.items if item.get("kind") == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        """The one object of ``kind`` named ``name`` (AssertionError listing what there is otherwise)."""
        for item in self.of(kind):
            if item["metadata"]["name"] == name:
                return item
        names = [item["metadata"]["name"] for item in self.of(kind)]
        raise AssertionError(f"no {kind} {name!r}; there are {names}")

    def names(self, kind: str) -> set[str]:
        """The names of every object of ``kind``."""
        return {item["metadata"]["name"] for item in self.of(kind)}

    def kinds(self) -> set[str]:
        """Every kind rendered."""
        return {str(item.get("kind")) for item in self.items}


def value_sets() -> list[Path]:
    """The chart's value sets (``ci/*-values.yaml``): the renderings every test and the dry run cover."""
    return sorted(VALUE_SETS.glob("*-values.yaml"))
