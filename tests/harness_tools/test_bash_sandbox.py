"""bash under bubblewrap: each way out of the workspace that works unconfined is refused in the sandbox.

Where an escape is harmless to try on this machine, the test runs it unconfined too, showing the hole the sandbox
closes (those are the tests that fail without it).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loopd.harness.core._values import ToolCall
from loopd.harness.models import ModelConfig
from loopd.harness.standard import HarnessSettings, open_standard_rig
from loopd.harness.tools import (
    UNCONFINED,
    BashTool,
    BubblewrapSandbox,
    Sandbox,
    SandboxError,
    SandboxUnavailableError,
    ToolContext,
    ToolResult,
    Workspace,
    resolve_sandbox,
)
from loopd.harness.tools._sandbox import bubblewrap_problem

from .sandboxes import bubblewrap

SECRET = f"sk-sandbox-test-{secrets.token_hex(8)}"


async def run(tool: BashTool, command: str, workspace: Path) -> ToolResult:
    prepared = tool.prepare(ToolCall(id="c1", name="bash", arguments={"command": command, "timeout": 20}))
    ctx = ToolContext(session_id="s1", loop="main", call_id="c1", workspace=workspace)
    return await tool.run(prepared, ctx)


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """``loopd up``'s layout: a data directory with a token file, its workspaces directory next to it."""
    data = tmp_path / "data"
    (data / "resources-api").mkdir(parents=True)
    (data / "resources-api" / "token").write_text(SECRET + "\n")
    workspace = tmp_path / "data-workspaces" / "assistant"
    workspace.mkdir(parents=True)
    (workspace / "notes.txt").write_text("inside\n")
    return data, workspace


def bash(workspace: Path, sandbox: Sandbox, hidden: tuple[Path, ...] = ()) -> BashTool:
    return BashTool(Workspace(workspace), sandbox=sandbox, hidden=hidden)


async def test_other_processes_environments_are_out_of_reach(layout: tuple[Path, Path]) -> None:
    _, workspace = layout
    # A process started with a secret in its environment, as the harness is (/proc shows the environment at exec).
    holder = subprocess.Popen(["sleep", "30"], env={**os.environ, "OPENAI_API_KEY": SECRET})
    try:
        command = f"cat /proc/{holder.pid}/environ; cat /proc/$PPID/environ; cat /proc/*/environ; ls /proc"
        unconfined = await run(bash(workspace, UNCONFINED), command, workspace)
        assert SECRET in unconfined.output
        confined = await run(bash(workspace, bubblewrap()), command, workspace)
        assert SECRET not in confined.output
        pids = {int(entry) for entry in confined.output.split() if entry.isdigit()}
        assert len(pids) <= 4  # the sandbox's own few processes (bwrap's pid 1, bash, ls), none of the host's
    finally:
        holder.kill()
        holder.wait(timeout=30)


async def test_the_data_directory_is_out_of_reach_through_a_relative_path(layout: tuple[Path, Path]) -> None:
    data, workspace = layout
    command = f"cat ../../data/resources-api/token; cat {data}/resources-api/token"
    assert SECRET in (await run(bash(workspace, UNCONFINED), command, workspace)).output
    confined = await run(bash(workspace, bubblewrap(), hidden=(data,)), command, workspace)
    assert SECRET not in confined.output
    assert "No such file or directory" in confined.output


async def test_a_data_directory_inside_the_workspace_is_hidden(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    data = workspace / "state"
    data.mkdir(parents=True)
    (data / "token").write_text(SECRET + "\n")
    command = "cat state/token; ls -A state; echo planted > state/x"
    confined = await run(bash(workspace, bubblewrap(), hidden=(data,)), command, workspace)
    assert SECRET not in confined.output
    assert sorted(os.listdir(data)) == ["token"]  # what the command wrote went to a throwaway tmpfs


async def test_the_home_directory_is_out_of_reach(tmp_path: Path) -> None:
    home = tmp_path / "home" / "someone"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text(SECRET + "\n")
    workspace = home / "project"
    workspace.mkdir()
    command = "cat ../.ssh/id_ed25519; ls -A ..; ls -A ~ | head -3"
    assert SECRET in (await run(bash(workspace, UNCONFINED), command, workspace)).output
    confined = await run(bash(workspace, bubblewrap()), command, workspace)
    assert SECRET not in confined.output
    listed = confined.output.split("[exit code")[0].split()
    assert ".ssh" not in listed  # the parent exists only as the mount point of the workspace


async def test_writes_land_only_in_the_workspace(layout: tuple[Path, Path], tmp_path: Path) -> None:
    _, workspace = layout
    outside = tmp_path / "outside"
    outside.mkdir()
    marker = f"loopd-sandbox-{secrets.token_hex(4)}"
    command = (
        f"echo in > inside.txt; echo out > {outside}/written.txt; echo up > ../written.txt; "
        f"touch /usr/{marker}; touch /etc/{marker}; touch /{marker}; true"
    )
    confined = await run(bash(workspace, bubblewrap()), command, workspace)
    assert (workspace / "inside.txt").read_text() == "in\n"
    assert not (outside / "written.txt").exists()
    assert not (workspace.parent / "written.txt").exists()
    for place in ("/usr", "/etc", "/"):
        assert not Path(place, marker).exists()
    assert "Read-only file system" in confined.output


async def test_tmp_is_private(layout: tuple[Path, Path]) -> None:
    _, workspace = layout
    name = f"loopd-host-tmp-{secrets.token_hex(4)}"
    host_file = Path("/tmp") / name
    host_file.write_text(SECRET)
    try:
        command = f"ls -A /tmp; cat /tmp/{name}; echo mine > /tmp/{name}-sandbox; cat /tmp/{name}-sandbox"
        confined = await run(bash(workspace, bubblewrap()), command, workspace)
        assert SECRET not in confined.output
        assert "mine" in confined.output  # /tmp is writable, just not the host's
        assert not Path(f"/tmp/{name}-sandbox").exists()
    finally:
        host_file.unlink()


@pytest.fixture
async def loopback_server() -> AsyncIterator[int]:
    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello from the host\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_no_network_unless_the_sandbox_grants_it(layout: tuple[Path, Path], loopback_server: int) -> None:
    _, workspace = layout
    command = f"exec 3<>/dev/tcp/127.0.0.1/{loopback_server} && head -1 <&3"
    assert "hello from the host" in (await run(bash(workspace, UNCONFINED), command, workspace)).output
    confined = await run(bash(workspace, bubblewrap()), command, workspace)
    assert confined.is_error
    assert "hello from the host" not in confined.output
    granted = await run(bash(workspace, bubblewrap(network=True)), command, workspace)
    assert granted.output == "hello from the host\n[exit code: 0]"


async def test_git_and_loopd_directories_are_read_only(layout: tuple[Path, Path]) -> None:
    _, workspace = layout
    (workspace / ".git" / "hooks").mkdir(parents=True)
    (workspace / ".git" / "config").write_text("[core]\n")
    command = (
        "cat .git/config; echo '  fsmonitor = evil' >> .git/config; touch .git/hooks/pre-commit; "
        "echo '{}' > .loopd/gate-rules.json; echo ok > src.txt; true"
    )
    confined = await run(bash(workspace, bubblewrap()), command, workspace)
    assert confined.output.startswith("[core]\n")  # readable
    assert (workspace / ".git" / "config").read_text() == "[core]\n"
    assert not (workspace / ".git" / "hooks" / "pre-commit").exists()
    assert not (workspace / ".loopd" / "gate-rules.json").exists()
    assert (workspace / "src.txt").read_text() == "ok\n"


async def test_a_git_symlink_does_not_bind_its_outside_target(layout: tuple[Path, Path], tmp_path: Path) -> None:
    _, workspace = layout
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "config").write_text(SECRET)
    (workspace / ".git").symlink_to(target)
    confined = await run(bash(workspace, bubblewrap()), "cat .git/config", workspace)
    assert SECRET not in confined.output


async def test_the_standard_rig_runs_bash_in_the_sandbox_and_hides_its_data_directory(tmp_path: Path) -> None:
    sandbox = bubblewrap()
    workspace, data = tmp_path / "ws", tmp_path / "ws" / ".state"
    settings = HarnessSettings(workspace=workspace, data_dir=data, model=ModelConfig(model="demo"), sandbox=sandbox)
    async with open_standard_rig(settings) as rig:
        tool = next(t for t in rig.loops[0].tools if t.spec.name == "bash")
        assert isinstance(tool, BashTool)
        assert tool.sandbox is sandbox
        result = await run(tool, "ls -A .state; echo listed", workspace)
    assert (data / "journal.db").exists()
    assert "journal.db" not in result.output


async def test_loopd_run_in_a_home_directory_does_not_show_loopd_ups_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    server_data = home / ".local" / "share" / "loopd"  # loopd up's data directory, inside the workspace
    (server_data / "resources-api").mkdir(parents=True)
    (server_data / "resources-api" / "token").write_text(SECRET + "\n")
    monkeypatch.setenv("LOOPD_DATA_DIR", str(server_data))
    settings = HarnessSettings(
        workspace=home, data_dir=tmp_path / "run-data", model=ModelConfig(model="demo"), sandbox=bubblewrap()
    )
    async with open_standard_rig(settings) as rig:
        tool = next(t for t in rig.loops[0].tools if t.spec.name == "bash")
        assert isinstance(tool, BashTool)
        result = await run(tool, "cat .local/share/loopd/resources-api/token; echo tried", home)
    assert SECRET not in result.output
    assert "tried" in result.output


async def test_password_hashes_in_etc_are_masked(layout: tuple[Path, Path]) -> None:
    _, workspace = layout
    if not Path("/etc/shadow").exists():
        pytest.skip("no /etc/shadow on this machine")
    confined = await run(bash(workspace, bubblewrap()), "cat /etc/shadow; cat /etc/passwd | head -1", workspace)
    lines = confined.output.splitlines()
    assert any(line.startswith("root:x:") for line in lines)  # /etc/passwd is readable (tools need it)
    assert not any(line.startswith("root:") and not line.startswith("root:x:") for line in lines)  # shadow is not


# --- choosing a sandbox -----------------------------------------------------------------------------------


def test_modes_resolve_from_the_argument_or_the_environment(tmp_path: Path) -> None:
    assert resolve_sandbox("none") is UNCONFINED
    assert resolve_sandbox(None, environ={"LOOPD_SANDBOX": "none"}) is UNCONFINED
    with pytest.raises(SandboxError, match="unknown sandbox 'jail'"):
        resolve_sandbox("jail")
    assert UNCONFINED.describe() == "sandbox: none — commands run unconfined"
    assert BubblewrapSandbox().describe() == "sandbox: bubblewrap"
    if bubblewrap_problem() is None:
        assert resolve_sandbox(None, environ={}).name == "bubblewrap"  # auto picks it when it works


def test_required_bubblewrap_that_is_missing_is_an_error_and_auto_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    with pytest.raises(SandboxUnavailableError, match="bwrap is not installed"):
        resolve_sandbox("bubblewrap")
    assert resolve_sandbox("auto") is UNCONFINED


def test_a_bwrap_that_fails_its_probe_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailableError, match="No permissions to create new namespace"):
        resolve_sandbox("bubblewrap")


@pytest.mark.parametrize("command", [["run", "hi"], ["up", "--port", "0"], ["harness", "serve", "--port", "0"]])
def test_cli_refuses_a_required_sandbox_it_cannot_have_in_one_line(tmp_path: Path, command: list[str]) -> None:
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path), "LOOPD_DATA_DIR": str(tmp_path / "data")}
    loopd = Path(sys.executable).parent / "loopd"
    done = subprocess.run(
        [str(loopd), *command, "--sandbox", "bubblewrap"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr.decode()
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1
    assert "sandbox bubblewrap is unavailable" in lines[0]


@pytest.mark.parametrize("mode", ["none", "bubblewrap"])
def test_loopd_run_names_its_sandbox_at_start(tmp_path: Path, mode: str) -> None:
    if mode == "bubblewrap":
        bubblewrap()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPD_", "OPENAI_"))}
    env.update({"LOOPD_DATA_DIR": str(tmp_path / "data"), "LOOPD_MODEL": "demo"})
    loopd = Path(sys.executable).parent / "loopd"
    done = subprocess.run(
        [str(loopd), "run", "--sandbox", mode, "hello"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr.decode()
    expected = "sandbox: bubblewrap" if mode == "bubblewrap" else "sandbox: none — commands run unconfined"
    assert expected in done.stderr.decode().splitlines()


def test_child_pids_with_and_without_the_children_file() -> None:
    from loopd.harness.tools import _sandbox

    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in _sandbox.child_pids(os.getpid())
        assert child.pid in _sandbox._children_by_scan(os.getpid())
    finally:
        child.kill()
        child.wait(timeout=30)


async def test_mounts_go_parents_first_so_a_read_only_directory_inside_the_workspace_stays_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loopd.harness.tools import _sandbox

    sandbox = bubblewrap()
    workspace = tmp_path / "ws"
    (workspace / "vendor").mkdir(parents=True)
    # As if a system directory lay inside the workspace (the case of a workspace at "/").
    monkeypatch.setattr(_sandbox, "_SYSTEM_DIRS", (*_sandbox._SYSTEM_DIRS, str(workspace / "vendor")))
    result = await run(bash(workspace, sandbox), "touch vendor/x; touch mine; ls -A", workspace)
    assert "Read-only file system" in result.output
    assert (workspace / "mine").exists()
    assert not (workspace / "vendor" / "x").exists()
