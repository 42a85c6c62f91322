"""Conversation titles and summaries, written by a background inference run after a conversation's first question.

`ConversationTitles` runs each title on the harness's background lane (`loopd.harness.actors.HustleLanes`: one run at a
time, a bounded queue) so no chat request ever waits for it. A title starts once the conversation's first answer has
ended (`answered`) and the server answers nothing else (`busy`: open answers, the engine's calls; `idle`), or
`TITLE_DELAY` seconds after the question, whichever comes first: its model call and writes compete neither with the
answer it names nor, under a burst of chats, with the answers still running; a question still waiting for its title when
the server stops gets one at the conversation's next question. The run's facts are recorded on the conversation row (the
hustle record of this owner): ``title_state`` ``running`` with the run's id when it starts, then ``done`` (written with
``title`` and ``summary`` in the run's one transaction) or ``failed``. A run cut off by a stop or a crash stays
``running``; `resume` (at start-up) runs those again under the same id. A full queue skips the title (the next question
asks again).

The model sees only the conversation's first question, and answers with ``{"title", "summary"}`` JSON (a plain text
answer is taken as the title). When the question noted is the conversation's first (nothing came before it), its text
is kept with the waiting title, so the run reads nothing; otherwise (an earlier question's title was skipped, or a
resumed run) the run reads the conversation's first question. Must not do: decide who may read a conversation (the
reader does).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any, Final

from loopd._infra.clock import Clock, wait_event
from loopd._infra.tasks import background
from loopd.harness import Model, ModelRequest, Usage
from loopd.harness.actors import HustleLanes, HustleQueueFullError, HustleResult
from loopd.harness.core import ZERO_USAGE, user_message
from loopd.harness.core.events import HustleCompleted, HustleFailed, HustleRefused, HustleStarted
from loopd.harness.core.hustles import LaneLimits
from loopd.harness.models import TextDelta, UsageReport
from loopd.server.chat._records import ChatRequest
from loopd.server.storage import Database, StorageError

_log = logging.getLogger(__name__)

HUSTLE_NAME: Final = "conversation_title"
MAX_TITLE: Final = 80
MAX_SUMMARY: Final = 400
MAX_QUESTION: Final = 4000
TITLE_TIMEOUT: Final = 60.0
TITLE_DELAY: Final = 5.0
"""Seconds after a conversation's first question its title starts even if the answer is still running."""
TITLE_PROMPT: Final = (
    "You name a conversation for a list of conversations. Read the user's first message and answer with JSON only: "
    '{"title": "<at most 6 words, no quotes>", "summary": "<one sentence: what the user wants>"}'
)


def _never() -> bool:
    return False


def parse_title(text: str) -> tuple[str, str]:
    """``(title, summary)`` from the model's answer: its JSON, or else its first line as the title."""
    body = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    title, summary = "", ""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        title, summary = str(data.get("title") or ""), str(data.get("summary") or "")
    else:
        title = body.splitlines()[0] if body else ""
    title = " ".join(title.split()).strip("\"'")
    return title[:MAX_TITLE], " ".join(summary.split())[:MAX_SUMMARY]


def question_text(content: dict[str, Any]) -> str:
    """The text blocks of a message's AgentUE content, joined."""
    parts = [b.get("content") for b in content.get("blocks") or () if isinstance(b, dict) and b.get("type") == "text"]
    return "\n".join(p for p in parts if isinstance(p, str))[:MAX_QUESTION]


class ConversationTitles:
    """Title runs of one server (open with ``async with``; `note` after each question, `resume` at start-up)."""

    def __init__(
        self, db: Database, model: Model, *, clock: Clock, queue: int = 32, delay: float = TITLE_DELAY
    ) -> None:
        self._db = db
        self._model = model
        self._clock = clock
        self._queue = queue
        self._delay = delay
        self._runs: dict[str, str] = {}  # run (hustle) id -> conversation id, while it runs
        self._deferred: dict[str, float] = {}  # conversation id -> when its title starts at the latest (monotonic)
        self._answered: set[str] = set()  # of those, the conversations whose answer ended (waiting for `idle`)
        self.busy: Callable[[], bool] = _never
        """Whether the server is answering now (the composition gives: answers open here, or the engine's calls):
        a title whose answer ended waits until it is not — `idle` — or its deadline."""
        self._questions: dict[str, str] = {}  # conversation id -> its first question's text, while its title waits
        self._deferred_changed = asyncio.Event()
        self._stack = AsyncExitStack()
        self.lanes = HustleLanes(
            self._record, clock=clock, limits={"background": LaneLimits(concurrency=1, queue=queue)}, name="titles"
        )

    async def __aenter__(self) -> ConversationTitles:
        await self._stack.enter_async_context(background(self._start_when_due(), name="loopd-titles-deferred"))
        return self

    async def __aexit__(self, *_exc: object) -> None:
        try:
            await self._stack.aclose()  # the deferral task is cancelled and awaited
        finally:
            await self.lanes.aclose()

    def note(self, request: ChatRequest) -> None:
        """A question was asked (``request``): its conversation's title run starts when its answer ends (`answered`)
        or after the delay — unless it has (or had) one, or is already waiting for it."""
        conversation = request.conversation
        if conversation.actor_kind != "user" or conversation.title or conversation.title_state:
            return
        if conversation.id in self._deferred or conversation.id in self._runs.values():
            return
        if len(self._deferred) >= self._queue:
            _log.info("conversation %s: no title for now: %d titles are waiting", conversation.id, self._queue)
            return
        self._deferred[conversation.id] = self._clock.monotonic() + self._delay
        question = request.input
        if request.cursor == 0 and question.kind == "user" and question.purpose == "input":  # the first question
            self._questions[conversation.id] = question_text(question.content)
        self._deferred_changed.set()

    def answered(self, conversation_id: str) -> None:
        """An answer in ``conversation_id`` ended: a title waiting for it starts now — with every other title whose
        answer ended — or once the server is idle."""
        if conversation_id in self._deferred:
            self._answered.add(conversation_id)
        self.idle()

    def idle(self) -> None:
        """The server may answer nothing now (a call ended): the titles whose answers ended start, unless it is
        `busy` after all."""
        if not self._answered or self.busy():
            return
        ready, self._answered = self._answered, set()
        for conversation_id in ready:
            if self._deferred.pop(conversation_id, None) is not None:
                self._start(conversation_id)

    async def _start_when_due(self) -> None:
        """Start each deferred title whose delay has passed (the rest start through `answered`)."""
        while True:
            self._deferred_changed.clear()
            now = self._clock.monotonic()
            for conversation_id, due in list(self._deferred.items()):
                if due <= now:
                    del self._deferred[conversation_id]
                    self._answered.discard(conversation_id)
                    self._start(conversation_id)
            soonest = min(self._deferred.values(), default=None)
            await wait_event(self._clock, self._deferred_changed, None if soonest is None else soonest - now)

    def _start(self, conversation_id: str, *, resume: str | None = None) -> None:
        question = self._questions.pop(conversation_id, None)
        if conversation_id in self._runs.values():
            return
        try:
            run = self.lanes.submit(
                HUSTLE_NAME,
                "background",
                lambda: self._title(conversation_id, question),
                on_end=self._ended,
                params={"conversation_id": conversation_id},
                resume=resume,
            )
        except HustleQueueFullError as exc:
            _log.info("conversation %s: no title for now: %s", conversation_id, exc)
            return
        self._runs[run] = conversation_id

    async def resume(self) -> int:
        """Run again the titles a stop or a crash cut off; how many."""
        async with self._db.transaction(read_only=True) as tx:
            cut_off = await tx.conversations.titles_running()
        for conversation in cut_off:
            self._start(conversation.id, resume=conversation.title_run or None)
        return len(cut_off)

    def _ended(self, run: str, _outcome: object) -> None:
        self._runs.pop(run, None)

    async def _record(self, event: HustleStarted | HustleCompleted | HustleFailed | HustleRefused) -> None:
        if isinstance(event, (HustleRefused, HustleCompleted)):
            return  # nothing started: the title stays as it was (the caller logs why); or the run's end wrote it
        conversation_id = self._runs.get(event.hustle_id)
        if isinstance(event, HustleStarted):
            conversation_id = str(event.params.get("conversation_id", ""))
        if not conversation_id:
            return
        state = "running" if isinstance(event, HustleStarted) else "failed"
        async with self._db.transaction() as tx:
            await tx.conversations.set_title_state(
                conversation_id, state, run=event.hustle_id if isinstance(event, HustleStarted) else None
            )

    async def _title(self, conversation_id: str, question: str | None) -> HustleResult:
        if question is None:
            async with self._db.transaction(read_only=True) as tx:
                messages = await tx.messages.list_conversation(conversation_id, limit=10)
            first = next((m for m in messages if m.kind == "user" and m.purpose == "input"), None)
            if first is None:
                raise StorageError(f"conversation {conversation_id} has no question yet")
            question = question_text(first.content)
        request = ModelRequest(
            model=self._model.name,
            messages=(user_message(question or "(no text)"),),
            tools=(),
            system=TITLE_PROMPT,
            temperature=0.0,
            max_output_tokens=200,
        )
        text: list[str] = []
        usage: Usage = ZERO_USAGE
        async with asyncio.timeout(TITLE_TIMEOUT):
            async for chunk in self._model.stream(request):
                if isinstance(chunk, TextDelta):
                    text.append(chunk.text)
                elif isinstance(chunk, UsageReport):
                    usage = usage + chunk.usage
        title, summary = parse_title("".join(text))
        if not title:
            raise ValueError("the model gave no title")
        async with self._db.transaction() as tx:  # the title, and the run's end (``done``)
            await tx.conversations.set_title(conversation_id, title, summary)
        return HustleResult(value=title, usage=usage)


def demo_title_reply(request: ModelRequest) -> str:
    """What the demo model answers a title request: the question's first words (no real model behind it)."""
    words = (request.messages[-1].content if request.messages else "").split()
    title = " ".join(words[:6]) or "New conversation"
    return json.dumps({"title": title, "summary": f"The user asks: {' '.join(words[:30])}"})
