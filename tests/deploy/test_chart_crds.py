"""The chart's crds/ are exactly what loopd generates from its models (they never drift)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import yaml

from loopd.operators.longhorizon import crds as longhorizon_crds
from loopd.resources import builtin_crds
from tests.deploy.chart import CHART, ROOT


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_crds", ROOT / "scripts" / "chart_crds.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_crds_equal_the_generated_ones() -> None:
    stale = _generator().differences()
    assert not stale, f"run `.venv/bin/python scripts/chart_crds.py`: stale {stale}"


def test_the_crds_are_tasks_and_longhorizons_three() -> None:
    on_disk = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        (crd,) = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        on_disk[crd["metadata"]["name"]] = crd
    assert on_disk == {crd["metadata"]["name"]: crd for crd in [*builtin_crds(), *longhorizon_crds()]}
    assert set(on_disk) == {
        "tasks.loopd.dev",
        "runs.longhorizon.loopd.dev",
        "executions.longhorizon.loopd.dev",
        "audits.longhorizon.loopd.dev",
    }


def test_the_check_notices_a_hand_edited_file(tmp_path: Path) -> None:
    generator = _generator()
    generator.write(tmp_path)
    assert generator.differences(tmp_path) == []
    edited = tmp_path / "tasks.loopd.dev.yaml"
    edited.write_text(edited.read_text().replace("Namespaced", "Cluster"))
    (tmp_path / "extra.yaml").write_text("---\n")
    assert generator.differences(tmp_path) == ["extra.yaml", "tasks.loopd.dev.yaml"]
