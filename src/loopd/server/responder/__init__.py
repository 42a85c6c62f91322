"""The direct-harness responder: Tasks whose target is a harness are answered by one Harness Engine call.

Public face: `HarnessResponder` (a ``loopd.resources.reconcile`` reconciler for Tasks), the `ChatPort` /
`TaskContextView` protocols it needs from the chat side, `FOLLOWUP_ANSWER` (what a follow-up handed to a running
harness call is answered), and helpers. Register it on the Task resource, with its event filter::

    responder = HarnessResponder(client=client, engine=engine, chat=task_api)
    manager.add_controller(TASKS, responder, workers=16, event_filter=responder.event_filter)

The controller binds itself to the responder (``bind_controller``), which then queues Tasks on engine notices.
Must not import the chat service module (it talks to it through `ChatPort`).
"""

from loopd.server.responder._responder import (
    EFFECT_KEY,
    FOLLOWUP_ANSWER,
    ChatPort,
    HarnessResponder,
    ResponderStatistics,
    TaskContextView,
    call_error,
    message_text,
)

__all__ = [
    "EFFECT_KEY",
    "FOLLOWUP_ANSWER",
    "ChatPort",
    "HarnessResponder",
    "ResponderStatistics",
    "TaskContextView",
    "call_error",
    "message_text",
]
