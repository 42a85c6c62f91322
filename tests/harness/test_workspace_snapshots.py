"""Workspace snapshots: the pure history, the object store (dedup, stat cache, safe restore, GC), the runtime
(checkpoint on turn end, undo, diff) and restore of the session (undo after a crash)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from loopd.harness import LoopDefinition, Reply, Rig, ScriptedModel, SqliteJournal
from loopd.harness.actors._workspace import NothingToUndoError, WorkspaceBusyError
from loopd.harness.core import events as ev
from loopd.harness.core.workspace import (
    EMPTY_WORKSPACE_HISTORY,
    apply_workspace,
    checkpoint_due,
    undo_target,
)
from loopd.harness.gate import Access, AccessConfig
from loopd.harness.snapshots import SnapshotError, SnapshotPolicy, SnapshotStore, collect_garbage
from loopd.harness.tools import FS_WRITE, Workspace, default_tools

from .helpers import journal_state

# --- the pure part ---------------------------------------------------------------------------------------------


def _cp(ref: str, trigger: str = "turn_done") -> ev.WorkspaceCheckpointed:
    return ev.WorkspaceCheckpointed(ref=ref, trigger=trigger, loop="main", turn_id="main/1", at=1.0)


def test_history_is_a_stack_with_a_head_and_undo_restores_below_it() -> None:
    h = EMPTY_WORKSPACE_HISTORY
    assert undo_target(h) is None
    h = apply_workspace(h, _cp("a", "turn_started"))
    assert undo_target(h) is None  # one checkpoint: nothing before it
    h = apply_workspace(h, _cp("b"))
    h = apply_workspace(h, _cp("c"))
    assert h.current is not None and h.current.ref == "c"
    target = undo_target(h)
    assert target is not None and target[1].ref == "b"
    h = apply_workspace(h, ev.WorkspaceRestored(ref="b", index=1, at=2.0))
    assert h.head == 1 and len(h.checkpoints) == 3  # later checkpoints stay (a restore can be undone)
    target = undo_target(h)
    assert target is not None and target[1].ref == "a"
    # A restore of a ref the session never recorded keeps the head.
    assert apply_workspace(h, ev.WorkspaceRestored(ref="zz", index=-1, at=3.0)).head == 1
    # Checkpoints equal to the head (a turn that changed nothing) are skipped: undo always changes something.
    same = EMPTY_WORKSPACE_HISTORY
    for ref in ("a", "b", "b"):
        same = apply_workspace(same, _cp(ref))
    target = undo_target(same)
    assert target is not None and target[1].ref == "a"
    assert undo_target(apply_workspace(apply_workspace(EMPTY_WORKSPACE_HISTORY, _cp("x")), _cp("x"))) is None


def test_checkpoint_due_follows_the_policy() -> None:
    started = ev.TurnStarted(loop="main", turn_id="main/1", inputs=(), at=0.0)
    step = ev.StepDone(loop="main", turn_id="main/1", step=1, usage=ev.Usage())
    done = ev.TurnDone(loop="main", turn_id="main/1", step=2, text="x", step_usage=ev.Usage(), usage=ev.Usage(), at=0.0)
    assert checkpoint_due("off", [started, done], loop_idle=True) is None
    assert checkpoint_due("turn_done", [started], loop_idle=False) == ("turn_started", "main/1")
    assert checkpoint_due("turn_done", [step], loop_idle=False) is None
    assert checkpoint_due("step_done", [step], loop_idle=False) == ("step_done", "main/1")
    assert checkpoint_due("turn_done", [done], loop_idle=False) == ("turn_done", "main/1")
    assert checkpoint_due("idle", [done], loop_idle=False) is None  # input waits: the loop goes on
    assert checkpoint_due("idle", [done], loop_idle=True) == ("idle", "main/1")


# --- the store -------------------------------------------------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def _read(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink() and ".loopd" not in p.parts:
            out[str(p.relative_to(root))] = p.read_text()
    return out


def test_store_dedups_uses_the_stat_cache_and_restores_exactly(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _tree(ws, {"a.txt": "same", "b.txt": "same", "d/c.txt": "c", "d/e/f.txt": "f"})
    (ws / ".loopd").mkdir()
    (ws / ".loopd" / "gate-rules.json").write_text("{}")
    store = SnapshotStore(tmp_path / "snap", ws)
    first = store.checkpoint_sync()
    assert first.files == 4 and first.hashed == 4
    # Two files with the same content are stored once: 3 file objects + 3 trees.
    assert first.objects_new == 6
    old = os.stat(ws / "a.txt").st_mtime_ns - 10_000_000_000
    for p in ws.rglob("*.txt"):  # old mtimes: the entries are cached (not "racy")
        os.utime(p, ns=(old, old))
    second = store.checkpoint_sync()
    assert second.ref == first.ref and second.bytes_new == 0
    third = store.checkpoint_sync()
    assert third.hashed == 0  # every file matched the stat cache
    (ws / "d" / "c.txt").write_text("changed")
    (ws / "new.txt").write_text("new")
    (ws / "b.txt").unlink()
    changed = store.checkpoint_sync()
    assert changed.hashed == 2 and changed.ref != first.ref
    assert [(c.status, c.path) for c in store.changes_sync(first.ref, changed.ref)] == [
        ("removed", "b.txt"),
        ("modified", "d/c.txt"),
        ("added", "new.txt"),
    ]
    assert "-c\n+changed" in store.diff_sync(first.ref, changed.ref).replace("\\ No newline at end of file\n", "")
    store.restore_sync(first.ref)
    assert _read(ws) == {"a.txt": "same", "b.txt": "same", "d/c.txt": "c", "d/e/f.txt": "f"}
    assert (ws / ".loopd" / "gate-rules.json").read_text() == "{}"  # excluded: untouched


def test_restore_never_writes_outside_the_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("keep")
    _tree(ws, {"d/x.txt": "x", "y.txt": "y"})
    store = SnapshotStore(tmp_path / "snap", ws)
    ref = store.checkpoint_sync().ref
    # Replace the directory and a file by symlinks to the outside: restore replaces the links, never follows them.
    import shutil

    shutil.rmtree(ws / "d")
    (ws / "d").symlink_to(outside)
    (ws / "y.txt").unlink()
    (ws / "y.txt").symlink_to(outside / "secret.txt")
    store.restore_sync(ref)
    assert (outside / "secret.txt").read_text() == "keep" and sorted(os.listdir(outside)) == ["secret.txt"]
    assert not (ws / "d").is_symlink() and (ws / "d" / "x.txt").read_text() == "x"
    assert not (ws / "y.txt").is_symlink() and (ws / "y.txt").read_text() == "y"
    # A snapshot that holds a symlink keeps it as a link (its target is text, not followed).
    (ws / "link").symlink_to(outside / "secret.txt")
    linked = store.checkpoint_sync().ref
    (ws / "link").unlink()
    store.restore_sync(linked)
    assert os.readlink(ws / "link") == str(outside / "secret.txt")


@pytest.mark.parametrize("name", ["..", "../escape.txt", "a/b", ".", "/etc/passwd"])
def test_a_tree_naming_a_path_outside_is_refused_before_anything_is_written(tmp_path: Path, name: str) -> None:
    ws = tmp_path / "ws"
    _tree(ws, {"keep.txt": "k"})
    store = SnapshotStore(tmp_path / "snap", ws)
    blob, _ = store._put_bytes(b"evil")
    body = json.dumps({"v": 1, "entries": [[name, "f", 0, 4, blob]]}).encode()
    evil, _ = store._put_bytes(body)
    with pytest.raises(SnapshotError, match="unsafe path"):
        store.restore_sync(evil)
    assert (ws / "keep.txt").read_text() == "k"
    assert not (tmp_path / "escape.txt").exists()
    with pytest.raises(SnapshotError, match="not a snapshot ref"):
        store.restore_sync("../../etc")


def test_garbage_collection_keeps_what_a_live_ref_reaches(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _tree(ws, {"a.txt": "one", "d/b.txt": "two"})
    store = SnapshotStore(tmp_path / "snap", ws)
    live = store.checkpoint_sync().ref
    (ws / "a.txt").write_text("dead")
    dead = store.checkpoint_sync().ref
    deleted, freed = collect_garbage(tmp_path / "snap", {live}, grace_seconds=0)
    assert deleted == 2 and freed > 0  # the dead root tree and "dead"
    assert not store.has(dead)
    store.restore_sync(live)
    assert _read(ws) == {"a.txt": "one", "d/b.txt": "two"}
    assert collect_garbage(tmp_path / "snap", set(), grace_seconds=3600) == (0, 0)  # young objects are kept


# --- the runtime ---------------------------------------------------------------------------------------------


def _write(path: str, content: str) -> Reply:
    return Reply(tool_calls=[("write_file", {"path": path, "content": content})])


async def _rig(tmp_path: Path, journal: SqliteJournal, script: list[Reply], on: str = "turn_done") -> Rig:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    tools = tuple(t for t in default_tools(Workspace(ws)) if t.spec.name == "write_file")
    loop = LoopDefinition(
        name="main",
        model=ScriptedModel(script, default=Reply(text="ok")),
        tools=tools,
        access=AccessConfig(kinds={FS_WRITE: Access.ALLOW}),
    )
    return Rig(
        loops=[loop],
        journal=journal,
        workspace=ws,
        snapshots=SnapshotPolicy(root=tmp_path / "snap", on=on),  # type: ignore[arg-type]
    )


async def test_turns_are_checkpointed_and_undo_restores_the_workspace_before_the_last_turn(
    tmp_path: Path, sqlite_journal: SqliteJournal
) -> None:
    ws = tmp_path / "ws"
    script = [_write("a.txt", "1"), Reply(text="wrote a"), _write("a.txt", "2"), Reply(text="changed a")]
    rig = await _rig(tmp_path, sqlite_journal, script)
    async with rig.open_session() as session:
        await session.ask("write a", timeout=30)
        await session.ask("change a", timeout=30)
        await session.wait_idle(timeout=30)  # the checkpoint after the turn's end
        assert (ws / "a.txt").read_text() == "2"
        kinds = [c.trigger for c in session.state.workspace.checkpoints]
        assert kinds == ["turn_started", "turn_done", "turn_done"]  # turn 2's start equals turn 1's end
        assert "-1\n+2" in (await session.workspace.diff()).replace("\\ No newline at end of file\n", "")
        await session.workspace.undo()
        assert (ws / "a.txt").read_text() == "1"
        await session.workspace.undo()
        assert not (ws / "a.txt").exists()
        with pytest.raises(NothingToUndoError):
            await session.workspace.undo()
        rebuilt = await journal_state(sqlite_journal, session.id)
        assert rebuilt.workspace == session.state.workspace  # live == fold of the journal


async def test_restore_is_refused_while_a_turn_runs(tmp_path: Path, sqlite_journal: SqliteJournal) -> None:
    import asyncio

    rig = await _rig(tmp_path, sqlite_journal, [Reply(text="slow", delay=5.0)], on="off")
    async with rig.open_session() as session:
        ref = await session.checkpoint_workspace()
        await session.submit("go")
        await asyncio.sleep(0)
        for _ in range(100):
            if session.state.loops["main"].turn is not None:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(WorkspaceBusyError):
            await session.restore_workspace(ref)
        await session.interrupt()


async def test_undo_works_after_a_crash_and_a_restore_of_the_session(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    journal = await SqliteJournal.open(tmp_path / "j.db")
    rig = await _rig(tmp_path, journal, [_write("f.txt", "v1"), Reply(text="done")])
    session = await rig.start_session()
    await session.ask("write", timeout=30)
    await session.wait_idle(timeout=30)
    session.abort()  # a crash: no SessionStopped
    await journal.aclose()
    journal = await SqliteJournal.open(tmp_path / "j.db")
    rig = await _rig(tmp_path, journal, [])
    restored = await rig.restore_session(session.id)
    try:
        assert len(restored.state.workspace.checkpoints) == 2
        await restored.workspace.undo()
        assert not (ws / "f.txt").exists()
    finally:
        await restored.shutdown()
        await journal.aclose()


async def test_garbage_collection_from_a_journal_keeps_every_recorded_snapshot(tmp_path: Path) -> None:
    from loopd.harness.snapshots import collect_unreferenced

    journal = await SqliteJournal.open(tmp_path / "j.db")
    try:
        rig = await _rig(tmp_path, journal, [], on="off")
        ws = tmp_path / "ws"
        async with rig.open_session() as session:
            (ws / "kept.txt").write_text("recorded")
            kept = await session.checkpoint_workspace()
        store = SnapshotStore(tmp_path / "snap", ws)
        (ws / "kept.txt").write_text("never recorded")
        orphan = store.checkpoint_sync().ref  # stored, but no journal names it (as after a crash)
        deleted, _ = await collect_unreferenced(journal, tmp_path / "snap", grace_seconds=0)
        assert deleted == 2 and not store.has(orphan) and store.has(kept)
        store.restore_sync(kept)
        assert (ws / "kept.txt").read_text() == "recorded"
    finally:
        await journal.aclose()
