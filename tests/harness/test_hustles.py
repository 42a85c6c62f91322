"""Background lanes ("hustles"): compaction runs on a lane while the turn goes on; caps; shutdown; restore."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from loopd._infra.clock import SystemClock
from loopd.harness import EchoTool, LoopDefinition, MemoryJournal, ModelRequest, Reply, Rig, ScriptedModel, Usage
from loopd.harness.actors._hustle import HustleLanes, HustleQueueFullError, HustleResult
from loopd.harness.core import codec
from loopd.harness.core.compaction import SUMMARIZER_PROMPT, SUMMARY_PREFIX
from loopd.harness.core.events import HistoryCompacted, HustleCompleted, HustleFailed, HustleStarted, TurnDone
from loopd.harness.core.hustles import HustleInfo, LaneLimits, admit, on_restore
from loopd.harness.models import ModelChunk

from .helpers import journal_state, same_loops

STEPS = 6


class HeldSummaries:
    """The echo agent of test_compaction, whose summarizer waits until ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.summaries_started = 0

        def script(request: ModelRequest) -> Reply:
            if request.system == SUMMARIZER_PROMPT:
                return Reply(text="the user wants echoes", usage=Usage(input_tokens=7, calls=1))
            echoes = sum(1 for m in request.messages if m.role == "tool")
            if echoes < STEPS and not request.messages[0].content.startswith(SUMMARY_PREFIX):
                return Reply(tool_calls=[("echo", {"text": "x" * 200})])
            return Reply(text="finished")

        self.inner = ScriptedModel(script)

    @property
    def name(self) -> str:
        return "held"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        if request.system == SUMMARIZER_PROMPT:
            self.summaries_started += 1
            await self.release.wait()
        async for chunk in self.inner.stream(request):
            yield chunk


def _rig(model: HeldSummaries, journal: MemoryJournal) -> Rig:
    loop = LoopDefinition(
        name="main",
        model=model,
        tools=(EchoTool(),),
        compact_at_tokens=120,
        compact_keep_recent=3,
        compact_block_at_tokens=10**9,  # never wait: every compaction runs in the background
    )
    return Rig(loops=[loop], journal=journal)


async def _events(journal: MemoryJournal, sid: str) -> list[object]:
    return [codec.decode(r.kind, r.version, r.data) for r in await journal.read(sid)]


# --- the pure decisions --------------------------------------------------------------------------------------


def test_a_lane_runs_then_queues_then_refuses() -> None:
    limits = LaneLimits(concurrency=2, queue=1)
    assert admit(limits, running=0, waiting=0) == "run"
    assert admit(limits, running=2, waiting=0) == "queue"
    assert admit(limits, running=1, waiting=1) == "refuse"  # first come, first served: no overtaking the queue
    with pytest.raises(ValueError):
        LaneLimits(concurrency=0)


def test_a_restore_resumes_the_kinds_it_can_and_fails_the_others() -> None:
    a = HustleInfo("a", "compaction", "background", "main", {})
    b = HustleInfo("b", "title", "background", None, {})
    plan = on_restore({"a": a, "b": b}, resumable={"compaction"})
    assert plan.resume == (a,) and plan.fail == (b,)


# --- the runtime ---------------------------------------------------------------------------------------------


async def test_the_turn_goes_on_while_its_compaction_runs_in_the_background() -> None:
    journal = MemoryJournal()
    model = HeldSummaries()
    session = await _rig(model, journal).start_session()
    done = await session.ask("echo a lot", timeout=10)  # finishes although every summary is held
    assert isinstance(done, TurnDone) and done.text == "finished"
    (open_hustle,) = session.state.hustles.values()
    assert open_hustle.name == "compaction" and open_hustle.lane == "background" and model.summaries_started == 1
    model.release.set()
    await session.wait_idle(timeout=10)  # waits for background work too
    events = await _events(journal, session.id)
    kinds = [type(e) for e in events]
    assert kinds.index(HustleStarted) < kinds.index(TurnDone) < kinds.index(HustleCompleted)
    assert kinds.index(HustleCompleted) < kinds.index(HistoryCompacted)  # the summary landed between turns
    assert session.state.loops["main"].history[0].content.startswith(SUMMARY_PREFIX)
    assert session.state.hustles == {}
    same_loops(session.state, await journal_state(journal, session.id))
    await session.shutdown()


@pytest.mark.parametrize("how", ["crash", "shutdown"])
async def test_a_compaction_cut_off_is_resumed_by_the_restore(how: str) -> None:
    journal = MemoryJournal()
    model = HeldSummaries()
    rig = _rig(model, journal)
    session = await rig.start_session()
    await session.ask("echo a lot", timeout=10)
    (hustle_id,) = session.state.hustles
    if how == "crash":
        session.abort()
    else:
        await session.shutdown()  # cancels the hustle; the journal keeps it open
    assert set((await journal_state(journal, session.id)).hustles) == {hustle_id}
    model.release.set()
    restored = await rig.restore_session(session.id)
    await restored.wait_idle(timeout=10)
    events = await _events(journal, session.id)
    assert [e.hustle_id for e in events if isinstance(e, HustleStarted)] == [hustle_id]  # resumed, not restarted
    assert any(isinstance(e, HustleCompleted) and e.hustle_id == hustle_id for e in events)
    assert restored.state.loops["main"].history[0].content.startswith(SUMMARY_PREFIX)
    same_loops(restored.state, await journal_state(journal, session.id))
    await restored.shutdown()


async def test_an_open_hustle_of_a_kind_that_cannot_resume_is_failed_on_restore() -> None:
    journal = MemoryJournal()
    rig = Rig(loops=[LoopDefinition(name="main", model=ScriptedModel([], default=Reply(text="hi")))], journal=journal)
    session = await rig.start_session()
    never = asyncio.Event()

    async def held() -> HustleResult:
        await never.wait()
        return HustleResult()

    hid = session.hustles.submit("classify", "background", held, on_end=lambda *_: None)
    async with asyncio.timeout(10):
        while hid not in session.state.hustles:
            await asyncio.sleep(0.005)
    session.abort()
    restored = await rig.restore_session(session.id)
    failed = [e for e in await _events(journal, session.id) if isinstance(e, HustleFailed)]
    assert [f.hustle_id for f in failed] == [hid] and restored.state.hustles == {}
    await restored.shutdown()


async def test_lanes_cap_concurrency_and_queue_and_record_every_end() -> None:
    recorded: list[object] = []

    async def record(event: object) -> None:
        recorded.append(event)
        lanes.apply(event)  # type: ignore[arg-type]

    lanes = HustleLanes(record, clock=SystemClock(), limits={"background": LaneLimits(concurrency=1, queue=1)})
    gate = asyncio.Event()
    ended: list[str] = []

    async def work() -> HustleResult:
        await gate.wait()
        return HustleResult(value="v", usage=Usage(input_tokens=3))

    def on_end(hid: str, outcome: object) -> None:
        ended.append(hid)

    first = lanes.submit("t", "background", work, on_end=on_end)
    second = lanes.submit("t", "background", work, on_end=on_end)
    with pytest.raises(HustleQueueFullError):
        lanes.submit("t", "background", work, on_end=on_end)
    assert lanes.submit("t", "blocking", work, on_end=on_end)  # the other lane has its own caps
    gate.set()
    async with asyncio.timeout(10):
        while len(ended) < 3:
            await asyncio.sleep(0.005)
    assert {first, second} <= set(ended)
    assert lanes.infos == {}
    assert sum(isinstance(e, HustleCompleted) for e in recorded) == 3
    await lanes.aclose()
