"""``rt.human``: typed questions to the person who asked a Task (Ask with choices / free text, Confirm).

Owns: asking by effect key (the same key and parameters are the same question) and the ``Question`` handle
(``get``, ``wait`` through the server's bounded wait).
Must not do: answer questions (the asking user does), or import loopd.server / loopd.harness.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loopd._infra.clock import Clock

from ._client import ServerClient
from ._records import QuestionState

ChoiceLike = str | tuple[str, str] | Mapping[str, Any]


class Question:
    """One Ask or Confirm: ``get()`` (its state now) and ``wait()`` (its outcome). ``state`` is the last read."""

    def __init__(self, client: ServerClient, clock: Clock, state: QuestionState) -> None:
        self._client = client
        self._clock = clock
        self.state = state

    @property
    def message_id(self) -> str:
        """The question's message id (its identity on the server)."""
        return self.state.message_id

    async def get(self) -> QuestionState:
        """The question now: ``pending``, or its one outcome."""
        self.state = QuestionState.from_json(await self._client.request("GET", f"/v1/human/{self.message_id}"))
        return self.state

    async def wait(self, timeout: float | None = None) -> QuestionState:
        """The question's outcome (``success`` / ``dismissed`` / ``timeout`` / ``failure``), waiting while it is
        pending (``TimeoutError`` after ``timeout`` seconds on the runtime's clock; the question stays open — its
        own deadline decides when it times out)."""
        self.state = await self._client.wait_until_ended(
            f"/v1/human/{self.message_id}/wait",
            self.state,
            QuestionState.from_json,
            clock=self._clock,
            timeout=timeout,
            what=f"question {self.message_id}",
        )
        return self.state


class HumanVerbs:
    """``rt.human``."""

    def __init__(self, client: ServerClient, clock: Clock) -> None:
        self._client = client
        self._clock = clock

    async def ask(
        self,
        task_id: str,
        effect_key: str,
        *,
        title: str,
        prompt: str,
        timeout: float,
        choices: Sequence[ChoiceLike] = (),
        allow_other: bool = False,
    ) -> Question:
        """Ask the user who asked the Task to pick one of ``choices`` (a value, ``(value, label)`` or
        ``{"value", "label", "description"}``) and/or answer in free text (``allow_other``); it times out after
        ``timeout`` seconds. Idempotent by ``effect_key`` (other parameters under the same key: ``Conflict``)."""
        body: dict[str, Any] = {
            "effect_key": effect_key,
            "type": "ask",
            "title": title,
            "prompt": prompt,
            "timeout_seconds": timeout,
            "allow_other": allow_other,
        }
        if choices:
            body["choices"] = [_choice(c) for c in choices]
        return await self._ask(task_id, body)

    async def confirm(
        self,
        task_id: str,
        effect_key: str,
        *,
        title: str,
        prompt: str,
        timeout: float,
        confirm_label: str | None = None,
        decline_label: str | None = None,
    ) -> Question:
        """Ask the user to accept or decline (outcome ``success`` with value ``accepted`` / ``declined``: see
        ``QuestionState.accepted``). Idempotent by ``effect_key`` like ``ask``."""
        body: dict[str, Any] = {
            "effect_key": effect_key,
            "type": "confirm",
            "title": title,
            "prompt": prompt,
            "timeout_seconds": timeout,
        }
        if confirm_label is not None:
            body["confirm_label"] = confirm_label
        if decline_label is not None:
            body["decline_label"] = decline_label
        return await self._ask(task_id, body)

    async def get(self, message_id: str) -> Question:
        """The question whose message is ``message_id``."""
        state = QuestionState.from_json(await self._client.request("GET", f"/v1/human/{message_id}"))
        return Question(self._client, self._clock, state)

    async def _ask(self, task_id: str, body: dict[str, Any]) -> Question:
        answer = await self._client.request(
            "POST", f"/v1/tasks/{task_id}/human", json=body, idempotent=True, what=f"question {body['effect_key']!r}"
        )
        return Question(self._client, self._clock, QuestionState.from_json(answer))


def _choice(choice: ChoiceLike) -> dict[str, Any]:
    if isinstance(choice, str):
        return {"value": choice, "label": choice}
    if isinstance(choice, Mapping):
        return {k: v for k, v in choice.items() if v is not None}
    value, label = choice
    return {"value": value, "label": label}
