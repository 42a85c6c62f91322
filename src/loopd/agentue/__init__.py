"""AgentUE: the message content model, validation, reducer, named streams and SSE framing (protocol 1.1, SSE 1.0).

A message's content is a *model* `{version, biz, meta, blocks}`: `biz` names the domain, `meta` is an open object
(`error`, `task_id`, `trace_id`, `stats`, anything else), `blocks` are ordered, each an inline block (`id`, `type`,
domain fields) or a reference `{id, ref}` that the application resolves. Live changes are *events* — `start`
(whole model), `set`, `append`, `error`, `ping`, `end` — each with a per-stream `seq`; `reduce(state, event)` folds
them deterministically into the snapshot, and `Streams` keeps one independent state per `stream_id`. Over HTTP each
event is one SSE message `data: <json>` whose optional `id:` is a transport cursor (`encode_sse_event`,
`decode_sse_event`; the generic SSE framing is ``loopd._infra.sse``).

Pure and a leaf: this package imports nothing of loopd but the floor's pure modules (``loopd._infra``) and does no
I/O (no clock, no randomness, no sockets).
Errors: `AgentUEValidationError` (the input is not AgentUE; `AgentUETooDeepError` when a value nests more than
`MAX_DEPTH` levels) and `AgentUERejectedError` (the event cannot apply to this state; the state is unchanged), all
`AgentUEError`s and so `ValueError`s.
"""

from loopd.agentue._blocks import (
    BLOCK_TYPES,
    ArtifactBlock,
    AskBlock,
    Choice,
    ConfirmBlock,
    HumanOutcome,
    HumanReplyBlock,
    HumanStatus,
    ProgressBlock,
    ResultBlock,
    Role,
    TextBlock,
    ToolBlock,
    TypedBlock,
    typed_block,
    validate_model,
)
from loopd.agentue._errors import (
    MAX_DEPTH,
    AgentUEError,
    AgentUERejectedError,
    AgentUETooDeepError,
    AgentUEValidationError,
    RejectCode,
)
from loopd.agentue._events import (
    AppendEvent,
    EndEvent,
    ErrorEvent,
    Event,
    Lifecycle,
    Op,
    PingEvent,
    SetEvent,
    StartEvent,
    as_event,
    decode_event,
    encode_event,
    event_from_json,
)
from loopd.agentue._frames import Frame, join_frames, split_block
from loopd.agentue._model import (
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    Block,
    ErrorInfo,
    InlineBlock,
    Model,
    RefBlock,
    parse_block,
)
from loopd.agentue._reducer import StreamState, fold, reduce, resume
from loopd.agentue._sse import (
    SSE_CONTENT_TYPE,
    SSE_HEADERS,
    SseEvent,
    decode_sse_event,
    encode_sse_event,
)
from loopd.agentue._streams import Streams, fold_streams

SSE_BINDING_VERSION = "1.0"

__all__ = [
    "BLOCK_TYPES",
    "MAX_DEPTH",
    "PROTOCOL_VERSION",
    "SSE_BINDING_VERSION",
    "SSE_CONTENT_TYPE",
    "SSE_HEADERS",
    "SUPPORTED_VERSIONS",
    "AgentUEError",
    "AgentUERejectedError",
    "AgentUETooDeepError",
    "AgentUEValidationError",
    "AppendEvent",
    "ArtifactBlock",
    "AskBlock",
    "Block",
    "Choice",
    "ConfirmBlock",
    "EndEvent",
    "ErrorEvent",
    "ErrorInfo",
    "Event",
    "Frame",
    "HumanOutcome",
    "HumanReplyBlock",
    "HumanStatus",
    "InlineBlock",
    "Lifecycle",
    "Model",
    "Op",
    "PingEvent",
    "ProgressBlock",
    "RefBlock",
    "RejectCode",
    "ResultBlock",
    "Role",
    "SetEvent",
    "SseEvent",
    "StartEvent",
    "StreamState",
    "Streams",
    "TextBlock",
    "ToolBlock",
    "TypedBlock",
    "as_event",
    "decode_event",
    "decode_sse_event",
    "encode_event",
    "encode_sse_event",
    "event_from_json",
    "fold",
    "fold_streams",
    "join_frames",
    "parse_block",
    "reduce",
    "resume",
    "split_block",
    "typed_block",
    "validate_model",
]
