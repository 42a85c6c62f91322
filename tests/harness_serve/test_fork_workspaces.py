"""Per-session workspaces and forks that start from a workspace snapshot over HTTP (`SessionWorkspaces`):
each session in ``<root>/<id>`` (0700), a fork's ``workspace: keep|new|overwrite``, a restart restoring each
session in its own directory, and what nobody can make it do (escape the root, expose the data dir, skip the token).
"""

from __future__ import annotations

import asyncio
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from loopd.harness import LoopDefinition, Reply, Rig, ScriptedModel, SqliteJournal, ToolCall
from loopd.harness.gate import Access, AccessConfig
from loopd.harness.models import ModelRequest
from loopd.harness.serve import SessionWorkspaces
from loopd.harness.snapshots import SnapshotPolicy, SnapshotResult, SnapshotStore
from loopd.harness.standard import HarnessSettings, open_standard_rig, rig_on
from loopd.harness.tools import FS_WRITE, Workspace, default_tools

from .conftest import Served, client_for, serving

TOKEN = "fork-workspaces-token"


def _script(request: ModelRequest) -> Reply:
    """``put NAME VALUE`` writes the file, then answers "done"."""
    last = request.messages[-1]
    if last.role == "tool":
        return Reply(text="done")
    words = last.content.split()
    if words[:1] == ["put"] and len(words) == 3:
        return Reply(
            tool_calls=[
                ToolCall(id=f"w-{words[1]}", name="write_file", arguments={"path": words[1], "content": words[2]})
            ]
        )
    return Reply(text="ok")


def _rig(journal: SqliteJournal, base_dir: Path, snap: Path | None) -> Rig:
    base_dir.mkdir(exist_ok=True)
    loop = LoopDefinition(
        name="main",
        model=ScriptedModel(_script),
        tools=tuple(default_tools(Workspace(base_dir))),
        access=AccessConfig(kinds={FS_WRITE: Access.ALLOW}),
    )
    return Rig(
        loops=[loop],
        journal=journal,
        name="test",
        workspace=base_dir,
        snapshots=SnapshotPolicy(root=snap) if snap is not None else None,
    )


def _rebind(base: Rig, directory: Path) -> Rig:
    """The test rig on ``directory`` (what `rig_on` does for the standard rig)."""
    tools = tuple(default_tools(Workspace(directory)))
    return replace(base, loops=[replace(base.loops[0], tools=tools)], workspace=directory)


async def _put(served: Served, session_id: str, name: str, value: str) -> None:
    accepted = await served.client.post(f"/v1/sessions/{session_id}/inputs", json={"text": f"put {name} {value}"})
    assert accepted.status_code == 202, accepted.text
    await served.session(session_id).wait_idle(timeout=30)


async def _parent(served: Served) -> tuple[str, int]:
    """A session that wrote a.txt = 1, then 2; the seq after its first turn."""
    created = await served.client.post("/v1/sessions", json={"input": "put a.txt 1"})
    assert created.status_code == 201, created.text
    parent = created.json()["id"]
    await served.session(parent).wait_idle(timeout=30)
    after_first = served.session(parent).last_seq
    await _put(served, parent, "a.txt", "2")
    return parent, after_first


async def test_each_session_and_fork_works_in_its_own_directory(journal: SqliteJournal, tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    workspaces = SessionWorkspaces(root, _rebind, hidden=[tmp_path / "data"])
    rig = _rig(journal, tmp_path / "unused", tmp_path / "snap")
    async with serving(rig, token=TOKEN, workspaces=workspaces) as served:
        parent, seq = await _parent(served)
        assert (root / parent / "a.txt").read_text() == "2"
        assert stat.S_IMODE(os.stat(root / parent).st_mode) == 0o700
        assert list((tmp_path / "unused").iterdir()) == []

        new = await served.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": seq, "workspace": "new"})
        assert new.status_code == 201, new.text
        fork = new.json()["id"]
        assert new.json()["workspace"] == "new"
        assert (root / fork / "a.txt").read_text() == "1"  # as the parent's first turn left it
        assert (root / parent / "a.txt").read_text() == "2"  # the parent untouched
        assert stat.S_IMODE(os.stat(root / fork).st_mode) == 0o700
        kinds = [i["kind"] for i in (await served.client.get(f"/v1/sessions/{fork}/journal")).json()["items"]]
        assert kinds[-4:] == ["session_forked", "workspace_forked", "session_restored", "workspace_restored"]
        await _put(served, fork, "b.txt", "fork")
        assert (root / fork / "b.txt").read_text() == "fork" and not (root / parent / "b.txt").exists()

        # keep: the parent's directory as it is now, shared; overwrite: the parent's directory put back.
        kept = await served.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": seq})
        assert kept.status_code == 201 and kept.json()["workspace"] == "keep"
        await _put(served, kept.json()["id"], "k.txt", "kept")
        assert (root / parent / "k.txt").read_text() == "kept" and not (root / kept.json()["id"]).exists()
        over = await served.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": seq, "workspace": "overwrite"})
        assert over.status_code == 201, over.text
        assert (root / parent / "a.txt").read_text() == "1"

        # A fork of the fork (new) starts from the fork's own snapshot.
        fork_seq = served.session(fork).last_seq
        grand = await served.client.post(f"/v1/sessions/{fork}/fork", json={"at_seq": fork_seq, "workspace": "new"})
        assert grand.status_code == 201, grand.text
        assert (root / grand.json()["id"] / "b.txt").read_text() == "fork"

        # The same Idempotency-Key with another workspace choice is another request.
        first = await served.client.post(
            f"/v1/sessions/{parent}/fork", json={"at_seq": seq}, headers={"Idempotency-Key": "k1"}
        )
        assert first.status_code == 201
        other = await served.client.post(
            f"/v1/sessions/{parent}/fork", json={"at_seq": seq, "workspace": "new"}, headers={"Idempotency-Key": "k1"}
        )
        assert other.status_code == 409, other.text

    # A restarted server restores each dormant session in the directory its journal names.
    async with serving(rig, token=TOKEN, workspaces=SessionWorkspaces(root, _rebind)) as served:
        await _put(served, fork, "c.txt", "again")
        assert (root / fork / "c.txt").read_text() == "again"
        await _put(served, kept.json()["id"], "d.txt", "shared")
        assert (root / parent / "d.txt").read_text() == "shared"


async def test_nothing_escapes_the_root_or_reaches_the_data_dir(journal: SqliteJournal, tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    outside = tmp_path / "outside"
    outside.mkdir()
    root.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    data = root / "data"  # a data directory inside the root: no session may be it
    data.mkdir()
    workspaces = SessionWorkspaces(root, _rebind, hidden=[data])
    async with serving(_rig(journal, tmp_path / "unused", tmp_path / "snap"), workspaces=workspaces) as served:
        parent, seq = await _parent(served)
        before = await journal.sessions()
        for name in ("..", ".", "a:b", ".hidden", "link", "data"):
            body = {"at_seq": seq, "workspace": "new", "session_id": name}
            refused = await served.client.post(f"/v1/sessions/{parent}/fork", json=body)
            assert refused.status_code == 400, (name, refused.text)
            assert refused.json()["error"]["type"] == "invalid_request"
        for body in ({"at_seq": seq, "workspace": "../x"}, {"at_seq": seq, "workspace": "/tmp"}):
            refused = await served.client.post(f"/v1/sessions/{parent}/fork", json=body)
            assert refused.status_code == 400, refused.text
        assert len(await journal.sessions()) == len(before)
        assert list(outside.iterdir()) == [] and list(data.iterdir()) == []
        assert sorted(p.name for p in root.iterdir()) == sorted(["link", "data", parent])


async def test_refusals_leave_nothing_behind_and_the_token_is_required(journal: SqliteJournal, tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    no_snapshots = _rig(journal, tmp_path / "unused", None)
    async with serving(no_snapshots, token=TOKEN, workspaces=SessionWorkspaces(root, _rebind)) as served:
        parent, seq = await _parent(served)
        refused = await served.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": seq, "workspace": "new"})
        assert refused.status_code == 400 and "no workspace snapshots" in refused.json()["error"]["message"]
        assert [p.name for p in root.iterdir()] == [parent]  # the fork's directory was not left behind
        async with client_for(served.url) as anonymous:
            denied = await anonymous.post(f"/v1/sessions/{parent}/fork", json={"at_seq": seq, "workspace": "new"})
            assert denied.status_code == 401
        unknown = await served.client.post("/v1/sessions/nope/fork", json={"at_seq": 1, "workspace": "keep"})
        assert unknown.status_code == 404


async def test_the_shared_workspace_can_be_put_back_in_place(journal: SqliteJournal, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    async with serving(_rig(journal, shared, tmp_path / "snap")) as served:  # no per-session directories
        parent, seq = await _parent(served)
        busy = await served.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": seq, "workspace": "new"})
        assert busy.status_code == 400 and "not empty" in busy.json()["error"]["message"]
        over = await served.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": seq, "workspace": "overwrite"})
        assert over.status_code == 201, over.text
        assert (shared / "a.txt").read_text() == "1"


async def test_rig_on_binds_the_standard_rigs_tools_to_the_directory(tmp_path: Path) -> None:
    settings = HarnessSettings(workspace=tmp_path / "root", data_dir=tmp_path / "data")
    async with open_standard_rig(settings) as base:
        (tmp_path / "root" / "s1").mkdir()
        rig = rig_on(base, settings, tmp_path / "root" / "s1")
        assert rig.workspace == tmp_path / "root" / "s1" and rig.journal is base.journal
        write = next(t for t in rig.loops[0].tools if t.spec.name == "write_file")
        helper_write = next(t for t in rig.agents[0].tools if t.spec.name == "write_file")
        assert write is helper_write  # one set of tools for the loop and its helper, as in the base rig
        assert write.workspace.root == (tmp_path / "root" / "s1").resolve()  # type: ignore[attr-defined]
        assert {t.spec.name for t in rig.loops[0].tools} == {t.spec.name for t in base.loops[0].tools}


async def test_a_fork_right_after_a_turn_ends_waits_for_that_turns_snapshot(
    journal: SqliteJournal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client sees a turn end (``turns`` counted) just before the snapshot that follows it is journaled; a fork
    asked for "after that turn" in between waits for it instead of answering "no snapshot at that seq"."""
    root = tmp_path / "sessions"
    workspaces = SessionWorkspaces(root, _rebind)
    rig = _rig(journal, tmp_path / "unused", tmp_path / "snap")
    taking = asyncio.Event()
    release = asyncio.Event()
    original = SnapshotStore.checkpoint

    calls: list[int] = []

    async def held(self: SnapshotStore) -> SnapshotResult:
        calls.append(1)
        if len(calls) == 2:  # the turn's start, then its end: hold the end's
            taking.set()
            await release.wait()
        return await original(self)

    async with serving(rig, token=TOKEN, workspaces=workspaces) as served:
        created = await served.client.post("/v1/sessions", json={})
        parent = created.json()["id"]
        monkeypatch.setattr(SnapshotStore, "checkpoint", held)
        accepted = await served.client.post(f"/v1/sessions/{parent}/inputs", json={"text": "put a.txt 1"})
        assert accepted.status_code == 202, accepted.text
        async with asyncio.timeout(30):
            await taking.wait()  # the turn ended: its snapshot is being taken
        body = (await served.client.get(f"/v1/sessions/{parent}")).json()
        assert body["turns"] == 1
        fork = asyncio.create_task(
            served.client.post(f"/v1/sessions/{parent}/fork", json={"at_seq": body["last_seq"], "workspace": "new"})
        )
        await asyncio.sleep(0.2)
        assert not fork.done()  # waiting for the snapshot, not refused
        release.set()
        forked = await fork
        assert forked.status_code == 201, forked.text
        assert (root / forked.json()["id"] / "a.txt").read_text() == "1"
