"""Property: whatever order live text fragments, step commits and resumes come in, the answer block's stored
events are one ``set`` followed by ``append``s whose concatenation is the durable answer text.

A simulated harness turn (steps with texts, streamed in chunks with their offsets) runs through the real
`HarnessTranslator`, the engine's checkpoint rule and the real projection, folded with the AgentUE reducer.
The subscriber may lose any live fragment, receive one late (after later step commits: the journal catch-up),
and the run may crash at any point: then the harness is restored from its journal and re-issues the model call
in flight from its start (or only the observer restarts and the harness goes on). Only a re-issued model call
that says something else than what was shown may rewrite the block — once per re-issue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, note, settings
from hypothesis import strategies as st

from loopd.agentue import StreamState, fold, reduce
from loopd.harness.core._values import Usage
from loopd.harness.core.events import (
    ModelReplied,
    SessionRestored,
    SessionStarted,
    TokenDelta,
    TurnDone,
    TurnStarted,
)
from loopd.server.engine import TextPreview, TextSet, Update
from loopd.server.engine._projection import merge_previews, project
from loopd.server.engine._translation import HarnessTranslator
from loopd.server.streams import empty_model

TURN = "main/1"
ZERO = Usage()
Event = Any


def _reply(step: int, text: str, last: bool) -> Event:
    if last:
        return TurnDone(loop="main", turn_id=TURN, step=step, text=text, step_usage=ZERO, usage=ZERO, at=0.0)
    return ModelReplied(loop="main", turn_id=TURN, step=step, text=text, tool_calls=(), usage=ZERO)


@dataclass
class Message:
    """The call's message: its stored events, folded."""

    state: StreamState = field(default_factory=lambda: fold([{"op": "start", "seq": 1, "model": empty_model()}]))
    answer_ops: list[tuple[str, str]] = field(default_factory=list)

    def apply(self, update: Update) -> None:
        model = self.state.model
        assert model is not None
        for event in project(update, model.to_json(), call_id="call"):
            seq = (self.state.seq or 1) + 1
            self.state = reduce(self.state, {**event, "seq": seq})
            if event["block"].get("id") == "answer":
                self.answer_ops.append((event["op"], event["block"]["content"]))

    def answer(self) -> str:
        model = self.state.model
        assert model is not None
        blocks = [b for b in model.to_json()["blocks"] if b["id"] == "answer"]
        return str(blocks[0]["content"]) if blocks else ""


@dataclass
class Engine:
    """The drive's rule: durable updates counted (a replay skips those at or below the checkpoint), previews
    shown unless the replay has not reached the checkpoint yet."""

    message: Message
    applied: list[Update] = field(default_factory=list)

    def run(self, delivered: list[Event], batch: list[bool]) -> None:
        translator = HarnessTranslator(model_name="m", main_loop="main")
        index = 0
        pending: list[TextPreview] = []

        def flush() -> None:
            for preview in merge_previews(pending):
                self.message.apply(preview)
            pending.clear()

        for position, event in enumerate(delivered):
            for update in translator.feed(event):
                if isinstance(update, TextPreview):
                    if index >= len(self.applied):
                        pending.append(update)
                        if not batch[position % len(batch)]:
                            flush()
                    continue
                flush()
                index += 1
                if index <= len(self.applied):
                    assert self.applied[index - 1] == update  # the replay yields the same durable updates
                    continue
                self.message.apply(update)
                self.applied.append(update)
        flush()


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    pieces = st.sampled_from(["a", "b", " ", "\n", "ab ", "é"])
    texts = draw(st.lists(st.lists(pieces, max_size=6).map("".join), min_size=1, max_size=4))
    others = draw(st.lists(st.lists(pieces, max_size=6).map("".join), min_size=len(texts), max_size=len(texts)))
    diverge = draw(st.booleans())
    crashes = draw(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40), st.booleans()), max_size=3))
    return {
        "texts": texts,
        "alternatives": others if diverge else texts,
        "diverge": diverge,
        "chunk": draw(st.integers(1, 4)),
        "crashes": crashes,
        "fates": draw(st.lists(st.integers(-1, 3), min_size=1, max_size=30)),
        "batch": draw(st.lists(st.booleans(), min_size=1, max_size=8)),
    }


def _stream(step: int, text: str, chunk: int, start: int = 0) -> list[Event]:
    return [
        TokenDelta(loop="main", turn_id=TURN, step=step, text=text[at : at + chunk], offset=at)
        for at in range(start, len(text), chunk)
    ]


def _deliver(published: list[Event], fates: list[int], counter: list[int]) -> list[Event]:
    """The subscriber's view: every stored event in order; each live fragment dropped (fate -1) or delivered
    after ``fate`` more stored events (never before an earlier fragment)."""
    stored_seen = 0
    waiting: list[tuple[int, Event]] = []
    delivered: list[Event] = []
    floor = 0
    for event in published:
        if isinstance(event, TokenDelta):
            fate = fates[counter[0] % len(fates)]
            counter[0] += 1
            if fate >= 0:
                floor = max(floor, stored_seen + fate)
                waiting.append((floor, event))
            continue
        stored_seen += 1
        while waiting and waiting[0][0] < stored_seen:
            delivered.append(waiting.pop(0)[1])
        delivered.append(event)
    delivered.extend(event for _, event in waiting)
    return delivered


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_the_answer_is_one_set_then_appends_whatever_the_interleaving(scenario: dict[str, Any]) -> None:
    note(repr(scenario))
    texts: list[str] = scenario["texts"]
    chunk: int = scenario["chunk"]
    last = len(texts)
    journal: list[Event] = [
        SessionStarted(session_id="call", rig="r", loops=("main",), at=0.0),
        TurnStarted(loop="main", turn_id=TURN, inputs=(), at=0.0),
    ]
    message = Message()
    engine = Engine(message)
    counter = [0]
    spoken = dict(enumerate(texts, start=1))
    reissues = 0
    crashes = list(scenario["crashes"])

    def from_step(first: int) -> list[Event]:
        events: list[Event] = []
        for current in range(first, last + 1):
            events += _stream(current, spoken[current], chunk)
            events.append(_reply(current, spoken[current], current == last))
        return events

    remaining = from_step(1)  # what the harness publishes from here on
    while True:
        crash = crashes.pop(0) if crashes else None
        cut = len(remaining) if crash is None else min(crash[0], len(remaining))
        live = remaining[:cut]
        tail = _deliver(live, scenario["fates"], counter)
        seen = len(tail) if crash is None else min(crash[1], len(tail))
        engine.run(journal + tail[:seen], scenario["batch"])
        journal += [event for event in live if not isinstance(event, TokenDelta)]
        if crash is None:
            break
        step = max((e.step for e in journal if isinstance(e, ModelReplied | TurnDone)), default=0) + 1
        if step > last:
            remaining = []  # the turn ended before the crash; the next observer replays the journal
        elif crash[2]:  # the harness restarts too: the model call in flight is re-issued from its start
            journal.append(SessionRestored(from_seq=len(journal), mode="resume", at=0.0))
            spoken[step] = scenario["alternatives"][step - 1]
            remaining = from_step(step)
            reissues += 1
        else:  # only the observer restarted: the harness goes on (what it says meanwhile may be missed)
            remaining = remaining[cut:]

    final = next((u.text for u in reversed(engine.applied) if isinstance(u, TextSet)), "")
    durable = "\n\n".join(spoken[s] for s in range(1, last + 1) if spoken[s].strip())
    assert final == durable
    assert message.answer() == durable
    ops = message.answer_ops
    if not ops:
        assert durable == ""
        return
    assert ops[0][0] == "set"
    rewrites = sum(1 for op, _ in ops[1:] if op == "set")
    if not scenario["diverge"]:
        assert rewrites == 0, ops
        assert ops[0][1] + "".join(piece for _, piece in ops[1:]) == durable
    else:
        assert rewrites <= reissues, ops
