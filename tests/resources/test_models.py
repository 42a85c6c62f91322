"""Typed kinds, generated CRDs (valid apiextensions.k8s.io/v1, structural), `loopd manifests crds`, public face."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import pytest
import typer
import yaml
from pydantic import Field
from typer.testing import CliRunner

import loopd.resources as resources
from loopd.cli._resources_commands import manifests_app
from loopd.resources import (
    KindDeclaration,
    KubeObject,
    PrinterColumn,
    Task,
    TaskSpec,
    TaskTarget,
    WireModel,
    builtin_crds,
    crd_from_model,
)

_ALLOWED_NODE_KEYS = {
    "type",
    "properties",
    "required",
    "items",
    "additionalProperties",
    "description",
    "enum",
    "format",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "multipleOf",
    "nullable",
    "default",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-type",
    "x-kubernetes-map-type",
}


def assert_structural(node: Any, path: str) -> None:
    """The structural-schema rules of apiextensions.k8s.io/v1, checked independently of the server."""
    assert isinstance(node, dict), path
    assert set(node) <= _ALLOWED_NODE_KEYS, f"{path}: unexpected keywords {set(node) - _ALLOWED_NODE_KEYS}"
    assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"} or node.get(
        "x-kubernetes-preserve-unknown-fields"
    ), f"{path}: every node needs a type"
    assert not ("properties" in node and "additionalProperties" in node), f"{path}: properties xor additionalProperties"
    for name in node.get("required", []):
        assert name in node.get("properties", {}), f"{path}: required {name!r} is not a property"
    if "enum" in node:
        kind = {"string": str, "integer": int, "number": (int, float), "boolean": bool}[node["type"]]
        assert all(isinstance(value, kind) for value in node["enum"]), path
    for name, sub in node.get("properties", {}).items():
        assert_structural(sub, f"{path}.properties.{name}")
    if node.get("type") == "array":
        assert_structural(node["items"], f"{path}.items")


def assert_valid_crd(crd: dict[str, Any]) -> None:
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1" and crd["kind"] == "CustomResourceDefinition"
    spec = crd["spec"]
    names = spec["names"]
    assert crd["metadata"] == {"name": f"{names['plural']}.{spec['group']}"}
    assert "." in spec["group"] and names["plural"].islower() and names["singular"].islower()
    assert names["kind"][0].isupper() and names["listKind"] == f"{names['kind']}List"
    assert spec["scope"] in ("Namespaced", "Cluster")
    assert sum(1 for v in spec["versions"] if v["storage"]) == 1
    for version in spec["versions"]:
        assert version["served"] is True
        schema = version["schema"]["openAPIV3Schema"]
        assert schema["type"] == "object"
        assert schema["properties"]["metadata"] == {"type": "object"}  # only name/generateName may be constrained
        assert_structural(schema, "openAPIV3Schema")
        assert set(version.get("subresources", {})) <= {"status", "scale"}
        for column in version.get("additionalPrinterColumns", []):
            assert column["type"] in ("integer", "number", "string", "boolean", "date")
            assert column["jsonPath"].startswith(".")


def test_generated_crds_are_valid_apiextensions_v1() -> None:
    crds = builtin_crds()
    assert [crd["metadata"]["name"] for crd in crds] == ["tasks.loopd.dev"]
    for crd in crds:
        assert_valid_crd(crd)
    task = crds[0]["spec"]
    assert task["versions"][0]["subresources"] == {"status": {}}
    schema = task["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert schema["required"] == ["target"]
    assert schema["properties"]["target"]["required"] == ["kind", "key"]
    assert schema["properties"]["target"]["properties"]["kind"]["enum"] == ["operator", "harness"]
    assert schema["properties"]["revision"]["minimum"] == 1
    columns = [c["name"] for c in task["versions"][0]["additionalPrinterColumns"]]
    assert columns == ["Target-Kind", "Target", "Revision", "Phase", "Responder", "Age"]


def test_manifests_crds_prints_the_crds() -> None:
    app = typer.Typer()
    app.add_typer(manifests_app, name="manifests")
    result = CliRunner().invoke(app, ["manifests", "crds"])
    assert result.exit_code == 0, result.output
    documents = list(yaml.safe_load_all(result.output))
    assert documents == builtin_crds()


class Gadget(KubeObject):
    """An operator's own kind, declared the same way loopd declares Task."""

    class GadgetSpec(WireModel):
        mode: Literal["fast", "slow"] = "fast"
        replicas: int = Field(default=1, gt=0, le=10)
        tags: list[str] | None = None
        settings: dict[str, int] | None = None

    declaration: ClassVar[KindDeclaration] = KindDeclaration(
        group="example.com",
        version="v1beta1",
        kind="Gadget",
        plural="gadgets",
        namespaced=False,
        printer_columns=(PrinterColumn("Mode", "string", ".spec.mode"),),
    )

    spec: GadgetSpec


def test_operators_can_declare_their_own_kinds() -> None:
    crd = crd_from_model(Gadget)
    assert_valid_crd(crd)
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["replicas"] == {
        "type": "integer",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 10,
        "default": 1,
    }
    assert spec["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
    assert spec["properties"]["settings"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert crd["spec"]["scope"] == "Cluster" and "subresources" not in crd["spec"]["versions"][0]


def test_task_model_round_trips_the_wire_form() -> None:
    task = Task(
        metadata={"name": "t1", "labels": {"a": "b"}}, spec=TaskSpec(target=TaskTarget(kind="harness", key="h"))
    )
    wire = task.to_object()
    assert wire == {
        "apiVersion": "loopd.dev/v1alpha1",
        "kind": "Task",
        "metadata": {"name": "t1", "labels": {"a": "b"}},
        "spec": {"target": {"kind": "harness", "key": "h"}, "revision": 1},
    }
    assert Task.from_object(wire) == task
    stored = {**wire, "metadata": {**wire["metadata"], "resourceVersion": "7", "ownerReferences": []}}
    assert Task.from_object(stored).metadata.resource_version == "7"


def test_public_face() -> None:
    assert set(resources.__all__) >= {
        "ResourceStore",
        "SqliteResourceStore",
        "PostgresResourceStore",
        "KindRef",
        "ObjectList",
        "WatchEvent",
        "ResourceError",
        "NotFound",
        "AlreadyExists",
        "Conflict",
        "Gone",
        "Invalid",
        "create_api_app",
        "open_api_server",
        "render_kubeconfig",
        "load_or_create_credentials",
    }
    for name in resources.__all__:
        assert getattr(resources, name) is not None
    assert all(not name.startswith("_") for name in resources.__all__)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"reason": "NotFound", "code": 404, "message": "x"}, resources.NotFound),
        ({"reason": "Expired", "code": 410}, resources.Gone),
        ({"code": 409}, resources.Conflict),
        ({"reason": "AlreadyExists", "code": 409}, resources.AlreadyExists),
        ({"code": 599}, resources.ResourceError),
    ],
)
def test_status_bodies_map_back_to_the_error_tree(status: dict[str, Any], expected: type[Exception]) -> None:
    assert type(resources.error_from_status(status)) is expected


def test_invalid_round_trips_through_status() -> None:
    error = resources.Invalid("bad", causes=(resources.Cause("FieldValueRequired", "Required value", "spec.x"),))
    again = resources.error_from_status(error.to_status())
    assert isinstance(again, resources.Invalid) and again.causes == error.causes
