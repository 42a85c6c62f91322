"""Frames: a storage helper that splits one block's JSON into ordered pieces and joins them back. Pure.

A frame is `{id, block_id, seq, total, data}`: `seq` is the 0-based piece index (unrelated to event seq), `total`
the number of pieces and `data` a piece of the block's JSON text. Frames are not renderable and the reducer never
reassembles them; a store does, and reassembly checks identity (one `block_id`), one `total`, unique frame ids and
full coverage of 0..total-1. Frames do not nest: the reassembled block is never itself a frame.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from loopd.agentue._errors import AgentUEValidationError
from loopd.agentue._json import JsonObject, checked_object, describe, dumps, is_nonempty_str, loads
from loopd.agentue._model import Block, InlineBlock, block_json, parse_block

FRAME_FIELDS = ("id", "block_id", "seq", "total", "data")
FRAME_TYPE = "frame"


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Frame:
    """One piece of a block's JSON text."""

    id: str
    block_id: str
    seq: int
    total: int
    data: str

    def __post_init__(self) -> None:
        for name in ("id", "block_id"):
            if not is_nonempty_str(getattr(self, name)):
                raise AgentUEValidationError(
                    f"frame.{name}", f"must be a non-empty string, not {describe(getattr(self, name))}"
                )
        if not _count(self.total) or self.total < 1:
            raise AgentUEValidationError("frame.total", f"must be an integer >= 1, not {self.total!r}")
        if not _count(self.seq) or not 0 <= self.seq < self.total:
            raise AgentUEValidationError("frame.seq", f"must be an integer in 0..{self.total - 1}, not {self.seq!r}")
        if not isinstance(self.data, str):
            raise AgentUEValidationError("frame.data", f"must be a string, not {describe(self.data)}")

    @classmethod
    def from_json(cls, data: Any) -> Frame:
        obj = checked_object(data, "frame")
        missing = [name for name in FRAME_FIELDS if name not in obj]
        unknown = sorted(set(obj) - set(FRAME_FIELDS))
        if missing or unknown:
            raise AgentUEValidationError(
                "frame", f"a frame is exactly {{{', '.join(FRAME_FIELDS)}}} (missing {missing}, unknown {unknown})"
            )
        return cls(**obj)

    def to_json(self) -> JsonObject:
        return {"id": self.id, "block_id": self.block_id, "seq": self.seq, "total": self.total, "data": self.data}


def split_block(
    block: Block | Mapping[str, Any],
    *,
    max_chars: int,
    frame_id: Callable[[str, int], str] | None = None,
) -> tuple[Frame, ...]:
    """Split a block's compact JSON into pieces of at most `max_chars` characters.

    Frame ids default to `<block_id>#<seq>`; pass `frame_id(block_id, seq)` to choose them.
    """
    if not _count(max_chars) or max_chars < 1:
        raise AgentUEValidationError("max_chars", f"must be an integer >= 1, not {max_chars!r}")
    parsed = parse_block(block_json(block))
    if isinstance(parsed, InlineBlock) and parsed.type == FRAME_TYPE:
        raise AgentUEValidationError("block.type", "frames do not nest: a frame cannot be split into frames")
    text = dumps(parsed.to_json())
    pieces = [text[start : start + max_chars] for start in range(0, len(text), max_chars)]
    name = frame_id or (lambda block_id, seq: f"{block_id}#{seq}")
    return tuple(
        Frame(id=name(parsed.id, seq), block_id=parsed.id, seq=seq, total=len(pieces), data=piece)
        for seq, piece in enumerate(pieces)
    )


def join_frames(frames: Iterable[Frame | Mapping[str, Any]]) -> Block:
    """Reassemble one block from its frames, in any order; every inconsistency raises `AgentUEValidationError`."""
    parts = [frame if isinstance(frame, Frame) else Frame.from_json(frame) for frame in frames]
    if not parts:
        raise AgentUEValidationError("frames", "there are no frames to join")
    block_ids = sorted({frame.block_id for frame in parts})
    if len(block_ids) > 1:
        raise AgentUEValidationError("frames", f"frames of different blocks cannot be joined: {block_ids}")
    totals = sorted({frame.total for frame in parts})
    if len(totals) > 1:
        raise AgentUEValidationError("frames", f"frames disagree on total: {totals}")
    ids = [frame.id for frame in parts]
    if len(set(ids)) != len(ids):
        raise AgentUEValidationError("frames", "frame ids are not unique")
    total = totals[0]
    by_seq: dict[int, Frame] = {}
    for frame in parts:
        if frame.seq in by_seq:
            raise AgentUEValidationError("frames", f"piece {frame.seq} appears twice")
        by_seq[frame.seq] = frame
    missing = [seq for seq in range(total) if seq not in by_seq]
    if missing:
        raise AgentUEValidationError("frames", f"pieces {missing} of {total} are missing")
    text = "".join(by_seq[seq].data for seq in range(total))
    block = parse_block(loads(text, "frames"), "frames")
    if block.id != block_ids[0]:
        raise AgentUEValidationError("frames", f"the joined block has id {block.id!r}, not {block_ids[0]!r}")
    if isinstance(block, InlineBlock) and block.type == FRAME_TYPE:
        raise AgentUEValidationError("frames", "frames do not nest: the joined block is itself a frame")
    return block
