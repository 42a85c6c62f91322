"""What each built-in tool declares: spec, effect, idempotency, requirements and grant candidates."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from loopd.harness.core._values import EffectKind, Idempotency
from loopd.harness.tools._protocol import PreparedCall, Tool
from loopd.harness.tools._requirements import exec_requirements, split_command

Prepare = Callable[..., PreparedCall]

DECLARED = {
    "read_file": (EffectKind.READ, Idempotency.INHERENT),
    "write_file": (EffectKind.WRITE, Idempotency.INHERENT),
    "edit_file": (EffectKind.WRITE, Idempotency.NONE),
    "list_dir": (EffectKind.READ, Idempotency.INHERENT),
    "glob": (EffectKind.READ, Idempotency.INHERENT),
    "grep": (EffectKind.READ, Idempotency.INHERENT),
    "bash": (EffectKind.UNKNOWN, Idempotency.NONE),
}


def test_every_tool_declares_effect_and_idempotency(tools: dict[str, Tool]) -> None:
    assert {name: (t.effect, t.idempotency) for name, t in tools.items()} == DECLARED
    for tool in tools.values():
        assert isinstance(tool, Tool)


def test_specs_are_plain_json_schemas(tools: dict[str, Tool]) -> None:
    for tool in tools.values():
        schema = tool.spec.parameters
        assert schema["type"] == "object"
        assert schema["additionalProperties"] is False
        assert "title" not in schema
        for prop in schema["properties"].values():
            assert "title" not in prop
            assert prop.get("description")


def _shape(prepared: PreparedCall) -> list[tuple[str, str, list[str]]]:
    return [(r.kind, r.match, [c.pattern for c in r.candidates]) for r in prepared.requirements]


def test_file_requirements(prepare: Prepare, root: object) -> None:
    assert _shape(prepare("read_file", path="src/pkg/util.py")) == [
        ("fs.read", "src/pkg/util.py", ["src/pkg/util.py", "src/pkg/*"])
    ]
    assert _shape(prepare("read_file", path="README.md")) == [("fs.read", "README.md", ["README.md"])]
    assert _shape(prepare("write_file", path="src/new.py", content="")) == [("fs.write", "src/new.py", ["src/new.py"])]
    assert _shape(prepare("edit_file", path="src/main.py", old_string="a", new_string="b")) == [
        ("fs.write", "src/main.py", ["src/main.py"])
    ]
    assert _shape(prepare("list_dir", path="src")) == [("fs.read", "src/", ["src/", "src/*"])]
    assert _shape(prepare("list_dir")) == [("fs.read", "./", ["./"])]


def test_search_requirements_cover_the_searched_tree(prepare: Prepare) -> None:
    assert _shape(prepare("glob", pattern="src/**/*.py")) == [("fs.read", "src/*", ["src/*"])]
    assert _shape(prepare("glob", pattern="**/*.py")) == [("fs.read", "*", ["*"])]
    assert _shape(prepare("grep", pattern="x", path="src/pkg")) == [("fs.read", "src/pkg/*", ["src/pkg/*"])]
    assert _shape(prepare("grep", pattern="x", path="README.md")) == [("fs.read", "README.md", ["README.md"])]


def test_requirement_scope_is_the_workspace_root(prepare: Prepare, workspace: object) -> None:
    prepared = prepare("read_file", path="README.md")
    assert prepared.requirements[0].scope == str(workspace.root)  # type: ignore[attr-defined]


def test_literal_wildcards_in_paths_are_escaped(prepare: Prepare, root: object) -> None:
    assert _shape(prepare("write_file", path="a*b.txt", content="")) == [("fs.write", r"a\*b.txt", [r"a\*b.txt"])]


@pytest.mark.parametrize(
    ("command", "parts"),
    [
        ("git status", ["git status"]),
        ("git status && rm -rf build", ["git status", "rm -rf build"]),
        ("a; b || c | d & e\nf", ["a", "b", "c", "d", "e", "f"]),
        ("echo 'a; b' \"c && d\"", ["echo 'a; b' \"c && d\""]),
        ("make 2>&1 | tee log", ["make 2>&1", "tee log"]),
        ("cmd &> out.txt", ["cmd &> out.txt"]),
        ("echo a\\;b", ["echo a\\;b"]),
        ("echo 'unbalanced; rm -rf /", ["echo 'unbalanced; rm -rf /"]),
        ("  ;; ", []),
    ],
)
def test_split_command(command: str, parts: list[str]) -> None:
    assert list(split_command(command)) == parts


def test_exec_candidates_offer_prefixes_only_for_read_only_programs() -> None:
    shapes = [
        (r.match, [c.pattern for c in r.candidates]) for r in exec_requirements("/ws", "git status -s && rm -rf x")
    ]
    assert shapes == [("git status -s", ["git status -s", "git status *"]), ("rm -rf x", ["rm -rf x"])]
    (only,) = exec_requirements("/ws", "git log $(rm -rf x)")
    assert [c.pattern for c in only.candidates] == ["git log $(rm -rf x)"]
    (star,) = exec_requirements("/ws", "ls *.py")
    assert star.match == r"ls \*.py"
