"""The Harness Engine: durable harness calls driven through adapters, projected into messages, traced in the ledger.

Public face only. A *call* has a durable identity (owner UID, effect key) made before anything runs; the engine
admits it within a bounded capacity, claims it with a fenced lease, starts or resumes it through a
`HarnessAdapter`, projects the adapter's updates into the call's message (``answer`` text, ``tool/<id>``,
``gate/<id>`` ask blocks, ``result``) with a checkpoint + hash chain so a resumed replay is deduplicated, and
writes the ledger trail (Session = conversation, Run = call, Lane ``main``). It never finishes the message:
its owner does.

Modules: ``_requests`` (CallRequest), ``_engine`` (HarnessEngine: admission, reads, commands, the driver),
``_driving`` (one claimed call), ``_projection`` (updates → AgentUE events; pure), ``_trail`` (ledger facts),
``_adapter`` (the adapter seam and its update vocabulary), ``_translation`` (harness events → updates),
``_builtin`` / ``_remote`` / ``_openai`` (the adapters), ``_routes`` (HTTP), ``_errors``.

May import: loopd.server.storage / streams / ledger / http, loopd.harness, loopd.agentue. Never the chat,
human or registry services (they are reached through the callables the composition root passes in).
"""

from loopd.server.engine._adapter import (
    GATE_ANSWERS,
    AdapterRequest,
    AdapterRun,
    Failed,
    Finished,
    GateAnswer,
    GateOpened,
    GateResolved,
    HarnessAdapter,
    HistoryEntry,
    InputCapable,
    ModelCalled,
    TextPreview,
    TextSet,
    ToolFinished,
    ToolStarted,
    Update,
)
from loopd.server.engine._builtin import MODE_OPTION, BuiltinHarnessAdapter, recording_rig
from loopd.server.engine._engine import (
    MAX_LISTENERS,
    EngineListener,
    EngineNotice,
    EngineStatistics,
    HarnessEngine,
    InputOutcome,
)
from loopd.server.engine._errors import (
    AdapterError,
    CapacityExceeded,
    EngineClosed,
    GateForbidden,
    HarnessEngineError,
    ObservationLost,
    ResumeUnsupported,
    UnknownTarget,
)
from loopd.server.engine._openai import OpenAIModelAdapter
from loopd.server.engine._projection import ANSWER_BLOCK, RESULT_BLOCK, gate_block_id, tool_block_id
from loopd.server.engine._prompts import AttemptFacts, PromptLog, PromptRecording, RecordedCall
from loopd.server.engine._remote import RemoteError, RemoteHarnessAdapter
from loopd.server.engine._requests import DEFAULT_TIMEOUT, MAX_TIMEOUT, CallRequest, history_of, workspace_of
from loopd.server.engine._routes import engine_router

__all__ = [
    "ANSWER_BLOCK",
    "DEFAULT_TIMEOUT",
    "GATE_ANSWERS",
    "MAX_LISTENERS",
    "MAX_TIMEOUT",
    "MODE_OPTION",
    "RESULT_BLOCK",
    "AdapterError",
    "AdapterRequest",
    "AdapterRun",
    "AttemptFacts",
    "BuiltinHarnessAdapter",
    "CallRequest",
    "CapacityExceeded",
    "EngineClosed",
    "EngineListener",
    "EngineNotice",
    "EngineStatistics",
    "Failed",
    "Finished",
    "GateAnswer",
    "GateForbidden",
    "GateOpened",
    "GateResolved",
    "HarnessAdapter",
    "HarnessEngine",
    "HarnessEngineError",
    "HistoryEntry",
    "InputCapable",
    "InputOutcome",
    "ModelCalled",
    "ObservationLost",
    "OpenAIModelAdapter",
    "PromptLog",
    "PromptRecording",
    "RecordedCall",
    "RemoteError",
    "RemoteHarnessAdapter",
    "ResumeUnsupported",
    "TextPreview",
    "TextSet",
    "ToolFinished",
    "ToolStarted",
    "UnknownTarget",
    "Update",
    "engine_router",
    "gate_block_id",
    "history_of",
    "recording_rig",
    "tool_block_id",
    "workspace_of",
]
