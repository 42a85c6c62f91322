"""``rt.harness``: harness calls through loop-server's Harness Engine, and the ``Call`` handle.

Owns: starting or re-attaching a call by its identity (owner UID, effect key), reading its state, following its
visible events (SSE, resumed by seq after a lost connection), waiting for its end through the server's bounded
wait, and cancelling it.
Must not do: run or retry a call itself (the engine owns execution: closing a stream or abandoning a wait never
touches the call), or import loopd.server / loopd.harness.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final

from loopd._infra.backoff import Backoff
from loopd._infra.clock import Clock
from loopd._infra.sse import read_sse

from ._client import MAX_WAIT, ServerClient
from ._errors import InvalidRequest, Unavailable
from ._records import TOOLS_PROFILES, CallState, Message, ToolsProfile

logger = logging.getLogger("loopd.runtime")

"""The longest single ``/wait`` the client asks the server for (the server caps it at 60 s)."""
RECONNECTS: Final = 10
"""Consecutive lost connections ``Call.stream`` survives before it raises ``Unavailable``."""

HistoryLike = Message | Mapping[str, Any] | tuple[str, str, str]


class Call:
    """One harness call: ``value()`` (its state now), ``stream()``, ``wait()``, ``cancel()``. ``state`` is the
    state last read; ``message_id`` the message its visible output goes to (with ``output="work"``)."""

    def __init__(self, client: ServerClient, clock: Clock, state: CallState) -> None:
        self._client = client
        self._clock = clock
        self.state = state

    @property
    def id(self) -> str:
        """The call's id."""
        return self.state.id

    @property
    def message_id(self) -> str | None:
        """The message the call's visible output goes to."""
        return self.state.message_id

    @property
    def conversation_id(self) -> str | None:
        """The conversation of that message (the Task's work conversation with ``output="work"``)."""
        return self.state.conversation_id

    async def value(self) -> CallState:
        """The call's state now (phase, result, error): inspect and return, without waiting."""
        self.state = CallState.from_json(await self._client.request("GET", f"/v1/harness/calls/{self.id}"))
        return self.state

    async def wait(self, timeout: float | None = None) -> CallState:
        """The call's terminal state, waiting as long as it runs (``TimeoutError`` after ``timeout`` seconds on the
        runtime's clock). Loops over the server's bounded wait; cancelling this never cancels the call."""
        self.state = await self._client.wait_until_ended(
            f"/v1/harness/calls/{self.id}/wait",
            self.state,
            CallState.from_json,
            clock=self._clock,
            timeout=timeout,
            what=f"harness call {self.id}",
        )
        return self.state

    async def cancel(self) -> CallState:
        """Ask the call to stop (idempotent); it becomes ``cancelled`` once the engine has stopped it."""
        body = await self._client.request(
            "POST", f"/v1/harness/calls/{self.id}/cancel", idempotent=True, what=f"cancel harness call {self.id}"
        )
        self.state = CallState.from_json(body)
        return self.state

    async def stream(self, after: int = 0) -> AsyncIterator[dict[str, Any]]:
        """The call's visible AgentUE events (JSON objects with ``op`` and ``seq``) after seq ``after``, live, until
        its ``end``. A lost connection resumes from the last seq seen (a resumed stream's snapshot ``start`` is
        skipped when it covers only what was yielded)."""
        last = after
        reconnect = Backoff(base=0.2, factor=2.0, max_delay=3.0).attempts()
        while True:
            headers = {"Last-Event-ID": str(last)} if last > 0 else {}
            try:
                async with self._client.stream(f"/v1/harness/calls/{self.id}/stream", headers=headers) as response:
                    async for message in read_sse(response.aiter_text()):
                        if message.data is None:
                            continue
                        if message.event == "error":
                            raise Unavailable(f"harness call {self.id}: the server ended the stream: {message.data}")
                        event = json.loads(message.data)
                        if not isinstance(event, dict):
                            continue
                        reconnect.reset()
                        seq = event.get("seq")
                        op = event.get("op")
                        if op == "start" and last > 0 and seq == last:
                            continue  # the snapshot of what this iterator already yielded
                        if isinstance(seq, int) and seq > last and op != "end":
                            last = seq
                        yield event
                        if op == "end":
                            return
            except Unavailable as exc:
                delay = reconnect.failed()
                if reconnect.failures > RECONNECTS:
                    raise
                logger.info("harness call %s: stream lost (%s); resuming after seq %d", self.id, exc.message, last)
                await self._clock.sleep(delay)
                continue
            # The server closed the stream without an end (a restart, a proxy): resume.
            delay = reconnect.failed()
            if reconnect.failures > RECONNECTS:
                raise Unavailable(f"harness call {self.id}: the stream keeps ending without its end")
            await self._clock.sleep(delay)


class HarnessVerbs:
    """``rt.harness``."""

    def __init__(self, client: ServerClient, clock: Clock) -> None:
        self._client = client
        self._clock = clock

    async def prompt(
        self,
        owner_uid: str,
        effect_key: str,
        target: str,
        text: str,
        *,
        task_id: str | None = None,
        workspace: str | None = None,
        tools: ToolsProfile | None = None,
        history: Sequence[HistoryLike] = (),
        timeout: float = 1800.0,
        output: str | None = "work",
        conversation_id: str | None = None,
        message_id: str | None = None,
        params: Mapping[str, Any] | None = None,
        wait: float = 0.0,
    ) -> Call:
        """Start the harness call identified by ``(owner_uid, effect_key)`` — or re-attach to it: the same identity
        with the same parameters is the same call (a restarted operator finds its work), other parameters are
        ``Conflict``, a full engine is ``CapacityFull``. ``target`` is the harness (e.g. ``assistant``); ``task_id``
        the Task it works for (required for an operator's token); ``output="work"`` makes the call's visible output
        one ``harness`` message in that Task's work conversation (``None``: no projection, or the explicit
        ``conversation_id`` / ``message_id``). ``workspace`` names the call's own directory (a relative id such as
        a Run's UID: the server keeps it under its workspaces root, per caller, and creates it on demand) and
        ``tools`` its tools profile: ``none`` (no tools), ``read`` (read_file, list_dir, glob, grep) or ``write``
        (those plus write_file, edit_file, bash), allowed inside that workspace without a gate prompt (bash only in a
        confining sandbox); read and write need a workspace. Both are part of the call's parameters. ``params``
        travel with them; ``history`` is ``(kind, key, text)`` items or ``Message``s. ``wait`` (seconds, at most
        30) answers only once the call has ended or that time has passed — a start and a first `Call.wait` in one
        request, for a caller that waits on this call alone; it is not one of the call's parameters."""
        if output is not None and task_id is None:
            raise InvalidRequest("output='work' needs the task_id whose work conversation receives it")
        if tools is not None and tools not in TOOLS_PROFILES:
            raise InvalidRequest(f"tools must be one of {', '.join(TOOLS_PROFILES)}, not {tools!r}")
        merged: dict[str, Any] = dict(params or {})
        body: dict[str, Any] = {
            "owner_uid": owner_uid,
            "effect_key": effect_key,
            "target": target,
            "text": text,
            "task_id": task_id,
            "conversation_id": conversation_id,
            "message_id": message_id,
            "history": [_history_item(item) for item in history],
            "params": merged,
            "timeout": timeout,
            "workspace": workspace,
            "tools": tools,
        }
        if output is not None:
            body["output"] = output
        if not 0 <= wait <= MAX_WAIT:
            raise InvalidRequest(f"wait must be between 0 and {MAX_WAIT:g} seconds, not {wait!r}")
        if wait > 0:
            body["wait"] = wait
        state = await self._client.request(
            "POST",
            "/v1/harness/calls",
            json={k: v for k, v in body.items() if v is not None},
            idempotent=True,  # by (owner_uid, effect_key)
            timeout=wait + self._client.request_timeout if wait > 0 else None,
            what=f"harness call {effect_key!r}",
        )
        return Call(self._client, self._clock, CallState.from_json(state))

    async def find(self, owner_uid: str, effect_key: str) -> Call | None:
        """The call ``(owner_uid, effect_key)`` as it is, or None (none, or one the caller may not see) — whatever
        parameters it was started with: a restarted operator re-attaches to a step it started before even when the
        prompt it would build now differs (its context has moved on)."""
        body = await self._client.request(
            "GET",
            "/v1/harness/calls",
            params={"owner_uid": owner_uid, "effect_key": effect_key},
            what=f"harness call {effect_key!r}",
        )
        found = body.get("data") or []
        return Call(self._client, self._clock, CallState.from_json(found[0])) if found else None

    async def get(self, call_id: str) -> Call:
        """The call with this id (``NotFound`` when the caller may not see it)."""
        state = await self._client.request("GET", f"/v1/harness/calls/{call_id}")
        return Call(self._client, self._clock, CallState.from_json(state))


def _history_item(item: HistoryLike) -> dict[str, str]:
    if isinstance(item, Message):
        return {"kind": item.kind, "key": item.key, "text": item.text}
    if isinstance(item, Mapping):
        return {"kind": str(item["kind"]), "key": str(item["key"]), "text": str(item["text"])}
    kind, key, text = item
    return {"kind": kind, "key": key, "text": text}
