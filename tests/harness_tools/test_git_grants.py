"""The "Approve always on git" escapes, through the real tools: BashTool.prepare → the gate, stored rules from an
older version, a running session, and the file tools refusing to write git's configuration."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from loopd.harness import LoopDefinition, MemoryJournal, Reply, Rig, ScriptedModel
from loopd.harness.core.events import GateOpened, TurnDone
from loopd.harness.gate import AccessConfig, FileRuleStore, Verdict, evaluate
from loopd.harness.tools._builtins import default_tools
from loopd.harness.tools._protocol import PreparedCall
from loopd.harness.tools._workspace import Workspace, WorkspaceEscapeError
from tests.support.availability import missing

from .conftest import Prepare

LEGACY_PREFIX_RULES = ["ls *", "pwd *", "git status *", "git log *", "git diff *", "git show *"]


def _needs_git() -> str:
    git = shutil.which("git")
    if git is None:
        missing("git is not installed")
    assert git is not None
    return git


@pytest.fixture
def legacy_store(root: Path) -> FileRuleStore:
    """The rules file an older loopd wrote after "Approve always" on ls, pwd and four git commands."""
    path = root / ".loopd" / "gate-rules.json"
    path.parent.mkdir()
    rules = [{"kind": "exec", "pattern": p, "effect": "allow", "description": ""} for p in LEGACY_PREFIX_RULES]
    path.write_text(json.dumps({"version": 1, "rules": rules}))
    return FileRuleStore.for_workspace(root)


@pytest.fixture
def repo(root: Path) -> Path:
    git = _needs_git()
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(root), "GIT_CONFIG_NOSYSTEM": "1"}
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run([git, *args], cwd=root, env=env, check=True, timeout=30, capture_output=True)
    return root


async def _verdicts(store: FileRuleStore, prepared: list[PreparedCall]) -> list[Verdict]:
    decision = evaluate(prepared, access=AccessConfig(), stored=await store.load())
    return [decision.verdict(p.call_id) for p in prepared]


@pytest.mark.parametrize(
    "command",
    [
        "git diff --no-index ../outside/secret.txt /dev/null",
        "git diff ../outside/secret.txt /dev/null",
        "git log --output=../x",
        "git log --output=x",
        "git show --ext-diff HEAD",
        "git diff '--no-index' README.md /dev/null",
        "ls /etc",
        "ls ../",
        "ls ~/.ssh",
        "ls .*",
    ],
)
async def test_a_stored_legacy_prefix_grant_does_not_cover_escapes(
    prepare: Prepare, legacy_store: FileRuleStore, command: str
) -> None:
    prepared = prepare("bash", command=command)
    assert await _verdicts(legacy_store, [prepared]) == [Verdict.GATED]
    # And "always" on it offers the exact command only, no prefix grant.
    assert [c.pattern for r in prepared.requirements for c in r.candidates] == [prepared.requirements[0].match]


async def test_a_stored_legacy_prefix_grant_still_covers_ordinary_use(
    prepare: Prepare, legacy_store: FileRuleStore
) -> None:
    commands = ["git diff HEAD", "git diff --stat HEAD~1..HEAD -- src", "git log --oneline -n 3", "git status -sb"]
    prepared = [prepare("bash", command=c) for c in commands]
    assert await _verdicts(legacy_store, prepared) == [Verdict.ALLOW] * len(commands)
    (diff,) = prepare("bash", command="git diff HEAD").requirements
    assert [c.pattern for c in diff.candidates] == ["git diff HEAD", "git diff *"]


# -- .git is write-protected like the data directory --------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        ".git/config",
        ".git",
        ".git/hooks/pre-commit",
        ".GIT/config",
        ".Git/config",
        ".git./config",
        ".g\u200cit/config",
        "sub/.git/config",
        "vendor/lib/.GIT/hooks/post-checkout",
        ".gitconfig",
        ".GitConfig",
        ".config/git/config",
        ".loopd/gate-rules.json",
        ".LOOPD/gate-rules.json",
    ],
)
@pytest.mark.parametrize("tool", ["write_file", "edit_file"])
def test_git_configuration_is_not_writable(prepare: Prepare, root: Path, tool: str, path: str) -> None:
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    extra = {"content": "x"} if tool == "write_file" else {"old_string": "[core]", "new_string": "[core] x"}
    with pytest.raises(WorkspaceEscapeError, match="protected"):
        prepare(tool, path=path, **extra)


@pytest.mark.parametrize("tool", ["write_file", "edit_file"])
def test_git_configuration_is_not_writable_through_symlinks(prepare: Prepare, root: Path, tool: str) -> None:
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / ".git" / "config").write_text("[core]\n")
    (root / "gitdir").symlink_to(".git", target_is_directory=True)
    (root / "cfg").symlink_to(".git/config")
    (root / "hook").symlink_to(".git/hooks/post-checkout")  # dangling: writing it would create the hook
    extra = {"content": "x"} if tool == "write_file" else {"old_string": "[core]", "new_string": "[core] x"}
    for path in ("gitdir/config", "cfg", "hook"):
        with pytest.raises(WorkspaceEscapeError, match="protected"):
            prepare(tool, path=path, **extra)


def test_git_files_stay_readable_and_lookalikes_writable(prepare: Prepare, root: Path) -> None:
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    assert prepare("read_file", path=".git/HEAD").arguments["path"] == ".git/HEAD"
    for path in (".gitignore", ".github/workflows/ci.yml", "docs/.gitkeep", "git/config", ".config/other"):
        assert prepare("write_file", path=path, content="x").arguments["path"] == path


async def test_edit_git_config_then_git_status_runs_nothing(
    repo: Path, prepare: Prepare, legacy_store: FileRuleStore, tmp_path: Path
) -> None:
    marker = tmp_path / "fsmonitor-ran"
    config = repo / ".git" / "config"
    before = config.read_text()
    hostile = f"[core]\n\tfsmonitor = touch {marker}\n"
    for tool, extra in (
        ("edit_file", {"old_string": "[core]", "new_string": hostile}),
        ("write_file", {"content": before + hostile}),
    ):
        with pytest.raises(WorkspaceEscapeError, match="protected"):
            prepare(tool, path=".git/config", **extra)
    assert config.read_text() == before
    status = prepare("bash", command="git status --short")
    assert await _verdicts(legacy_store, [status]) == [Verdict.ALLOW]


# -- through a running session ----------------------------------------------------------------------------------


async def test_a_running_session_gates_a_legacy_git_grant_escape(
    repo: Path, legacy_store: FileRuleStore, secret: str
) -> None:
    escape = "git diff --no-index ../outside/secret.txt /dev/null"
    model = ScriptedModel(
        [
            Reply(tool_calls=[("bash", {"command": "git status --short"})]),
            Reply(text="clean"),
            Reply(tool_calls=[("bash", {"command": escape})]),
        ],
        default=Reply(text="done"),
    )
    journal = MemoryJournal()
    tools = tuple(default_tools(Workspace(repo)))
    rig = Rig(loops=[LoopDefinition(name="main", model=model, tools=tools)], journal=journal, rules=legacy_store)
    session = await rig.start_session()
    try:
        # The grant still works for what it was meant for: no prompt.
        done = await session.ask("status?", timeout=30)
        assert isinstance(done, TurnDone)
        assert not [r for r in await journal.read(session.id) if r.kind == "gate_opened"]
        assert "[exit code: 0]" in _tool_outputs(model)[-1]
        # The escape opens a prompt instead of running; denied, the secret never reaches the model.
        sub = session.subscribe(kinds={"gate_opened"})
        await session.submit("diff the secret")
        async with asyncio.timeout(30):
            async for env in sub:
                gate = env.event
                break
        assert isinstance(gate, GateOpened)
        assert [i["match"] for i in gate.prompt["items"]] == [escape]
        await session.answer_gate(gate.gate_id, "deny")
        await session.wait_idle(timeout=30)
        outputs = _tool_outputs(model)
        assert "permission denied" in outputs[-1]
        assert not any(secret in o for o in outputs)
    finally:
        await session.shutdown()


def _tool_outputs(model: ScriptedModel) -> list[str]:
    return [m.content for m in model.requests[-1].messages if m.role == "tool"]
