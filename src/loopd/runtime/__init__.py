"""loop-runtime: the operator toolkit — what an operator process embeds to answer Tasks.

It talks to loop-server only through its HTTP API (``httpx``), and to Tasks only through the Kubernetes API
(``loopd.resources.client`` and the reconcile runtime ``loopd.resources.reconcile``, used as they are)::

    from loopd.runtime import Result, Task, open_runtime

    async with open_runtime("http://127.0.0.1:8420", token=TOKEN) as rt:   # or data_dir= of a `loopd up`
        await rt.register("echo", display_name="Echo")                      # renewed every lease/3
        async def answer(task: Task) -> Result | None:
            context = await rt.task.get(task.id)                            # TaskNotReady → requeued shortly
            await rt.chat.answer(task.id, context.input.text)
            await rt.chat.complete(task.id)
            return None
        rt.task.watch("echo", answer)
        await rt.run()                                                      # until cancelled or rt.shutdown()

The verbs: ``rt.task`` (get, messages, followups, list, watch), ``rt.chat`` (conversation, history, send, speak,
tell → ``Output``, emit, answer, complete), ``rt.harness.prompt`` → ``Call`` (value, stream, wait, cancel),
``rt.human`` (ask, confirm → ``Question`` with get, wait), ``rt.register``; an operator's own domain resources
(typed ``loopd.resources.KubeObject`` models): ``rt.resources(Model)`` → ``ResourceVerbs`` (get, find, list, create
with an owner, patch_status, replace_status, delete), ``rt.watch(Model, reconciler, owns=...)``,
``rt.ensure_crds(manifests)``. Errors: ``RuntimeApiError`` and its
members (``_errors``' docstring draws the tree).

Must not import: loopd.server, loopd.harness, loopd.cli (an import-linter contract checks it).
"""

from loopd.resources.reconcile import LeaderElection, PermanentError, Result, TemporaryError

from ._chat import ANSWER_BLOCK, TEXT_BLOCK, ChatVerbs, Emitted, Output
from ._client import MAX_WAIT, Endpoint, ServerClient, find_endpoint
from ._domain import (
    CRDS,
    DomainReconciler,
    ResourceVerbs,
    owner_reference,
    resource_type,
)
from ._errors import (
    AlreadyExists,
    CapacityFull,
    Conflict,
    Forbidden,
    Invalid,
    InvalidRequest,
    NotFound,
    RuntimeApiError,
    ServerFailure,
    TaskNotReady,
    Unauthorized,
    Unavailable,
)
from ._harness import Call, HarnessVerbs
from ._human import HumanVerbs, Question
from ._records import (
    TOOLS_PROFILES,
    CallState,
    Conversation,
    InvalidResponse,
    Message,
    QuestionState,
    Registration,
    Sent,
    TaskContext,
    TaskSummary,
    ToolsProfile,
    text_of,
)
from ._runtime import Runtime, open_runtime
from ._tasks import Task, TaskReconcileFunction, TaskReconciler, TaskVerbs

__all__ = [
    "ANSWER_BLOCK",
    "CRDS",
    "MAX_WAIT",
    "TEXT_BLOCK",
    "TOOLS_PROFILES",
    "AlreadyExists",
    "Call",
    "CallState",
    "CapacityFull",
    "ChatVerbs",
    "Conflict",
    "Conversation",
    "DomainReconciler",
    "Emitted",
    "Endpoint",
    "Forbidden",
    "HarnessVerbs",
    "HumanVerbs",
    "Invalid",
    "InvalidRequest",
    "InvalidResponse",
    "LeaderElection",
    "Message",
    "NotFound",
    "Output",
    "PermanentError",
    "Question",
    "QuestionState",
    "Registration",
    "ResourceVerbs",
    "Result",
    "Runtime",
    "RuntimeApiError",
    "Sent",
    "ServerClient",
    "ServerFailure",
    "Task",
    "TaskContext",
    "TaskNotReady",
    "TaskReconcileFunction",
    "TaskReconciler",
    "TaskSummary",
    "TaskVerbs",
    "TemporaryError",
    "ToolsProfile",
    "Unauthorized",
    "Unavailable",
    "find_endpoint",
    "open_runtime",
    "owner_reference",
    "resource_type",
    "text_of",
]
