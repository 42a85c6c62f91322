"""The LongHorizon resources: the models' bounds, the CRDs generated from them, and the real ``kubectl`` against the
embedded API (apply, printer columns of ``kubectl get runs,executions,audits``, the immutable spec, status writes,
garbage collection of Executions and Audits with their Run)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from loopd.operators.longhorizon import (
    Audit,
    Decision,
    Execution,
    ExecutionSpec,
    ObjectRef,
    RoundRecord,
    Run,
    RunSpec,
    RunStatus,
    crds,
)
from loopd.resources import load_or_create_credentials
from tests.resources.conftest import RunningApi, open_running_api, require_kubectl
from tests.support.kubectl import Kubectl
from tests.support.waiting import eventually


def _spec(**changes: Any) -> dict[str, Any]:
    return {"conversation": {"name": "c"}, "inputMessageID": "m1", "goal": "g", **changes}


def test_the_models_carry_the_reference_bounds() -> None:
    spec = RunSpec.model_validate(_spec())
    assert spec.max_rounds == 25 and spec.input_message_id == "m1"
    for bad in (
        _spec(goal="x" * 16_001),
        _spec(goal=""),
        _spec(maxRounds=0),
        _spec(maxRounds=1_001),
        _spec(contextMessages=[{"conversationID": "c", "messageID": str(i)} for i in range(21)]),
    ):
        with pytest.raises(pydantic.ValidationError):
            RunSpec.model_validate(bad)
    RunSpec.model_validate(_spec(maxRounds=1_000, goal="x" * 16_000))
    with pytest.raises(pydantic.ValidationError):
        RunStatus.model_validate({"inputMessageIDs": [str(i) for i in range(101)]})
    with pytest.raises(pydantic.ValidationError):
        RunStatus.model_validate({"rounds": [{"index": i + 1} for i in range(51)]})
    with pytest.raises(pydantic.ValidationError):
        RunStatus.model_validate({"phase": "Sleeping"})
    with pytest.raises(pydantic.ValidationError):
        ExecutionSpec.model_validate(
            {"run": "r", "round": 1, "contractVersion": 1, "plan": "p", "reportMessageIDs": ["m"] * 51}
        )
    with pytest.raises(pydantic.ValidationError):
        Decision.model_validate({"next": "cli", "choices": [{"value": str(i)} for i in range(21)]})
    # Wire names: camelCase with the reference's spellings; the model JSON keeps allow_other / task_state.
    status = RunStatus(
        inputMessageIDs=["a"], managerMessageID="m", decision=Decision(next="ask", allow_other=True), round=2
    )
    assert status.model_dump(by_alias=True, exclude_none=True) == {
        "inputMessageIDs": ["a"],
        "managerMessageID": "m",
        "decision": {
            "next": "ask",
            "summary": "",
            "plan": "",
            "contract": "",
            "question": "",
            "allow_other": True,
        },
        "round": 2,
    }
    assert RoundRecord(index=1, execution=ObjectRef(name="r-r1", uid="u")).execution is not None


def _nodes(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for name, sub in (schema.get("properties") or {}).items():
        found.extend(_nodes(sub, f"{path}.{name}"))
    if "items" in schema:
        found.extend(_nodes(schema["items"], f"{path}[]"))
    return found


def test_the_crds_are_structural_with_an_immutable_spec_and_printer_columns() -> None:
    by_kind = {crd["spec"]["names"]["kind"]: crd for crd in crds()}
    assert set(by_kind) == {"Run", "Execution", "Audit"}
    columns = {"Run": ["Phase", "Round", "Budget", "Contract", "Age"], "Execution": ["Run", "Round", "Phase", "Age"]}
    columns["Audit"] = ["Run", "Round", "Phase", "Complete", "Integrity", "Age"]
    for kind, crd in by_kind.items():
        assert crd["spec"]["group"] == "longhorizon.loopd.dev" and crd["spec"]["scope"] == "Namespaced"
        (version,) = crd["spec"]["versions"]
        assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
        assert [c["name"] for c in version["additionalPrinterColumns"]] == columns[kind]
        schema = version["schema"]["openAPIV3Schema"]
        assert schema["properties"]["spec"]["x-kubernetes-validations"] == [
            {"rule": "self == oldSelf", "message": "spec is immutable"}
        ]
        for path, node in _nodes(schema):
            assert node.get("type") in ("object", "array", "string", "integer", "boolean", "number"), path
            assert not any(key in node for key in ("anyOf", "oneOf", "allOf", "$ref")), path
            if node.get("type") == "string" and path not in (".apiVersion", ".kind"):
                assert "maxLength" in node or "enum" in node or node.get("format") == "date-time", path
            if node.get("type") == "array":
                assert "maxItems" in node, path
    run_spec = by_kind["Run"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert run_spec["properties"]["maxRounds"] == {
        "type": "integer",
        "description": "Initial budget.",
        "minimum": 1,
        "maximum": 1000,
        "default": 25,
    }
    assert run_spec["properties"]["goal"]["maxLength"] == 16_000
    assert set(run_spec["required"]) == {"conversation", "inputMessageID", "goal"}


# -- the real kubectl against the embedded API --------------------------------------------------------------------


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[RunningApi]:
    credentials = load_or_create_credentials(tmp_path / "api-data")
    async with open_running_api(tmp_path, credentials) as running:
        yield running


@pytest.fixture
def kubectl(api: RunningApi, tmp_path: Path) -> Kubectl:
    return Kubectl(require_kubectl(), api.kubeconfig, tmp_path / "kube-home")


def _owned(name: str, owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "ownerReferences": [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
            }
        ],
    }


@pytest.mark.kubectl
async def test_kubectl_applies_shows_guards_and_collects_the_longhorizon_resources(
    kubectl: Kubectl, tmp_path: Path
) -> None:
    manifests = tmp_path / "crds.yaml"
    manifests.write_text(yaml.safe_dump_all(crds()))
    applied = await kubectl.ok("apply", "-f", str(manifests))
    assert "customresourcedefinition.apiextensions.k8s.io/runs.longhorizon.loopd.dev created" in applied
    await kubectl.ok("wait", "--for=condition=Established", "crd/runs.longhorizon.loopd.dev", "--timeout=20s")

    run_manifest = {"apiVersion": "longhorizon.loopd.dev/v1alpha1", "kind": "Run", "metadata": {"name": "r1"}}
    run_manifest["spec"] = _spec(goal="Create hello.txt containing hello world")
    await kubectl.ok("create", "-f", "-", stdin=json.dumps(run_manifest))
    run = json.loads(await kubectl.ok("get", "run", "r1", "-o", "json"))
    assert run["spec"]["maxRounds"] == 25
    status = {"status": {"phase": "Auditing", "round": 1, "budget": 25, "contractVersion": 1}}
    await kubectl.ok("patch", "run", "r1", "--subresource=status", "--type=merge", "-p", json.dumps(status))

    execution = {"apiVersion": "longhorizon.loopd.dev/v1alpha1", "kind": "Execution", "metadata": _owned("r1-r1", run)}
    execution["spec"] = {"run": "r1", "round": 1, "contractVersion": 1, "plan": "write hello.txt"}
    await kubectl.ok("create", "-f", "-", stdin=json.dumps(execution))
    executed = json.loads(await kubectl.ok("get", "execution", "r1-r1", "-o", "json"))
    audit = {"apiVersion": "longhorizon.loopd.dev/v1alpha1", "kind": "Audit", "metadata": _owned("r1-r1", run)}
    audit["spec"] = {
        "run": "r1",
        "round": 1,
        "contractVersion": 1,
        "execution": {"name": "r1-r1", "uid": executed["metadata"]["uid"]},
    }
    await kubectl.ok("create", "-f", "-", stdin=json.dumps(audit))
    await kubectl.ok(
        "patch", "execution", "r1-r1", "--subresource=status", "--type=merge", "-p", '{"status":{"phase":"Completed"}}'
    )
    verdict = {"phase": "Completed", "verdict": {"complete": True, "integrity": "clean", "evidence": "hello.txt"}}
    await kubectl.ok(
        "patch", "audit", "r1-r1", "--subresource=status", "--type=merge", "-p", json.dumps({"status": verdict})
    )

    table = await kubectl.ok("get", "runs,executions,audits")
    blocks = [block.splitlines() for block in table.strip().split("\n\n")]
    assert [lines[0].split() for lines in blocks] == [
        ["NAME", "PHASE", "ROUND", "BUDGET", "CONTRACT", "AGE"],
        ["NAME", "RUN", "ROUND", "PHASE", "AGE"],
        ["NAME", "RUN", "ROUND", "PHASE", "COMPLETE", "INTEGRITY", "AGE"],
    ]
    assert blocks[0][1].split()[:5] == ["run.longhorizon.loopd.dev/r1", "Auditing", "1", "25", "1"]
    assert blocks[1][1].split()[:4] == ["execution.longhorizon.loopd.dev/r1-r1", "r1", "1", "Completed"]
    assert blocks[2][1].split()[:6] == ["audit.longhorizon.loopd.dev/r1-r1", "r1", "1", "Completed", "true", "clean"]
    assert "lhrun" in await kubectl.ok("api-resources", "--api-group=longhorizon.loopd.dev")
    explained = await kubectl.ok("explain", "run.spec")
    assert "goal" in explained and "What the user asked for." in explained
    assert set((await kubectl.ok("get", "longhorizon", "-o", "name")).split()) == {  # the category
        "run.longhorizon.loopd.dev/r1",
        "execution.longhorizon.loopd.dev/r1-r1",
        "audit.longhorizon.loopd.dev/r1-r1",
    }

    # The spec is immutable: kubectl prints the apiserver's 422 as a real cluster's.
    refused = await kubectl.run("patch", "run", "r1", "--type=merge", "-p", '{"spec":{"goal":"something else"}}')
    assert refused.returncode != 0
    assert 'The Run "r1" is invalid: spec: Invalid value: spec is immutable' in refused.stderr
    edited = {**run_manifest, "spec": _spec(goal="Create hello.txt containing hello world", maxRounds=50)}
    replaced = await kubectl.run("apply", "-f", "-", stdin=json.dumps(edited))
    assert replaced.returncode != 0 and "spec is immutable" in replaced.stderr
    bad = await kubectl.run(
        "patch", "run", "r1", "--subresource=status", "--type=merge", "-p", '{"status":{"phase":"Sleeping"}}'
    )
    assert bad.returncode != 0 and "Unsupported value" in bad.stderr

    # Deleting the Run collects what it owns.
    await kubectl.ok("delete", "run", "r1")

    async def children_gone() -> bool:
        left = await kubectl.ok("get", "executions,audits", "-o", "name")
        return left.strip() == ""

    await eventually(children_gone, what="the Run's Execution and Audit to be collected")


def test_the_models_parse_what_the_api_serves() -> None:
    run = Run.model_validate({"metadata": {"name": "r"}, "spec": _spec(), "status": {"phase": "Receiving"}})
    assert run.to_object()["spec"]["inputMessageID"] == "m1" and run.status is not None
    execution = Execution.model_validate(
        {"metadata": {"name": "r-r1"}, "spec": {"run": "r", "round": 1, "contractVersion": 1, "plan": "p"}}
    )
    assert execution.spec.contract_version == 1
    audit = Audit.model_validate(
        {
            "metadata": {"name": "r-r1"},
            "spec": {"run": "r", "round": 1, "contractVersion": 1, "execution": {"name": "r-r1", "uid": "u"}},
            "status": {"verdict": {"complete": False, "integrity": "unknown", "task_state": "half"}},
        }
    )
    assert audit.status is not None and audit.status.verdict is not None
    assert audit.status.verdict.task_state == "half"
