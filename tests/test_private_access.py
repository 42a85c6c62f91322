"""No class reaches into another's private members, checked over every module of ``src/loopd`` with ``ast``.

An attribute ``<expr>._name`` (one leading underscore, not a dunder) is fine when ``<expr>`` is ``self``, ``cls``,
``super()`` or a module bound by ``import``, or when the access sits inside a class that itself defines ``_name``
(a method, a class attribute, a ``__slots__`` entry or a ``self._name = ...`` assignment): privacy in Python is per
class, so ``other._n`` in ``__eq__`` or ``store._start()`` on the instance a classmethod just made is the class
using its own member. Anything else fails with the file and line: give the owner a small public method instead.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

SRC = Path(__file__).resolve().parents[1] / "src"

ALLOWED_NAMES: Final[dict[str, str]] = {
    "_replace": "namedtuple's public API (e.g. urllib's SplitResult); the underscore only avoids field clashes",
    "_asdict": "namedtuple's public API",
    "_fields": "namedtuple's public API",
    "_make": "namedtuple's public API",
}
"""Private-looking names that are public by their owner's documentation, with the reason."""


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_in(cls: ast.ClassDef) -> set[str]:
    """The names a class defines for itself (see the module docstring)."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in targets) and node.value is not None:
                names.update(
                    c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                )
    for inner in ast.walk(cls):
        if (
            isinstance(inner, ast.Attribute)
            and isinstance(inner.ctx, ast.Store)
            and isinstance(inner.value, ast.Name)
            and inner.value.id in ("self", "cls")
        ):
            names.add(inner.attr)
    return names


def _module_aliases(tree: ast.Module) -> set[str]:
    return {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }


def _is_own(value: ast.expr, modules: set[str]) -> bool:
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls") or value.id in modules
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


def reach_ins(source: str, filename: str = "<source>") -> list[str]:
    """Every ``<expr>._name`` in ``source`` that reaches into another class's private member, as ``line: expr``."""
    tree = ast.parse(source, filename=filename)
    modules = _module_aliases(tree)
    found: list[str] = []

    def visit(node: ast.AST, owned: frozenset[str]) -> None:
        if isinstance(node, ast.ClassDef):
            owned = owned | _defined_in(node)
        if (
            isinstance(node, ast.Attribute)
            and _is_private(node.attr)
            and node.attr not in ALLOWED_NAMES
            and node.attr not in owned
            and not _is_own(node.value, modules)
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, owned)

    visit(tree, frozenset())
    return found


def test_no_module_reaches_into_another_class_private_members() -> None:
    violations = [
        f"{path.relative_to(SRC)}:{hit}"
        for path in sorted((SRC / "loopd").rglob("*.py"))
        for hit in reach_ins(path.read_text(), str(path))
    ]
    assert violations == []


def test_the_check_finds_a_reach_in_and_lets_a_class_use_its_own_members() -> None:
    source = """
import sys

class Counter:
    __slots__ = ("_n",)

    def __eq__(self, other):
        return self._n == other._n          # its own member, on another instance: fine

    @classmethod
    def open(cls):
        made = cls()
        made._start()                        # fine: Counter defines _start
        return made

    def _start(self):
        sys._getframe()                      # a module's member: fine
        return super()._start()              # fine

class Reader:
    def read(self, counter):
        return counter._n + self._cache._size   # two reach-ins

def parts(url):
    return url._replace(path="/")             # namedtuple API: allowed by name
"""
    assert reach_ins(source) == ["22: counter._n", "22: self._cache._size"]
