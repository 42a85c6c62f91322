"""The evaluator, pattern and command-argument modules are pure: they import no I/O modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import loopd.harness.gate._commands as commands_module
import loopd.harness.gate._evaluate as evaluate_module
import loopd.harness.gate._patterns as patterns_module

IO_MODULES = {"os", "io", "asyncio", "time", "pathlib", "socket", "subprocess", "sqlite3", "httpx", "random", "shutil"}
ALLOWED = {"__future__", "collections", "enum", "functools", "types", "typing", "pydantic", "shlex", "loopd"}


@pytest.mark.parametrize("module", [evaluate_module, patterns_module, commands_module])
def test_imports_no_io(module: object) -> None:
    source = Path(module.__file__).read_text()  # type: ignore[attr-defined]
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    roots = {name.split(".")[0] for name in imported}
    assert not roots & IO_MODULES
    assert roots <= ALLOWED, roots - ALLOWED
    loopd_imports = {name for name in imported if name.startswith("loopd")}
    assert loopd_imports <= {"loopd.harness.core", "loopd.harness.gate"}  # core: pure as a whole
