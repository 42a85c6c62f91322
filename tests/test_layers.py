"""The package's faces and boundaries, checked from the source.

import-linter (`make lint`, contracts in pyproject.toml) checks the layers and that no module imports another
package's private module; these tests say the same about what a reader sees: the small public face of
``loopd.server``, and the private-module rule over every ``import`` statement in ``src/loopd`` (relative ones
included), so a violation fails the suite too, with the file and line.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

SERVER_FACE = {
    "DEFAULT_PORT",
    "ExposureRefused",
    "KubeApiMode",
    "RunningServer",
    "ServerSetupError",
    "UpSettings",
    "WorkspaceLocationError",
    "check_exposure",
    "default_workspaces",
    "open_loop_server",
    "resolve_kube_api",
    "resolve_namespace",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(path: Path) -> str:
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _is_private(component: str) -> bool:
    return component.startswith("_") and not (component.startswith("__") and component.endswith("__"))


def _private_owner(module: str) -> str | None:
    """The package a module is private to: the parent of its innermost private component (None: public)."""
    parts = module.split(".")
    for index in range(len(parts) - 1, 0, -1):
        if _is_private(parts[index]):
            return ".".join(parts[:index])
    return None


def _imported_modules(tree: ast.Module, package: str) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # `from pkg import _mod` imports a module too when `_mod` is a private submodule of `pkg`
            found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names if _is_private(alias.name))
    return [(line, module) for line, module in found if module == "loopd" or module.startswith("loopd.")]


def test_no_module_imports_another_packages_private_module() -> None:
    violations = []
    for path in sorted((SRC / "loopd").rglob("*.py")):
        package = _package_of(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, module in _imported_modules(tree, package):
            owner = _private_owner(module)
            if owner is None or package == owner or package.startswith(owner + "."):
                continue
            target = SRC / Path(*module.split("."))
            if not target.with_suffix(".py").exists() and not target.is_dir():
                continue  # a private *name* imported from a public module, not a private module
            violations.append(f"{path.relative_to(SRC)}:{line} imports {module} (private to {owner})")
    assert violations == []


def test_loopd_server_has_a_small_public_face() -> None:
    server = importlib.import_module("loopd.server")
    assert set(server.__all__) == SERVER_FACE
    for name in SERVER_FACE:
        assert getattr(server, name) is not None


@pytest.mark.parametrize(
    ("package", "absent"),
    [
        ("loopd.server.http", ("create_server_app", "ServerContext")),  # the app sits above the services
        ("loopd.server", ("create_server_app", "HarnessEngine", "ChatRequests", "ConversationReader")),
    ],
)
def test_a_face_does_not_export_what_lives_above_it(package: str, absent: tuple[str, ...]) -> None:
    exported = set(importlib.import_module(package).__all__)
    assert exported.isdisjoint(absent)
