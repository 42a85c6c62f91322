"""Visible message streams: the durable AgentUE event log of each message and wake-ups for its readers.

`open_message` (`open_messages`), `emit` and `finish` are the only writers of message content (see ``_log``);
`ConversationBus` wakes readers after a commit.
"""

from loopd.server.streams._bus import BUS_CHANNEL, BusListener, CommittedStates, ConversationBus, FirstOutputs, Headers
from loopd.server.streams._log import (
    BLOCKS_PER_TAIL_EVENT,
    HUMAN_BLOCK_TYPES,
    MAX_TAIL,
    TERMINAL_STATUSES,
    StreamStates,
    TerminalStatus,
    emit,
    emit_held,
    empty_model,
    finish,
    locked_state,
    open_message,
    open_messages,
    state_of,
    store_held,
)

__all__ = [
    "BLOCKS_PER_TAIL_EVENT",
    "BUS_CHANNEL",
    "HUMAN_BLOCK_TYPES",
    "MAX_TAIL",
    "TERMINAL_STATUSES",
    "BusListener",
    "CommittedStates",
    "ConversationBus",
    "FirstOutputs",
    "Headers",
    "StreamStates",
    "TerminalStatus",
    "emit",
    "emit_held",
    "empty_model",
    "finish",
    "locked_state",
    "open_message",
    "open_messages",
    "state_of",
    "store_held",
]
