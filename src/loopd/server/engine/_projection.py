"""Projection: adapter updates → AgentUE events on the call's visible message, and the replay hash chain. Pure.

Blocks a call writes into its message (one call per message):

    answer          text    created by one ``set``, then grown by ``append``s only: a preview appends the part of
                            its piece not shown yet, a `TextSet` the part of the durable text not shown yet; a
                            ``set`` rewrites it only where the shown text disagrees (a model call re-issued
                            after a crash that says something else)
    tool/<call id>  tool    ``name``, ``input`` and ``output`` (both clipped), ``status`` running → completed | failed
    question/<id>   ask     an ask_user question: its choices (if any) and free text; ``status`` pending → success
                            (``value`` = the answer), timeout (its deadline passed) or failure (the call ended first)
    gate/<gate id>  ask     choices approve / always / deny; ``status`` pending → success (``value`` = the answer),
                            timeout (closed unanswered, which the harness treats as deny) or failure (the call
                            ended first)
    result          result  the final answer: ``format`` text | json, ``content``

Events are computed from the message's current content (its stored, folded event log: what was emitted so far,
across crashes and replicas), so applying an update twice yields no second change.
`ModelCalled` and `Failed` change nothing visible (the ledger records the former; the owner finishes the
message after the latter). Must not do: I/O, or write anything (the engine emits the events).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from loopd.agentue import InlineBlock, Model
from loopd.server.storage import canonical_json

from ._adapter import (
    Failed,
    Finished,
    GateOpened,
    GateResolved,
    ModelCalled,
    QuestionAsked,
    QuestionClosed,
    TextPreview,
    TextSet,
    ToolFinished,
    ToolStarted,
    Update,
    update_json,
)

ANSWER_BLOCK: Final = "answer"
RESULT_BLOCK: Final = "result"
MAX_TOOL_OUTPUT: Final = 8000
GATE_CHOICES: Final = (
    {"value": "approve", "label": "Approve", "description": "Allow this once."},
    {"value": "always", "label": "Always allow", "description": "Allow it now and remember for this workspace."},
    {"value": "deny", "label": "Deny", "description": "Do not allow it."},
)

Event = dict[str, Any]


def tool_block_id(call_id: str) -> str:
    return f"tool/{call_id}"


def gate_block_id(gate_id: str) -> str:
    return f"gate/{gate_id}"


Content = Mapping[str, Any] | Model
"""A message's content: its stored JSON, or the model a drive holds (`loopd.server.streams.StreamStates`), which
answers a block by id without visiting the others."""


def _blocks(content: Content) -> dict[str, dict[str, Any]]:
    """Every block of ``content`` by id (shallow copies)."""
    if isinstance(content, Model):
        return {block.id: _copied(block) for block in content.blocks}
    found: dict[str, dict[str, Any]] = {}
    for block in content.get("blocks") or ():
        if isinstance(block, Mapping) and isinstance(block.get("id"), str):
            found[block["id"]] = dict(block)
    return found


def _copied(block: Any) -> dict[str, Any]:
    return dict(block.view) if isinstance(block, InlineBlock) else dict(block.to_json())


def _block(content: Content, block_id: str) -> dict[str, Any] | None:
    """One block of ``content`` (a shallow copy), or None."""
    if isinstance(content, Model):
        found = content.block(block_id)
        return None if found is None else _copied(found)
    for block in content.get("blocks") or ():
        if isinstance(block, Mapping) and block.get("id") == block_id:
            return dict(block)
    return None


def _set(block: dict[str, Any]) -> Event:
    return {"op": "set", "block": block}


def _answer_block(text: str) -> dict[str, Any]:
    return {"id": ANSWER_BLOCK, "type": "text", "content": text}


def shown_answer(content: Content) -> str | None:
    """The answer text the message shows (None: no answer block yet, or one that is not a text block)."""
    block = _block(content, ANSWER_BLOCK)
    if block is None or block.get("type") != "text" or not isinstance(block.get("content"), str):
        return None
    return str(block["content"])


def _show(shown: str | None, text: str) -> list[Event]:
    """Events that make the answer block show ``text``: nothing, the missing suffix, or (first / rewrite) a set."""
    if (shown or "") == text:
        return []
    if shown is not None and text.startswith(shown):
        suffix = text[len(shown) :]
        return [
            {"op": "append", "mask": "block.content", "block": {"id": ANSWER_BLOCK, "type": "text", "content": suffix}}
        ]
    return [_set(_answer_block(text))]


def _preview(text: str, offset: int | None, shown: str | None) -> list[Event]:
    current = shown or ""
    at = len(current) if offset is None else offset
    if not text or at > len(current):
        return []  # a gap before this piece: the durable text fills it in
    overlap = current[at:]
    if text.startswith(overlap):
        return _show(shown, current + text[len(overlap) :])
    if overlap.startswith(text):
        return []  # shown already
    return _show(shown, current[:at] + text)  # the shown text says something else from here: one rewrite


def merge_previews(previews: list[TextPreview]) -> list[TextPreview]:
    """Consecutive previews joined where each continues the one before (same result, fewer events)."""
    merged: list[TextPreview] = []
    for preview in previews:
        if merged:
            last = merged[-1]
            if last.offset is None and preview.offset is None:
                merged[-1] = TextPreview(last.text + preview.text)
                continue
            if last.offset is not None and preview.offset == last.offset + len(last.text):
                merged[-1] = TextPreview(last.text + preview.text, offset=last.offset)
                continue
        merged.append(preview)
    return merged


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TOOL_OUTPUT else text[:MAX_TOOL_OUTPUT] + "…"


def _clip_input(value: Any) -> Any:
    """Tool input as given, or its JSON text clipped when it is large (the ledger keeps it whole)."""
    text = canonical_json(value).decode("utf-8")
    return value if len(text) <= MAX_TOOL_OUTPUT else _clip(text)


def ask_block(gate_id: str, prompt: str, title: str, call_id: str | None = None) -> dict[str, Any]:
    """A gate as an ``ask`` block; ``call_id`` says where to answer (``POST /v1/harness/calls/<id>/gates/...``)."""
    return {
        "id": gate_block_id(gate_id),
        "type": "ask",
        **({"call_id": call_id} if call_id else {}),
        "title": title,
        "prompt": prompt or "The harness asks for permission.",
        "choices": [dict(choice) for choice in GATE_CHOICES],
        "status": "pending",
    }


def question_block_id(request_id: str) -> str:
    return f"question/{request_id}"


def question_ask_block(update: QuestionAsked, call_id: str | None = None) -> dict[str, Any]:
    """An ask_user question as an ``ask`` block (answered at ``POST /v1/harness/calls/<id>/questions/...``)."""
    return {
        "id": question_block_id(update.request_id),
        "type": "ask",
        **({"call_id": call_id} if call_id else {}),
        "title": "The harness asks",
        "prompt": update.question,
        "choices": [{"value": choice, "label": choice} for choice in update.choices],
        "allow_other": True,
        "status": "pending",
    }


def answered_ask(block: Mapping[str, Any], answer: str) -> dict[str, Any]:
    """The ask block after a human answer (or the harness's resolution): ``success`` with the answer."""
    body = {key: value for key, value in block.items() if key not in ("value", "reason")}
    return {**body, "status": "success", "value": answer}


def project(update: Update, content: Content, *, call_id: str | None = None) -> list[Event]:
    """The set / append events (without ``seq``) that show ``update`` in a message whose content is ``content``."""
    match update:
        case TextPreview(text=text, offset=offset):
            return _preview(text, offset, shown_answer(content))
        case TextSet(text=text):
            return _show(shown_answer(content), text)
        case ToolStarted(call_id=call_id, name=name, input=arguments):
            return [
                _set(
                    {
                        "id": tool_block_id(call_id),
                        "type": "tool",
                        "name": name,
                        "input": _clip_input(arguments),
                        "status": "running",
                    }
                )
            ]
        case ToolFinished(call_id=call_id, name=name, status=status, output=output):
            block_id = tool_block_id(call_id)
            base = _block(content, block_id) or {"id": block_id, "type": "tool", "name": name}
            return [_set({**base, "status": status, "output": _clip(output)})]
        case GateOpened(gate_id=gate_id, prompt=prompt, title=title):
            current = _block(content, gate_block_id(gate_id))
            if current is not None and current.get("status") != "pending":
                return []  # answered already (the answer reached the block before the harness reported the gate)
            return [_set(ask_block(gate_id, prompt, title, call_id))]
        case GateResolved(gate_id=gate_id, answer=answer, timed_out=timed_out):
            block_id = gate_block_id(gate_id)
            base = _block(content, block_id) or ask_block(gate_id, "", "Permission needed", call_id)
            if timed_out:
                body = {key: value for key, value in base.items() if key != "value"}
                resolved = {**body, "status": "timeout"}
            else:
                resolved = answered_ask(base, answer)
            return [] if resolved == base else [_set(resolved)]
        case QuestionAsked(request_id=request_id):
            current = _block(content, question_block_id(request_id))
            if current is not None and current.get("status") != "pending":
                return []  # answered already (the answer reached the block before the harness reported it)
            return [] if current is not None else [_set(question_ask_block(update, call_id))]
        case QuestionClosed(request_id=request_id, answer=answer, timed_out=timed_out):
            asked = _block(content, question_block_id(request_id))
            if asked is None:
                return []
            if timed_out:
                closed = {**{k: v for k, v in asked.items() if k != "value"}, "status": "timeout"}
            else:
                closed = answered_ask(asked, answer)
            return [] if closed == asked else [_set(closed)]
        case Finished(content=result, format=form):
            return [_set({"id": RESULT_BLOCK, "type": "result", "format": form, "content": result})]
        case ModelCalled() | Failed():
            return []


def closed_gates(content: Content, reason: str) -> list[Event]:
    """Events that close every gate still pending in ``content`` (the call ended first): status ``failure``."""
    events: list[Event] = []
    for block_id, block in _blocks(content).items():
        pending = block.get("type") == "ask" and block.get("status") == "pending"
        if pending and block_id.startswith(("gate/", "question/")):
            events.append(_set({**block, "status": "failure", "reason": reason}))
    return events


def next_hash(previous: str, update: Update) -> str:
    """The replay hash after ``update``: ``sha256:<hex>`` of the previous hash and the update's canonical JSON."""
    digest = hashlib.sha256(previous.encode("utf-8") + b"\n" + canonical_json(update_json(update)))
    return "sha256:" + digest.hexdigest()
