"""Harness core benchmarks: steps/s, durable journal appends/s next to raw sqlite3, restore time.

python -m benchmarks.harness_core [--repeat N] [--quick]

It runs on the event loop every loopd command runs on (`loopd._infra.eventloop.run`: uvloop, a dependency of loopd);
the journal rows also give the figure on asyncio's own loop (a program that embeds the harness on it).

* steps/s: the whole loop (fake model, echo tool, SqliteJournal), one session and 100 concurrent ones;
* journal throughput: 1, 10 and 100 sessions each appending one record at a time (every append waits for its
  commit), against raw ``sqlite3`` on the same file system with the same durability (WAL, synchronous=NORMAL)
  and the same table, inserting in batches of N rows per transaction — the most a group commit over N
  sessions can gather — and in batches of 100 (a ceiling);
* restore: `Rig.restore_session` of sessions of 1k, 10k and 100k stored events, from the state snapshot a live
  session would have left (decode it, then read + decode + fold only the records after it, + start) and by a full
  replay of the journal (``Rig(state_snapshots=None)``);
* journal at ``synchronous=FULL``: one session appending alone (each append waits for an fsync) against plain
  sqlite3 committing one row per transaction at FULL;
* storage: bytes on disk after the peers' 500-step loopd conversation ÷ its raw message bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks._children import run_main
from benchmarks._common import median, positive_int, print_table, run_child
from benchmarks._goals import print_goals
from loopd._infra import eventloop
from loopd.harness import EchoTool, LoopDefinition, ModelRequest, Reply, Rig, ScriptedModel, SqliteJournal, Usage
from loopd.harness.core import codec
from loopd.harness.core import events as ev
from loopd.harness.core._values import ToolCall, ToolOutcome
from loopd.harness.core.snapshot import encode_state, state_schema
from loopd.harness.journal import JournalWriter, NewRecord, replay, snapshot_due

USAGE = Usage(input_tokens=50, output_tokens=20, calls=1)
PAYLOAD = "x" * 200  # ~200-byte messages
RECORD_DATA = b'{"loop":"main","data":"' + PAYLOAD.encode() + b'"}'
RAW_SCHEMAS = {
    # rows clustered by (session, seq): the journal's layout before its layout 2
    "clustered": (
        "CREATE TABLE r (sid INTEGER NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, v INTEGER NOT NULL, "
        "at REAL NOT NULL, data BLOB NOT NULL, PRIMARY KEY (sid, seq)) WITHOUT ROWID",
    ),
    # rows in append order, (session, seq) in a separate unique index: the journal's layout (layout 2)
    "append": (
        "CREATE TABLE r (id INTEGER PRIMARY KEY, sid INTEGER NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, "
        "v INTEGER NOT NULL, at REAL NOT NULL, data BLOB NOT NULL)",
        "CREATE UNIQUE INDEX r_sid_seq ON r (sid, seq)",
    ),
}


def stepper(steps: int) -> ScriptedModel:
    """Zero-latency model: ``steps`` tool-call steps, then a final answer."""

    def reply(request: ModelRequest) -> Reply:
        done = sum(1 for m in request.messages if m.role == "tool")
        if done < steps:
            return Reply(text="", tool_calls=[("echo", {"text": PAYLOAD})], usage=USAGE)
        return Reply(text="final " + PAYLOAD, usage=USAGE)

    return ScriptedModel(reply)


async def steps_per_second(sessions: int, steps: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        journal = await SqliteJournal.open(Path(d) / "j.db")
        rig = Rig(
            loops=[LoopDefinition(name="main", model=stepper(steps), tools=(EchoTool(),), max_steps=steps + 1)],
            journal=journal,
        )
        started = await asyncio.gather(*(rig.start_session() for _ in range(sessions)))
        t0 = time.perf_counter()
        await asyncio.gather(*(s.ask("go " + PAYLOAD, timeout=600) for s in started))
        wall = time.perf_counter() - t0
        await asyncio.gather(*(s.shutdown() for s in started))
        await journal.aclose()
    return sessions * steps / wall


# --- journal throughput ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Throughput:
    per_second: float
    records_per_commit: float


async def journal_appends(sessions: int, per_session: int) -> Throughput:
    record = NewRecord("tool_completed", 1, RECORD_DATA, 0.0)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "j.db"
        journal = await SqliteJournal.open(path)
        writers = [await journal.create_session(f"s{i}", at=0.0) for i in range(sessions)]
        commits_before = journal.commits

        async def drive(writer: JournalWriter) -> None:
            for _ in range(per_session):
                await writer.append([record])

        t0 = time.perf_counter()
        await asyncio.gather(*(drive(w) for w in writers))
        wall = time.perf_counter() - t0
        commits = journal.commits - commits_before
        await journal.aclose()
        stored = sqlite3.connect(path).execute("SELECT count(*) FROM journal_records").fetchone()[0]
    total = sessions * per_session
    if stored != total:
        raise RuntimeError(f"journal holds {stored} records, expected {total}")
    return Throughput(total / wall, total / max(1, commits))


@dataclass(frozen=True)
class FullAppends:
    """One session appending alone at ``synchronous="FULL"``: µs per append, and how its commits ran."""

    micros: float
    inline: int
    commits: int
    commit_estimate_micros: float


async def journal_full_appends(appends: int) -> FullAppends:
    """One session appending ``appends`` records one at a time to a fresh `SqliteJournal` at ``synchronous="FULL"``
    (every append waits for its commit's fsync)."""
    record = NewRecord("tool_completed", 1, RECORD_DATA, 0.0)
    with tempfile.TemporaryDirectory() as d:
        journal = await SqliteJournal.open(Path(d) / "j.db", synchronous="FULL")
        writer = await journal.create_session("s", at=0.0)
        commits, inline = journal.commits, journal.commits_inline
        t0 = time.perf_counter()
        for _ in range(appends):
            await writer.append([record])
        wall = time.perf_counter() - t0
        result = FullAppends(
            wall * 1e6 / appends,
            journal.commits_inline - inline,
            journal.commits - commits,
            (journal.full_commit_seconds or 0.0) * 1e6,
        )
        await journal.aclose()
    return result


def raw_full_commits(commits: int) -> float:
    """µs per commit of plain sqlite3 at ``synchronous=FULL`` (WAL, SQLite's own checkpoints): one row per
    transaction into the journal's table layout, a fresh file — what a program that commits every record pays."""
    with tempfile.TemporaryDirectory() as d:
        conn = sqlite3.connect(Path(d) / "raw.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        for statement in RAW_SCHEMAS["append"]:
            conn.execute(statement)
        t0 = time.perf_counter()
        for seq in range(1, commits + 1):
            conn.execute("BEGIN")
            conn.execute(
                "INSERT INTO r (sid, seq, kind, v, at, data) VALUES (?, ?, ?, ?, ?, ?)",
                (1, seq, "tool_completed", 1, 0.0, RECORD_DATA),
            )
            conn.execute("COMMIT")
        wall = time.perf_counter() - t0
        conn.close()
    return wall * 1e6 / commits


def journal_appends_on_asyncio_loop(sessions: int, per_session: int) -> Throughput:
    """`journal_appends` on a new loop of asyncio's own (``SelectorEventLoop``), in the calling thread."""
    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        return runner.run(journal_appends(sessions, per_session))


def raw_sqlite_inserts(total: int, batch: int, sessions: int, layout: str = "clustered") -> float:
    """Plain sqlite3, no event loop, no thread: ``batch`` rows per transaction, in the table ``layout``.

    Rows go round-robin to ``sessions`` session ids, each with its own increasing seq, as N sessions' appends do.
    """
    with tempfile.TemporaryDirectory() as d:
        conn = sqlite3.connect(Path(d) / "raw.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        for statement in RAW_SCHEMAS[layout]:
            conn.execute(statement)
        t0 = time.perf_counter()
        n = 0
        for _ in range(total // batch):
            rows = [
                (1 + (n + i) % sessions, 1 + (n + i) // sessions, "tool_completed", 1, 0.0, RECORD_DATA)
                for i in range(batch)
            ]
            n += batch
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO r (sid, seq, kind, v, at, data) VALUES (?, ?, ?, ?, ?, ?)", rows)
            conn.execute("COMMIT")
        wall = time.perf_counter() - t0
        conn.close()
    return n / wall


# --- restore -----------------------------------------------------------------------------------------------


def synthetic_turn(turn: int, steps: int) -> list[ev.LoopEvent]:
    tid = f"main/{turn}"
    out: list[ev.LoopEvent] = [
        ev.TurnStarted(loop="main", turn_id=tid, inputs=(ev.QueuedInput(command_id=f"c{turn}", text=PAYLOAD),), at=0.0)
    ]
    for step in range(1, steps + 1):
        call = ToolCall(id=f"{tid}-{step}", name="echo", arguments={"text": PAYLOAD})
        out.append(ev.ModelReplied(loop="main", turn_id=tid, step=step, text="", tool_calls=(call,), usage=USAGE))
        out.append(
            ev.ToolCompleted(
                loop="main",
                turn_id=tid,
                step=step,
                outcome=ToolOutcome(call_id=call.id, name="echo", status="ok", output=PAYLOAD),
            )
        )
        out.append(ev.StepDone(loop="main", turn_id=tid, step=step, usage=USAGE))
    out.append(
        ev.TurnDone(loop="main", turn_id=tid, step=steps + 1, text=PAYLOAD, step_usage=USAGE, usage=USAGE, at=0.0)
    )
    return out


def last_snapshot_before(n_events: int) -> int:
    """The seq of the newest state snapshot a live session committing one event at a time has saved before its
    record ``n_events`` (`loopd.harness.journal.snapshot_due`): the restore's worst case, the longest tail the
    schedule leaves (0: none yet)."""
    saved = 0
    for seq in range(1, n_events):
        if snapshot_due(saved, seq):
            saved = seq
    return saved


@dataclass(frozen=True)
class StoredSession:
    snapshot_seq: int
    snapshot_bytes: int


async def write_session(path: Path, n_events: int) -> StoredSession:
    """A stored session of exactly ``n_events`` events: turns of 5 tool steps each (the last one may be open), with
    the state snapshot a live session would have left (`last_snapshot_before`)."""
    journal = await SqliteJournal.open(path)
    writer = await journal.create_session("big", at=0.0)
    events: list[ev.SessionEvent | ev.LoopEvent] = [
        ev.SessionStarted(session_id="big", rig="rig", loops=("main",), at=0.0)
    ]
    turn = 0
    while len(events) < n_events:
        turn += 1
        events.extend(synthetic_turn(turn, 5))
    events = events[:n_events]
    for i in range(0, len(events), 2000):
        await writer.append([NewRecord(*codec.encode(e), at=0.0) for e in events[i : i + 2000]])
    await writer.aclose()
    at = last_snapshot_before(n_events)
    size = 0
    if at:
        data = encode_state(replay(await journal.read("big", 1, at)))
        await journal.save_snapshot("big", at, state_schema(), data, at=0.0)
        size = len(data)
    await journal.aclose()
    return StoredSession(at, size)


@dataclass(frozen=True)
class RestoreTime:
    restore_ms: float
    gc_ms: float
    read_ms: float


def restore_time(path: Path, n_events: int, *, freeze: bool = False, full: bool = False) -> RestoreTime:
    """`Rig.restore_session` in a fresh process, as after a crash (`benchmarks._restore_main`); ``full``: without
    state snapshots (a fold of the whole journal)."""
    args = ["--db", str(path), "--events", str(n_events)] + (["--freeze"] if freeze else [])
    args += ["--no-snapshots"] if full else []
    raw = run_child("benchmarks._restore_main", args, timeout=600)
    return RestoreTime(raw["restore_ms"], raw["gc_ms"], raw["read_ms"])


def median_restore(runs: list[RestoreTime]) -> RestoreTime:
    return RestoreTime(
        median([r.restore_ms for r in runs]), median([r.gc_ms for r in runs]), median([r.read_ms for r in runs])
    )


# --- storage -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Storage:
    steps: int
    disk_bytes: int
    raw_bytes: int
    records: int


async def storage(steps: int) -> Storage:
    """The peers' loopd workload (`benchmarks._peer_loopd`: one conversation of ``steps`` tool steps through the
    real OpenAI-compatible adapter, SqliteJournal at NORMAL): bytes on disk after close ÷ its raw message bytes."""
    from benchmarks._peer_loopd import run as loopd_workload
    from benchmarks._workload import raw_message_bytes

    with tempfile.TemporaryDirectory() as d:
        result = await loopd_workload(steps, Path(d))
    if not result.ok:
        raise RuntimeError(f"the loopd workload failed: {result.problem}")
    return Storage(steps, result.disk_bytes, raw_message_bytes(steps), result.persisted["records"])


# --- the run -----------------------------------------------------------------------------------------------


async def run(repeat: int, quick: bool) -> None:
    scale = 4 if quick else 1
    rows: list[list[object]] = []
    s1 = median([await steps_per_second(1, 500 // scale) for _ in range(repeat)])
    s100 = median([await steps_per_second(100, 50 // scale) for _ in range(repeat)])
    rows.append([f"1 session, {500 // scale} steps (1 tool call each)", f"{s1:,.0f}", f"{1000 / s1:.3f}"])
    rows.append([f"100 concurrent sessions, {50 // scale} steps each", f"{s100:,.0f}", f"{1000 / s100:.3f}"])
    print_table(
        f"loop steps/s, fake model, SqliteJournal (median of {repeat})",
        ["", "steps/s", "ms/step"],
        rows,
        note=f"On {eventloop.loop_kind()}, the loop every loopd command runs on.",
    )

    total = 20_000 // scale
    ceiling = median([raw_sqlite_inserts(total, 100, 1) for _ in range(repeat)])
    rows = []
    ratios: dict[int, tuple[float, float]] = {}
    for n in (1, 10, 100):
        # Interleaved, so a noisy phase of the machine weighs on loopd and on its baselines alike.
        ours_runs: list[Throughput] = []
        plain_runs: list[Throughput] = []
        same_runs: list[float] = []
        append_runs: list[float] = []
        for _ in range(repeat):
            ours_runs.append(await journal_appends(n, total // n))
            # asyncio's own loop, on a thread of its own (this loop waits meanwhile)
            plain_runs.append(await asyncio.to_thread(journal_appends_on_asyncio_loop, n, total // n))
            same_runs.append(raw_sqlite_inserts(total, n, n))
            append_runs.append(raw_sqlite_inserts(total, n, n, "append"))
        ours = median([t.per_second for t in ours_runs])
        plain = median([t.per_second for t in plain_runs])
        group = median([t.records_per_commit for t in ours_runs])
        same, append = median(same_runs), median(append_runs)
        ratios[n] = (ours / same, ours / max(same, append))
        rows.append(
            [
                f"{n}",
                f"{ours:,.0f}",
                f"{group:.1f}",
                f"{same:,.0f}",
                f"{ours / same:.2f}×",
                f"{append:,.0f}",
                f"{ours / append:.2f}×",
                f"{plain:,.0f}",
                f"{plain / max(same, append):.2f}×",
            ]
        )
    print_table(
        f"journal throughput: durable appends/s, 1 record per append, N sessions (median of {repeat})",
        [
            "N sessions",
            "loopd appends/s",
            "records/commit",
            "raw, clustered table",
            "loopd ÷ raw",
            "raw, append-order table (the journal's)",
            "loopd ÷ raw",
            "loopd on asyncio's loop",
            "÷ faster raw",
        ],
        rows,
        note=f"loopd: on {eventloop.loop_kind()} (the loop every loopd command runs on); 'on asyncio's loop': the same "
        "journal on asyncio's own SelectorEventLoop. raw: plain sqlite3 (no event loop) inserting N rows per "
        "transaction spread over N session ids (what a group commit over N sessions can gather at best), WAL + "
        "synchronous=NORMAL, same file system. Clustered table: WITHOUT ROWID, primary key (sid, seq). Append-order "
        "table: rowid table + unique index (sid, seq), the journal's own layout. The goal divides loopd by the "
        "faster raw table. Ceiling, 100 "
        f"rows per transaction for one session id: {ceiling:,.0f} rows/s.",
    )

    appends = 1_000 // scale
    synced_runs: list[FullAppends] = []
    raw_synced_runs: list[float] = []
    for _ in range(repeat):  # interleaved, as above
        synced_runs.append(await journal_full_appends(appends))
        raw_synced_runs.append(raw_full_commits(appends))
    middle = median([run.micros for run in synced_runs])
    synced = min(synced_runs, key=lambda run: abs(run.micros - middle))  # the median run, whole
    raw_synced = median(raw_synced_runs)
    print_table(
        f"journal at synchronous=FULL: one session appending alone, {appends:,} records to a fresh file "
        f"(median of {repeat})",
        [
            "loopd µs/append",
            "commits inline",
            "loopd's FULL commit estimate µs",
            "raw sqlite3 µs/commit",
            "loopd ÷ raw",
        ],
        [
            [
                f"{synced.micros:,.0f}",
                f"{synced.inline:,} of {synced.commits:,}",
                f"{synced.commit_estimate_micros:,.0f}",
                f"{raw_synced:,.0f}",
                f"{synced.micros / raw_synced:.2f}×",
            ]
        ],
        note="Every append waits for its commit's fsync. loopd: its FULL commits run on the event loop while their "
        "running estimate stays ≤ 0.5 ms (a hop to the writer thread costs two thread wake-ups), and its WAL "
        "starts over every 512 frames (an fsync of a growing file also commits the file system's journal). Raw: "
        "plain sqlite3, WAL, synchronous=FULL, one row per transaction into the same table layout, SQLite's own "
        "checkpoints. loopd ÷ raw is time per append ÷ time per commit: above 1× is loopd's cost.",
    )

    rows = []
    restores: dict[int, RestoreTime] = {}
    sizes = (1_000, 10_000) if quick else (1_000, 10_000, 100_000)
    with tempfile.TemporaryDirectory() as d:
        for n in sizes:
            path = Path(d) / f"restore-{n}.db"
            stored = await write_session(path, n)
            snapshot_runs: list[RestoreTime] = []
            full_runs: list[RestoreTime] = []
            frozen_runs: list[RestoreTime] = []
            for _ in range(repeat):  # alternating, so a noisy phase weighs on both ways alike
                snapshot_runs.append(restore_time(path, n))
                full_runs.append(restore_time(path, n, full=True))
                frozen_runs.append(restore_time(path, n, freeze=True, full=True))
            restores[n] = r = median_restore(snapshot_runs)
            full = median_restore(full_runs)
            frozen = median_restore(frozen_runs)
            rows.append(
                [
                    f"{n:,}",
                    f"{r.restore_ms:,.1f}",
                    f"{stored.snapshot_seq:,}",
                    f"{n - stored.snapshot_seq:,}",
                    f"{stored.snapshot_bytes / 1024:,.0f}",
                    f"{full.restore_ms:,.1f}",
                    f"{full.restore_ms * 1000 / n:.1f}",
                    f"{full.gc_ms:,.1f}",
                    f"{r.read_ms:,.1f}",
                    f"{frozen.restore_ms:,.1f}",
                ]
            )
    print_table(
        f"restore time in a fresh process (median of {repeat})",
        [
            "events",
            "restore ms",
            "snapshot at seq",
            "records folded after it",
            "snapshot KiB",
            "full replay ms",
            "full replay µs/event",
            "full replay: cyclic GC ms",
            "journal read alone ms",
            "full replay with gc.freeze() ms",
        ],
        rows,
        note="Turns of 5 tool steps (~200-byte payloads). Restore = open writer, load the newest state snapshot "
        "(the one a live session would have saved last before the final record: the longest tail its schedule "
        "leaves), read, decode and fold the records after it, start loops. Full replay: the same without snapshots "
        "(Rig(state_snapshots=None)): read, decode, fold every record. Snapshot: format 2, positional MessagePack in "
        "raw DEFLATE behind a CRC-32, decoded without validation (the benchmark's repeated-character payloads "
        "compress far better than real text).",
    )

    disk = await storage(500)
    print_table(
        "storage after one 500-step conversation (the peers' loopd workload)",
        ["steps", "records", "bytes on disk", "raw message bytes", "÷ raw", "bytes per step"],
        [
            [
                f"{disk.steps}",
                f"{disk.records:,}",
                f"{disk.disk_bytes:,}",
                f"{disk.raw_bytes:,}",
                f"{disk.disk_bytes / disk.raw_bytes:.2f}×",
                f"{disk.disk_bytes / disk.steps:,.0f}",
            ]
        ],
        note="Database + WAL after close (benchmarks._workload.directory_bytes), SqliteJournal at NORMAL, the real "
        "OpenAI-compatible adapter: the same run and figure as `peers`' storage table. Raw: the user text, tool "
        "arguments and outputs and the final answer (~413 B per step). Deterministic: no timing involved.",
    )

    # ours ÷ the faster of the two raw tables (the stricter reading); the table above has both. A quick run appends a
    # quarter of the records once: its ratios are a smoke test's, not the goals' (fixed costs weigh more) — n/a.
    measured: dict[str, float | None] = {f"journal_{n}": None if quick else best for n, (_same, best) in ratios.items()}
    measured["restore_10k_ms"] = restores[10_000].restore_ms
    measured["storage_vs_raw"] = disk.disk_bytes / disk.raw_bytes
    print_goals("harness_core", measured)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=positive_int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 repetition, smaller counts, no 100k restore")
    args = parser.parse_args(argv)
    eventloop.run(run(1 if args.quick else max(1, args.repeat), args.quick))


if __name__ == "__main__":
    run_main(main)
