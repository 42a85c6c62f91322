"""The package face: an explicit list of public names, and a pure leaf (no I/O modules, nothing else of loopd)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import loopd.agentue as agentue

PACKAGE = Path(agentue.__file__).parent
ALLOWED_THIRD_PARTY = {"pydantic"}
FORBIDDEN = {"asyncio", "os", "time", "random", "socket", "sqlite3", "subprocess", "httpx", "threading", "pathlib"}


def test_public_names_are_explicit_and_importable() -> None:
    assert agentue.__doc__ and "reduce" in agentue.__doc__
    assert len(set(agentue.__all__)) == len(agentue.__all__)
    for name in agentue.__all__:
        assert hasattr(agentue, name), name
    assert not any(name.startswith("_") for name in agentue.__all__)
    for required in (
        "Model",
        "InlineBlock",
        "RefBlock",
        "StartEvent",
        "SetEvent",
        "AppendEvent",
        "ErrorEvent",
        "PingEvent",
        "EndEvent",
        "StreamState",
        "Streams",
        "reduce",
        "fold",
        "encode_sse_event",
        "decode_sse_event",
        "AgentUEValidationError",
        "AgentUERejectedError",
    ):
        assert required in agentue.__all__, required
    assert issubclass(agentue.AgentUEValidationError, ValueError)
    assert issubclass(agentue.AgentUERejectedError, ValueError)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_package_is_a_pure_leaf() -> None:
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) > 5
    for module in modules:
        for name in _imports(module):
            top = name.split(".")[0]
            if top == "loopd":
                # a leaf above the floor: its own modules, and the infrastructure floor's
                assert name.startswith(("loopd.agentue", "loopd._infra")), f"{module.name} imports {name}"
                continue
            assert top not in FORBIDDEN, f"{module.name} imports {name}"
            assert top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY or top == "__future__", (
                f"{module.name} imports {name}"
            )
