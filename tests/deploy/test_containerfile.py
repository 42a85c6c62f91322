"""The Containerfile's shape (the machine cannot pull base images, so the build itself is not run here; the same
steps run outside a container in tests/k8s/test_wheel.py): multi-stage, the web UI inside the wheel, a final stage
with only the wheels installed, no build tools, and the non-root uid the chart runs its pods as."""

from __future__ import annotations

import re

import yaml

from tests.deploy.chart import CHART, ROOT

CONTAINERFILE = ROOT / "Containerfile"


def _stages() -> list[list[str]]:
    """The instructions of each stage (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n\s*", " ", CONTAINERFILE.read_text())
    stages: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_three_stages_web_wheels_and_the_image() -> None:
    web, wheels, final = _stages()
    assert web[0].startswith("FROM ${NODE_IMAGE} AS web") and any("npm run build" in line for line in web)
    assert wheels[0].startswith("FROM ${PYTHON_IMAGE} AS wheels")
    assert any("COPY --from=web" in line and "webui/dist" in line for line in wheels)
    assert any("pip wheel" in line for line in wheels)
    assert final[0] == "FROM ${PYTHON_IMAGE}"


def test_the_final_stage_installs_only_the_wheels_and_no_build_tools() -> None:
    final = _stages()[-1]
    runs = " ".join(line for line in final if line.startswith("RUN "))
    assert "--no-index --find-links /wheels" in runs and "--no-cache-dir" in runs
    assert "type=bind,from=wheels" in runs  # the wheels are mounted, never copied into a layer
    for tool in ("apt-get", "gcc", "build-essential", "npm", "COPY src"):
        assert tool not in " ".join(final), tool


def test_the_image_runs_as_the_non_root_uid_the_chart_expects() -> None:
    text = CONTAINERFILE.read_text()
    uid = int(re.search(r"^ARG UID=(\d+)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert uid != 0
    assert re.search(r"^USER \$\{UID\}:\$\{UID\}$", text, re.M)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == uid
    assert values["podSecurityContext"]["runAsGroup"] == uid
    assert 'ENTRYPOINT ["loopd"]' in text
