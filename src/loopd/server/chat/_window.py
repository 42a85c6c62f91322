"""The commit window of a question: its Task exists (created inside the question's transaction, so that a Task that
cannot be created rolls the question back) but the question is not committed yet.

A responder in this process that reconciles the new Task during that window finds no question to answer and could
only poll for it (a read of the call and of the Task's context, then a retry 0.2 s later: for most chats, since
the Task's watch event usually outruns the commit). `QuestionWindow` lets it wait instead: `ChatRequests` opens the
window just before it creates the Task and closes it when the transaction has ended (committed, rolled back, or
with an unknown outcome); the responder asks `is_open` and, when it is, sets the Task aside until `listen` tells
it the window closed. Responders in other processes (replicas on one PostgreSQL) do not see it and poll as before.

A question that is its conversation's first leaves its Task's context here once it surely committed (`hand_over`):
the transaction that stored it knows all of it (the conversation as it left it, where it was forked from, the input
as the only history, the response as opened), so the responder's first reconcile takes it (`handed_over`, once)
instead of reading it back. Kept for the last `HANDED_OVER_KEPT` questions: a Task nobody here answers ages out.

Must not do: block, await, or hold anything beyond the open windows (they are few: the questions being stored now)
and the bounded contexts handed over.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from loopd.server.chat._records import TaskContext

HANDED_OVER_KEPT: Final = 1024
"""Contexts of committed first questions kept for their responder, newest last (the oldest is dropped first)."""


class QuestionWindow:
    """The Tasks whose question this process is storing right now, and who to tell when one's window closes."""

    def __init__(self, *, kept: int = HANDED_OVER_KEPT) -> None:
        self._open: set[str] = set()
        self._listeners: list[Callable[[str], None]] = []
        self._kept = kept
        self._contexts: OrderedDict[str, TaskContext] = OrderedDict()

    def hand_over(self, context: TaskContext) -> None:
        """A committed question's whole Task context, for the responder's first reconcile (see the module
        docstring); call before `close`."""
        self._contexts[context.task_id] = context
        while len(self._contexts) > self._kept:
            self._contexts.popitem(last=False)

    def handed_over(self, task_id: str) -> TaskContext | None:
        """The context handed over for ``task_id`` — once: it is forgotten as it is taken — or None."""
        return self._contexts.pop(task_id, None)

    def is_open(self, task_id: str) -> bool:
        """Whether the question of Task ``task_id`` is being stored by this process now (not yet committed)."""
        return task_id in self._open

    def open(self, task_id: str) -> None:
        """The Task is about to be created inside its question's transaction."""
        self._open.add(task_id)

    def close(self, task_id: str) -> None:
        """The question's transaction ended (any outcome); tells the listeners once. Closing twice is harmless."""
        if task_id not in self._open:
            return
        self._open.discard(task_id)
        for listener in tuple(self._listeners):
            listener(task_id)

    def listen(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(task_id)`` when a window closes (it must not block); returns the function that stops it."""
        self._listeners.append(callback)

        def remove() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return remove
