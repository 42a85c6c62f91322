"""A message's visible stream: AgentUE events stored in order, the folded snapshot kept in ``messages.content``.

Every writer of visible content (the chat flow, the Harness Engine's projection, Human requests, operators'
emits) goes through these functions inside a transaction, so for every message:

* its events are ``start`` (seq 1, the initial model), then ``set`` / ``append`` / ``error`` events, then ``end``;
* a read of ``messages.content`` always gives the fold of its stored events (the AgentUE reducer), and
  ``messages.revision`` grows with every change. A writer that keeps the stream's state (`emit_held`) stores a
  long answer's content as a snapshot plus a tail of events (`Messages.advance`; reads fold the tail): a new
  snapshot is written once the tail holds more than one event per ``BLOCKS_PER_TAIL_EVENT`` blocks of the
  content (at most ``MAX_TAIL`` events), so an event costs about the same however long the answer has grown;
* a terminal message (``end`` stored, status completed / failed / cancelled / expired) takes no more events.

Readers follow a conversation by its cursor (``read_conversation_events``), which orders events of all its messages
in commit order; `ConversationBus` only wakes them. Callers pass ``bus`` so a commit wakes the readers (`emit` also
hands the events it stored to this process's live feed, `ConversationBus.committed`).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal

from loopd.agentue import (
    AgentUEError,
    EndEvent,
    ErrorEvent,
    Model,
    PingEvent,
    StartEvent,
    StreamState,
    event_from_json,
    reduce,
)
from loopd.server.storage import (
    UNSET,
    Conflict,
    InvalidRecord,
    Message,
    MessageEvent,
    MessageHead,
    NewMessage,
    Transaction,
    Unset,
)
from loopd.server.streams._bus import CommittedStates, ConversationBus

MAX_TAIL: Final = 128
"""The most events a stored snapshot is behind its message's last event (reads fold them)."""
BLOCKS_PER_TAIL_EVENT: Final = 4
"""A tail may hold one event per this many blocks of content: an answer of a few blocks is stored whole every time
(its size is not known without encoding it, which is what a tail saves; blocks stand for it)."""

TerminalStatus = Literal["completed", "failed", "cancelled", "expired"]
TERMINAL_STATUSES: Final = frozenset({"completed", "failed", "cancelled", "expired"})
HUMAN_BLOCK_TYPES: Final = frozenset({"ask", "confirm", "human_reply"})


def empty_model(biz: str = "loopd.chat") -> dict[str, Any]:
    return {"version": "1.1", "biz": biz, "meta": {}, "blocks": []}


def _checked_model(content: Mapping[str, Any]) -> Model:
    try:
        return Model.from_json(dict(content))
    except AgentUEError as exc:
        raise InvalidRecord(f"content is not an AgentUE model: {exc}") from exc


def _hand_over(
    tx: Transaction,
    bus: ConversationBus,
    conversation_id: str,
    stored: Sequence[MessageEvent],
    *headers_of: Message,
) -> None:
    """After the commit: wake the readers and hand ``stored`` to this process's live feed (no read-back), with
    ``headers_of``, the messages as this commit left them, for their ``start`` / ``end`` events. Only once it surely
    committed: when its outcome is unknown the readers are only woken (they read the log)."""
    handed = tuple(stored)
    headers = {header.id: header for header in headers_of}

    def after() -> None:
        if tx.outcome_unknown:
            bus.notify(conversation_id)
        else:
            bus.committed(conversation_id, handed, headers)

    tx.after_commit(after)


async def open_message(
    tx: Transaction,
    new: NewMessage,
    *,
    bus: ConversationBus | None = None,
    events: list[MessageEvent] | None = None,
) -> Message:
    """Insert a message and its ``start`` event (seq 1). A message created as ``completed`` also gets ``end``.
    ``events``: the stored events are added to it (a caller that shows them without reading them back)."""
    (message,) = await open_messages(tx, (new,), bus=bus, events=events)
    return message


async def open_messages(
    tx: Transaction,
    news: Sequence[NewMessage],
    *,
    bus: ConversationBus | None = None,
    events: list[MessageEvent] | None = None,
) -> list[Message]:
    """`open_message` for messages of one conversation stored together (a question's input and its response), in
    order: their opening events take one advance of the conversation's cursor and one insert."""
    messages: list[Message] = []
    opened: list[tuple[Message, list[tuple[int, dict[str, Any]]]]] = []
    for new in news:
        checked = _checked_model(new.content)  # validated once: the row's content and the start event's model
        model = checked.to_json()
        message = await tx.messages.insert(
            NewMessage(
                conversation_id=new.conversation_id,
                kind=new.kind,
                key=new.key,
                purpose=new.purpose,
                content=model,
                task_id=new.task_id,
                reply_to_message_id=new.reply_to_message_id,
                status=new.status,
                human_due_at=new.human_due_at,
                id=new.id,
            )
        )
        opening = [(1, StartEvent(seq=1, model=checked).to_json())]
        if message.status in TERMINAL_STATUSES:
            opening.append((2, EndEvent(seq=2).to_json()))
        messages.append(message)
        opened.append((message, opening))
    stored = await tx.message_events.append_openings(opened)
    if bus is not None and messages:
        _hand_over(tx, bus, messages[0].conversation_id, stored, *messages)
    if events is not None:
        events.extend(stored)
    return messages


async def state_of(tx: Transaction, message: Message) -> StreamState:
    seq = await tx.message_events.last_seq(message.id)
    return StreamState.of(message.content, seq=seq or None)


class StreamStates:
    """The stream states a writer left in messages it keeps writing (a harness call's drive), by message id and
    revision: `emit` starts from one instead of rebuilding it from the stored snapshot (a full decode and
    validation of the whole answer, for every batch of events — a cost that grew with the answer).

    A state the writer's own open transaction made (`hold`) answers only inside that transaction; once it has
    surely committed it answers everyone at the exact revision it was made at (every write of a message bumps its
    revision), so a rolled-back, possibly-committed or foreign write never answers for another. A state whose
    content is not stored yet (`emit_held` with ``store=False``, before `store_held`) answers inside its
    transaction only, and never after it. The newest ``limit`` messages are kept. ``shared``: the process's
    `CommittedStates`, also told of every state committed here (for the message's next writer, e.g. its end)."""

    def __init__(
        self,
        limit: int = 16,
        *,
        seed: Callable[[str, int], StreamState | None] | None = None,
        shared: CommittedStates | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self._limit = limit
        self._seed = seed  # the state of a message this writer has not written yet, at a revision (or None)
        self._shared = shared
        self._states: OrderedDict[str, tuple[int, StreamState]] = OrderedDict()
        # message id → (transaction, revision, state, content stored, the seq the stored content folds)
        self._pending: OrderedDict[str, tuple[weakref.ref[Transaction], int, StreamState, bool, int]] = OrderedDict()

    def get(self, message: Message | MessageHead, tx: Transaction | None = None) -> StreamState | None:
        """The state of ``message`` at its current revision, if this writer made it (in ``tx``, or committed)."""
        if tx is not None:
            pending = self._pending.get(message.id)
            if pending is not None and pending[0]() is tx and pending[1] == message.revision:
                return pending[2]
        found = self._states.get(message.id)
        if found is None or found[0] != message.revision:
            return None if self._seed is None else self._seed(message.id, message.revision)
        self._states.move_to_end(message.id)
        return found[1]

    def unsaved(self, message_id: str, tx: Transaction) -> tuple[StreamState, int] | None:
        """The state ``tx`` holds for the message whose content it has not stored yet, and the seq the stored
        content folds; None when there is none."""
        pending = self._pending.get(message_id)
        if pending is None or pending[0]() is not tx or pending[3]:
            return None
        return pending[2], pending[4]

    def put(self, message: Message | MessageHead, state: StreamState) -> None:
        """``state`` is what ``message`` (at its revision) holds, committed."""
        self._states[message.id] = (message.revision, state)
        if self._shared is not None:
            self._shared.put(message.id, message.revision, state)
        self._states.move_to_end(message.id)
        while len(self._states) > self._limit:
            self._states.popitem(last=False)

    def hold(
        self,
        tx: Transaction,
        message: Message | MessageHead,
        state: StreamState,
        *,
        stored: bool = True,
        base: int = 0,
    ) -> None:
        """``state`` is what ``message`` holds at its revision inside ``tx``: it answers there at once, and (when
        its content is ``stored``, as a snapshot or with a tail) for everyone once ``tx`` has surely committed.
        ``base``: for a state not ``stored``, the last seq the stored content folds."""
        self._pending[message.id] = (weakref.ref(tx), message.revision, state, stored, base)
        self._pending.move_to_end(message.id)
        while len(self._pending) > self._limit:
            self._pending.popitem(last=False)
        if not stored:
            return

        def committed() -> None:
            held = self._pending.get(message.id)
            if held is not None and held[0]() is tx:
                del self._pending[message.id]
                if held[2] is not state:  # a later hold of this transaction replaced it (and decides for itself)
                    return
            if not tx.outcome_unknown:
                self.put(message, state)

        tx.after_commit(committed)


def _append(
    state: StreamState, seq: int, events: Sequence[Mapping[str, Any]], allow_human_blocks: bool
) -> tuple[StreamState, list[tuple[int, dict[str, Any]]]]:
    """Fold ``events`` into ``state``, numbering them after ``seq``; the new state and the events to store."""
    stored: list[tuple[int, dict[str, Any]]] = []
    for raw in events:
        body = dict(raw)
        body["seq"] = seq + 1
        body.pop("stream_id", None)
        try:
            event = event_from_json(body)
        except AgentUEError as exc:
            raise InvalidRecord(f"not an AgentUE event: {exc}") from exc
        if isinstance(event, PingEvent):
            continue
        if isinstance(event, StartEvent | EndEvent):
            raise InvalidRecord(f"'{event.op}' events are managed by the server; send set, append or error")
        if not allow_human_blocks:
            _refuse_human(body)
        try:
            state = reduce(state, event)
        except AgentUEError as exc:
            raise InvalidRecord(f"event rejected: {exc}") from exc
        seq += 1
        stored.append((seq, event.to_json()))
    return state, stored


async def locked_state(tx: Transaction, message_id: str, states: StreamStates) -> tuple[MessageHead, StreamState]:
    """Lock a message (`Messages.lock_head`) and its stream state: the one ``states`` holds for its revision, else
    rebuilt from the stored snapshot (and then held for the rest of ``tx``)."""
    head = await tx.messages.lock_head(message_id)
    state = states.get(head, tx)
    if state is None:
        state = await state_of(tx, await tx.messages.get(message_id))
        states.hold(tx, head, state)
    return head, state


async def emit(
    tx: Transaction,
    message_id: str,
    events: Sequence[Mapping[str, Any]],
    *,
    bus: ConversationBus | None = None,
    allow_human_blocks: bool = False,
    states: StreamStates | None = None,
) -> tuple[Message, list[MessageEvent]]:
    """Append ``set`` / ``append`` / ``error`` events (their ``seq`` is assigned here) and refresh the snapshot.

    Raises ``InvalidRecord`` for anything that is not such an event or that the reducer rejects, and ``Conflict``
    when the message is terminal. ``ping`` events are accepted and not stored. ``states``: a writer's cache of the
    states it left (see `StreamStates`).
    """
    message = await tx.messages.lock(message_id)
    if message.status in TERMINAL_STATUSES:
        raise Conflict(f"message {message_id} is {message.status}; its stream has ended")
    state = (states.get(message, tx) if states is not None else None) or await state_of(tx, message)
    last = state.seq or 0  # what the message holds under its lock: a state is made for its revision only
    state, appended = _append(state, last, events, allow_human_blocks)
    stored = [
        event for event, _ in await tx.message_events.append_many(message_id, appended, locked=message, last_seq=last)
    ]
    if stored:
        assert state.model is not None
        message = await tx.messages.update(
            message_id, expected_revision=message.revision, content=state.model.to_json()
        )
        if bus is not None:
            _hand_over(tx, bus, message.conversation_id, stored)
        if states is not None:
            states.hold(tx, message, state)
    return message, stored


async def emit_held(
    tx: Transaction,
    message_id: str,
    events: Sequence[Mapping[str, Any]],
    *,
    states: StreamStates,
    bus: ConversationBus | None = None,
    allow_human_blocks: bool = False,
    store: bool = True,
) -> tuple[MessageHead, StreamState, list[MessageEvent]]:
    """`emit` for a writer that keeps the stream's state (``states``): it neither reads nor returns the content as
    JSON. The message row is locked without its content, the events fold into the held state, and the new content
    is stored as the model's `json_text` (each block encoded once in its life), so an event costs about the same
    however long the answer has grown. Returns the message's head, its state and the stored events; the same
    errors as `emit`.

    ``store=False`` stores the events but not yet the content: a writer emitting several times in one transaction
    stores the content once, with `store_held`, which it must call before the transaction ends (and before anyone
    else in the transaction reads or writes the message)."""
    head, state = await locked_state(tx, message_id, states)
    if head.status in TERMINAL_STATUSES:
        raise Conflict(f"message {message_id} is {head.status}; its stream has ended")
    unsaved = states.unsaved(message_id, tx)
    # The last seq the stored content folds: the row's tail start, else (no tail) every event stored before this
    # transaction's first unsaved emit.
    base = head.content_seq if head.content_seq is not None else unsaved[1] if unsaved else (state.seq or 0)
    last = state.seq or 0  # what the message holds under its lock (see `emit`)
    state, appended = _append(state, last, events, allow_human_blocks)
    stored = [
        event for event, _ in await tx.message_events.append_many(message_id, appended, locked=head, last_seq=last)
    ]
    if stored:
        if bus is not None:
            _hand_over(tx, bus, head.conversation_id, stored)
        if store:
            head = await _store(tx, head, state, states, base)
        else:
            states.hold(tx, head, state, stored=False, base=base)
    return head, state, stored


async def store_held(tx: Transaction, message_id: str, states: StreamStates) -> MessageHead | None:
    """Store the content of a message whose events ``tx`` emitted with ``store=False`` (see `emit_held`); None when
    there is nothing to store."""
    unsaved = states.unsaved(message_id, tx)
    if unsaved is None:
        return None
    state, base = unsaved
    return await _store(tx, await tx.messages.lock_head(message_id), state, states, base)


async def _store(
    tx: Transaction, head: MessageHead, state: StreamState, states: StreamStates, base: int
) -> MessageHead:
    """Store ``state`` (its events are stored): a new snapshot, or only the revision when the tail behind the
    stored snapshot (at ``base``) is still short for the content's size (see the module docstring)."""
    model = state.model
    assert model is not None
    if base > 0 and (state.seq or 0) - base <= min(MAX_TAIL, len(model.blocks) // BLOCKS_PER_TAIL_EVENT):
        head = await tx.messages.advance(head.id, expected_revision=head.revision, content_seq=base)
    else:
        head = await tx.messages.write_content(head.id, expected_revision=head.revision, text=model.json_text())
    states.hold(tx, head, state)
    return head


def _refuse_human(body: Mapping[str, Any]) -> None:
    block = body.get("block")
    if isinstance(block, Mapping) and block.get("type") in HUMAN_BLOCK_TYPES:
        raise InvalidRecord("ask / confirm / human_reply blocks are created through the Human API only")
    meta = body.get("meta")
    if isinstance(meta, Mapping) and "human" in meta:
        raise InvalidRecord("meta.human is reserved for the Human API")
    mask = body.get("mask")
    if isinstance(mask, str) and mask.startswith("meta.human"):
        raise InvalidRecord("meta.human is reserved for the Human API")


async def finish(
    tx: Transaction,
    message_id: str,
    status: TerminalStatus,
    *,
    error: Mapping[str, str] | None = None,
    bus: ConversationBus | None = None,
    locked: Message | None = None,
    completion: Mapping[str, Any] | None = None,
) -> Message:
    """End a message's stream (an ``error`` event first when ``error`` is given). Idempotent once terminal.
    ``locked``: the message as this transaction locked (or last wrote) it, not read again. ``completion``: a Task
    response's completion intent, stored (``delivery_state`` ``closing``) by the same write that ends it — only
    when this call ends it (a message already terminal is returned as it is)."""
    if locked is not None and locked.id != message_id:
        raise InvalidRecord(f"the locked message {locked.id} is not message {message_id}")
    message = locked if locked is not None else await tx.messages.lock(message_id)
    if message.status in TERMINAL_STATUSES:
        return message
    # The state a writer of this process committed at this very revision (a harness call's answer, ended by its Task's
    # completion), else rebuilt from the row and its last seq.
    state = bus.states.take(message.id, message.revision) if bus is not None else None
    if state is None:
        state = await state_of(tx, message)
    stored_seq = seq = state.seq or 0  # read under the message's lock
    closing: list[tuple[int, dict[str, Any]]] = []
    if error is not None and not (state.model is not None and state.model.to_json().get("meta", {}).get("error")):
        event = ErrorEvent.of(seq + 1, code=str(error.get("code", "error")), message=str(error.get("message", "")))
        state = reduce(state, event)
        seq += 1
        closing.append((seq, event.to_json()))
    end = EndEvent(seq=seq + 1)
    state = reduce(state, end)
    closing.append((seq + 1, end.to_json()))
    stored = [
        kept
        for kept, _ in await tx.message_events.append_many(message_id, closing, locked=message, last_seq=stored_seq)
    ]
    assert state.model is not None
    # An end changes no block: a row whose content is a whole snapshot (no tail to fold) keeps it as it is.
    content: dict[str, Any] | Unset = (
        UNSET if len(closing) == 1 and tx.messages.holds_whole_snapshot(message_id) else state.model.to_json()
    )
    if completion is None:
        message = await tx.messages.update(
            message_id, expected_revision=message.revision, content=content, status=status
        )
    else:
        message = await tx.messages.update(
            message_id,
            expected_revision=message.revision,
            content=content,
            status=status,
            delivery_state="closing",
            completion=dict(completion),
        )
    if bus is not None:
        _hand_over(tx, bus, message.conversation_id, stored, message)
    return message
