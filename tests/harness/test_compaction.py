"""Context compaction: past a threshold the model summarizes the oldest history; recent messages stay verbatim."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from loopd.harness import (
    EchoTool,
    LoopDefinition,
    MemoryJournal,
    ModelPermanentError,
    ModelRequest,
    Reply,
    Rig,
    ScriptedModel,
    ToolCall,
    Usage,
)
from loopd.harness.core import codec
from loopd.harness.core._values import Message
from loopd.harness.core.compaction import SUMMARIZER_PROMPT, SUMMARY_PREFIX, cut_point, render_transcript
from loopd.harness.core.events import HistoryCompacted, TurnDone

from .helpers import journal_state, same_loops

STEPS = 6


def _agent(*, fail_summary: bool = False) -> ScriptedModel:
    """Echoes ``STEPS`` times, then answers; writes a summary when asked to compact (or fails to)."""

    def script(request: ModelRequest) -> Reply:
        if request.system == SUMMARIZER_PROMPT:
            if fail_summary:
                return Reply(error=ModelPermanentError("summarizer unavailable"))
            assert len(request.messages) == 1 and request.messages[0].role == "user"
            return Reply(text="the user wants echoes; several were done", usage=Usage(input_tokens=7, calls=1))
        echoes = sum(1 for m in request.messages if m.role == "tool")
        if echoes < STEPS and not any(m.content.startswith(SUMMARY_PREFIX) for m in request.messages[:1]):
            return Reply(tool_calls=[("echo", {"text": "x" * 200})])  # usage: ~chars/4 of the request
        return Reply(text="finished")

    return ScriptedModel(script)


def _rig(model: ScriptedModel, *, threshold: int | None, block_at: int | None = None) -> Rig:
    # block_at = threshold: the turn waits for every compaction (the blocking lane); see test_hustles.py for the
    # background lane, where the turn goes on while the summary is written.
    loop = LoopDefinition(
        name="main",
        model=model,
        tools=(EchoTool(),),
        compact_at_tokens=threshold,
        compact_keep_recent=3,
        compact_block_at_tokens=threshold if block_at is None else block_at,
    )
    return Rig(loops=[loop], journal=MemoryJournal())


async def test_history_is_compacted_past_the_threshold_and_restores_identically() -> None:
    model = _agent()
    rig = _rig(model, threshold=120)
    session = await rig.start_session()
    done = await session.ask("echo a lot", timeout=10)
    assert isinstance(done, TurnDone) and done.text == "finished"

    records = await rig.journal.read(session.id)
    compactions = [
        e for e in (codec.decode(r.kind, r.version, r.data) for r in records) if isinstance(e, HistoryCompacted)
    ]
    assert compactions, "the context passed the threshold, a compaction was expected"
    first = compactions[0]
    assert first.summary == "the user wants echoes; several were done"
    assert first.usage.input_tokens == 7

    # The model call right after the compaction saw the summary first, then the kept recent messages verbatim.
    summarize_at = next(i for i, r in enumerate(model.requests) if r.system == SUMMARIZER_PROMPT)
    after = model.requests[summarize_at + 1]
    assert after.messages[0].content.startswith(SUMMARY_PREFIX)
    assert after.messages[0].content.endswith(first.summary)
    assert after.messages[1].role != "tool", "a tool result must never lose its assistant call"
    before = model.requests[summarize_at - 1].messages if summarize_at else ()
    assert len(after.messages) < len(before) + 3

    # The summarizer read a plain transcript of exactly the replaced prefix.
    transcript = model.requests[summarize_at].messages[0].content
    assert transcript.startswith("[user]\necho a lot")

    # Compaction usage is part of the turn's and the session's usage; restore folds to the same state.
    assert done.usage.input_tokens >= 7 + STEPS
    live = session.state
    await session.shutdown()
    rebuilt = await journal_state(rig.journal, session.id)
    same_loops(live, rebuilt)
    assert rebuilt.loops["main"].history[0].content.startswith(SUMMARY_PREFIX)


async def test_without_a_threshold_nothing_is_compacted() -> None:
    model = _agent()
    rig = _rig(model, threshold=None)
    async with rig.open_session() as session:
        done = await session.ask("echo a lot", timeout=10)
        assert isinstance(done, TurnDone)
    assert not any(r.system == SUMMARIZER_PROMPT for r in model.requests)


async def test_a_failed_summary_lets_the_call_go_out_uncompacted() -> None:
    model = _agent(fail_summary=True)
    rig = _rig(model, threshold=120)
    async with rig.open_session() as session:
        done = await session.ask("echo a lot", timeout=10)
        assert isinstance(done, TurnDone) and done.text == "finished"
        assert not session.state.loops["main"].history[0].content.startswith(SUMMARY_PREFIX)
    assert any(r.system == SUMMARIZER_PROMPT for r in model.requests)


def _history(roles: list[str]) -> list[Message]:
    out: list[Message] = []
    for i, role in enumerate(roles):
        if role == "call":
            out.append(Message(role="assistant", tool_calls=(ToolCall(id=f"c{i}", name="echo", arguments={}),)))
        elif role == "tool":
            out.append(Message(role="tool", content="r", tool_call_id=f"c{i}", name="echo"))
        else:
            out.append(Message(role=role, content=role))  # type: ignore[arg-type]
    return out


_turn = st.lists(st.sampled_from(["call-tools", "reply"]), max_size=4).map(
    lambda steps: (
        ["user"] + [r for s in steps for r in (["call", "tool", "tool"] if s == "call-tools" else ["assistant"])]
    )
)


@given(turns=st.lists(_turn, max_size=6), keep=st.integers(min_value=1, max_value=10))
def test_the_cut_never_orphans_a_tool_result(turns: list[list[str]], keep: int) -> None:
    history = _history([r for t in turns for r in t])
    cut = cut_point(history, keep)
    if cut == 0:
        return
    assert 2 <= cut <= len(history) - keep
    assert history[cut].role != "tool"


def test_transcript_shows_tool_calls_and_results() -> None:
    text = render_transcript(_history(["user", "call", "tool", "assistant"]))
    assert "[calls tool echo {}]" in text and "[tool result echo c2]" in text and text.startswith("[user]")
