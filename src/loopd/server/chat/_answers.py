"""`OpenAnswers`: the answers the questions asked in this process still wait for.

A question adds its Task when it has been stored (`ChatRequests.ask`), and its completion in this process removes it
(`TaskApi.complete`, once the answer has ended). Work nobody waits for — conversation titles, a completed answer's
Task delete — waits while any is open (the composition's ``busy``): under a burst of chats the server spends its time
on the answers first. Bounded (`OPEN_ANSWERS_KEPT`, the oldest forgotten first) and forgetful: an answer completed
elsewhere (another replica) or never is forgotten after `OPEN_ANSWER_HORIZON` seconds, so it holds that work back
for a while at most (each has its own deadline besides).

Listeners (`add_listener`) hear when the first answer opens (``True``) and when the last one is gone (``False``): a
serving command paces the cyclic collector with it (`loopd._infra.heap.CollectorPacer`).

Must not do: block, or decide anything about a Task (it only counts).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from loopd._infra.clock import Clock

OPEN_ANSWERS_KEPT: Final = 4096
OPEN_ANSWER_HORIZON: Final = 600.0
"""Seconds an answer stays open here at most (one completed by another replica is never removed here)."""


class OpenAnswers:
    """Task ids of questions asked here whose answer has not ended here yet (see the module docstring)."""

    def __init__(self, clock: Clock, *, kept: int = OPEN_ANSWERS_KEPT, horizon: float = OPEN_ANSWER_HORIZON) -> None:
        self._clock = clock
        self._kept = kept
        self._horizon = horizon
        self._open: OrderedDict[str, float] = OrderedDict()  # task id -> when it was asked (monotonic)
        self._listeners: list[Callable[[bool], None]] = []

    def add_listener(self, listener: Callable[[bool], None]) -> Callable[[], None]:
        """Call ``listener(True)`` when the first answer opens and ``listener(False)`` when the last one is gone;
        returns what removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _tell(self, busy: bool) -> None:
        for listener in tuple(self._listeners):
            listener(busy)

    def asked(self, task_id: str) -> None:
        """A question was stored: its answer is open."""
        first = not self._open
        self._open[task_id] = self._clock.monotonic()
        self._open.move_to_end(task_id)
        while len(self._open) > self._kept:
            self._open.popitem(last=False)
        if first:
            self._tell(True)

    def answered(self, task_id: str) -> None:
        """The Task's answer ended here."""
        if self._open.pop(task_id, None) is not None and not self._open:
            self._tell(False)

    def waiting(self) -> bool:
        """Whether any answer is still open (those past the horizon are forgotten first)."""
        open_ = self._open
        if open_:
            horizon = self._clock.monotonic() - self._horizon
            while open_ and next(iter(open_.values())) < horizon:
                open_.popitem(last=False)
            if not open_:
                self._tell(False)
        return bool(open_)

    def __len__(self) -> int:
        self.waiting()
        return len(self._open)
