"""The stored form of events (`loopd.harness.core.codec`): the compact form of a step's records, the JSON form
every older journal holds (still read), and the layouts' append-only rule."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from loopd.harness import JournalCorruptError, Usage
from loopd.harness.core import codec
from loopd.harness.core import events as ev
from loopd.harness.core._values import ToolCall, ToolOutcome
from loopd.harness.journal import Record, replay

# The layouts as first written (session 9). Entries may grow at their end; what is here must stay as it is.
FROZEN_NESTED = {
    "Usage": ("input_tokens", "output_tokens", "cached_tokens", "cost_usd", "calls"),
    "ToolCall": ("id", "name", "arguments"),
    "ToolOutcome": ("call_id", "name", "status", "output"),
    "QueuedInput": ("command_id", "text"),
}
FROZEN_LAYOUTS = {
    ("turn_started", 1): ("loop", "turn_id", ("inputs", "QueuedInput", True), "at"),
    ("input_queued", 1): ("loop", "command_id", "text"),
    ("inputs_folded", 1): ("loop", "turn_id", ("inputs", "QueuedInput", True)),
    ("model_replied", 1): (
        "loop",
        "turn_id",
        "step",
        "text",
        ("tool_calls", "ToolCall", True),
        ("usage", "Usage", False),
    ),
    ("tool_completed", 1): ("loop", "turn_id", "step", ("outcome", "ToolOutcome", False)),
    ("step_done", 1): ("loop", "turn_id", "step", ("usage", "Usage", False)),
    ("context_measured", 1): ("loop", "turn_id", "step", "tokens", "window", "at"),
    ("turn_done", 1): (
        "loop",
        "turn_id",
        "step",
        "text",
        ("step_usage", "Usage", False),
        ("usage", "Usage", False),
        "at",
    ),
    ("turn_failed", 1): (
        "loop",
        "turn_id",
        "error_type",
        "message",
        ("usage", "Usage", False),
        ("outcomes", "ToolOutcome", True),
        "at",
    ),
    ("turn_interrupted", 1): (
        "loop",
        "turn_id",
        "reason",
        ("usage", "Usage", False),
        ("outcomes", "ToolOutcome", True),
        "at",
    ),
}

USAGE = Usage(input_tokens=50, output_tokens=20, cached_tokens=3, cost_usd=0.25, calls=1)
CALL = ToolCall(id="call_1", name="echo", arguments={"text": "hi", "n": [1, 2.5, None, {"k": True}]})
OUTCOME = ToolOutcome(call_id="call_1", name="echo", status="ok", output="hi ✓")


def step_events() -> list[ev.LoopEvent]:
    """One of each compact kind, with every field away from its default."""
    queued = (ev.QueuedInput(command_id="c1", text="go"),)
    return [
        ev.TurnStarted(loop="main", turn_id="main/1", inputs=queued, at=1.5),
        ev.InputQueued(loop="main", command_id="c2", text="more"),
        ev.InputsFolded(loop="main", turn_id="main/1", inputs=queued),
        ev.ModelReplied(loop="main", turn_id="main/1", step=1, text="let me", tool_calls=(CALL,), usage=USAGE),
        ev.ToolCompleted(loop="main", turn_id="main/1", step=1, outcome=OUTCOME),
        ev.StepDone(loop="main", turn_id="main/1", step=1, usage=USAGE),
        ev.ContextMeasured(loop="main", turn_id="main/1", step=1, tokens=70, window=8000, at=2.0),
        ev.TurnDone(loop="main", turn_id="main/1", step=2, text="done", step_usage=USAGE, usage=USAGE, at=3.0),
        ev.TurnFailed(
            loop="main", turn_id="main/2", error_type="X", message="m", usage=USAGE, outcomes=(OUTCOME,), at=4.0
        ),
        ev.TurnInterrupted(loop="main", turn_id="main/3", reason="r", usage=USAGE, outcomes=(OUTCOME,), at=5.0),
    ]


def test_layouts_only_grow_at_their_end() -> None:
    """A layout is positions on disk: changing an entry (not appending one) would misread every stored record."""
    for name, frozen in FROZEN_NESTED.items():
        assert codec.NESTED[name][: len(frozen)] == frozen, f"NESTED[{name!r}] changed: only append to it"
    for key, frozen_layout in FROZEN_LAYOUTS.items():
        assert codec.LAYOUTS[key][: len(frozen_layout)] == frozen_layout, f"LAYOUTS[{key}] changed: only append"


def test_every_layout_of_a_current_version_names_exactly_its_fields() -> None:
    """Else that kind silently falls back to JSON: a field added to an event (or to Usage, ToolCall...) must be
    appended to its layout."""
    for (kind, version), layout in codec.LAYOUTS.items():
        cls = codec._STORED_TYPES[kind]
        if cls.version != version:
            continue
        names = {f if isinstance(f, str) else f[0] for f in layout}
        assert names == set(cls.model_fields) - {"kind"}, f"append the new fields of {kind} to its layout"
    for name, fields in codec.NESTED.items():
        assert set(fields) == set(codec._NESTED_TYPES[name].model_fields), f"append the new fields of {name}"


@pytest.mark.parametrize("event", step_events(), ids=lambda e: e.kind)
def test_a_step_record_is_compact_and_decodes_to_the_same_event(event: ev.LoopEvent) -> None:
    kind, version, data = codec.encode(event)
    assert data[0] == codec.COMPACT
    legacy = event.model_dump_json(exclude={"kind"}).encode()
    assert len(data) < len(legacy)
    assert codec.decode(kind, version, data) == event


@pytest.mark.parametrize("event", step_events(), ids=lambda e: e.kind)
def test_a_journal_written_before_the_compact_form_still_reads(event: ev.LoopEvent) -> None:
    """Older journals hold every record as JSON (what `encode` wrote before session 9)."""
    legacy = event.model_dump_json(exclude={"kind"}).encode()
    assert codec.decode(event.kind, event.version, legacy) == event


def test_a_step_takes_far_fewer_bytes_than_as_json() -> None:
    """The records of one tool step: what issue 18's storage figure is made of (about 960 → 560 bytes there)."""
    step = step_events()[3:7]
    compact = sum(len(codec.encode(e)[2]) for e in step)
    legacy = sum(len(e.model_dump_json(exclude={"kind"})) for e in step)
    assert compact < 0.7 * legacy


def test_a_value_messagepack_cannot_hold_is_written_as_json() -> None:
    event = ev.ModelReplied(
        loop="main",
        turn_id="main/1",
        step=1,
        text="",
        tool_calls=(ToolCall(id="c", name="big", arguments={"n": 2**70}),),
        usage=USAGE,
    )
    kind, version, data = codec.encode(event)
    assert json.loads(data)["tool_calls"][0]["arguments"]["n"] == 2**70
    assert codec.decode(kind, version, data) == event


def test_a_kind_without_a_layout_is_written_as_json() -> None:
    event = ev.SessionStarted(session_id="s", rig="r", loops=("main",), at=0.0)
    kind, version, data = codec.encode(event)
    assert data[:1] == b"{"
    assert codec.decode(kind, version, data) == event


@pytest.mark.parametrize(
    "data",
    [
        bytes((codec.COMPACT,)),  # nothing after the marker
        bytes((codec.COMPACT,)) + b"\xc1",  # not MessagePack
        bytes((codec.COMPACT, 0x81, 0xA1, 0x61, 0x01)),  # a map, not an array
        bytes((codec.COMPACT,)) + bytes([0x95]) + b"\xa4main" + b"\xa1t" + b"\x01" + b"\xa0" + b"\x05",  # bad calls
        bytes((codec.COMPACT,)) + bytes([0x9F]) + bytes(15 * [0xC0]),  # more values than the layout
    ],
)
def test_a_compact_record_that_does_not_decode_is_a_codec_error(data: bytes) -> None:
    with pytest.raises(codec.CodecError):
        codec.decode("model_replied", 1, data)
    with pytest.raises(JournalCorruptError):
        replay([Record("s", 1, "model_replied", 1, data, 0.0)])


def test_the_journal_guides_examples_run() -> None:
    """The Python blocks of docs/journal.md (the stored form of a record)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "journal.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/journal.md", "exec"), {"__name__": "docs_example"})
