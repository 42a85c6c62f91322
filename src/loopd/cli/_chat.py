"""`loopd chat`: ask a responder through a running loop-server and stream the answer.

Finds the server the way a user expects: ``--server`` / ``$LOOPD_SERVER``, else the ``server.json`` that a
`loopd up` on the same data directory wrote; the token comes from ``--token`` / ``$LOOPD_TOKEN``, else the token
file named there (only for the server recorded there, or with an explicit ``--data-dir``: a local token is never
sent to another server). ``--to operator:<key>`` or ``harness:<key>`` picks the responder (default: the Router,
``operator:router``, which `loopd up` runs); a responder that is not connected gets the question all the same, and
the CLI says it waits.
The answer streams from the conversation's durable event log; a dropped connection is resumed from the last
cursor (``Last-Event-ID``), so nothing is lost or shown twice. A permission gate opened by the harness is asked in
the terminal (Approve / Always / Deny). Exit codes: 0 the answer completed, 1 it failed (or the server refused),
2 bad input or no server found, 130 Ctrl-C (the work goes on in the server; ``--conversation`` shows it again).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import httpx
import typer
from rich.console import Console
from rich.markup import escape

from loopd._infra.backoff import Backoff
from loopd._infra.errors import LoopdError
from loopd._infra.sse import read_sse
from loopd._paths import default_data_dir, read_server_file
from loopd.agentue import AgentUEError, StreamState, reduce
from loopd.cli._errors import cli_console, run_async
from loopd.cli._run_input import InputInterrupted, LineInput

ANSWER_BLOCK: Final = "answer"
DEFAULT_TARGET: Final = "operator:router"
GATE_PREFIX: Final = "gate/"
TOOL_PREFIX: Final = "tool/"
_RECONNECTS: Final = 20
_RECONNECT: Final = Backoff(base=0.4, factor=2.0, max_delay=3.0)
_WORK_POLL: Final = 0.3
"""Seconds between looks for the Task's work conversation (it appears with the responder's first harness call)."""
_ANSWERS: Final = {"a": "approve", "approve": "approve", "l": "always", "always": "always", "d": "deny", "deny": "deny"}


class ChatFailure(LoopdError):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Endpoint:
    url: str
    token: str | None


def find_server(
    server: str | None, data_dir: Path | None, env: dict[str, str] | None = None, *, token: str | None = None
) -> Endpoint:
    """The server URL and token from flags, the environment, or the data directory of a running `loopd up`."""
    source = dict(os.environ if env is None else env)
    token = token or source.get("LOOPD_TOKEN") or None
    url = (server or source.get("LOOPD_SERVER") or "").rstrip("/") or None
    directory = (data_dir or default_data_dir(source)).expanduser()
    if url is None or token is None:
        info = read_server_file(directory)
        if info is None:
            if url is None:
                raise ChatFailure(
                    f"no running loopd found in {directory}: start `loopd up` (or pass --server / set LOOPD_SERVER)",
                    code=2,
                )
        else:
            recorded = str(info.get("url") or "").rstrip("/") or None
            url = url or recorded
            # The local token goes only to the server that recorded it, unless --data-dir names the directory.
            if token is None and info.get("token_file") and (url == recorded or data_dir is not None):
                with contextlib.suppress(OSError):
                    token = Path(str(info["token_file"])).read_text().strip() or None
    if not url:
        raise ChatFailure("no server URL: pass --server or set LOOPD_SERVER", code=2)
    if token is None:
        raise ChatFailure(
            f"no token for {url}: pass --token TOKEN, set LOOPD_TOKEN, or pass --data-dir of the `loopd up` that "
            "serves it (its token is in <data dir>/resources-api/token)",
            code=2,
        )
    return Endpoint(url=url, token=token)


def parse_target(text: str) -> dict[str, str]:
    kind, _, key = text.partition(":")
    if kind not in ("harness", "operator") or not key:
        raise ChatFailure(f"--to takes harness:<key> or operator:<key>, not {text!r}", code=2)
    return {"kind": kind, "key": key}


def _error_text(response: httpx.Response) -> str:
    text = f"HTTP {response.status_code}"
    with contextlib.suppress(ValueError, KeyError, TypeError):
        error = response.json()["error"]
        text = f"{error['type']}: {error['message']}"
    if response.status_code == 401:
        text += "; pass the server's token with --token or LOOPD_TOKEN (or --data-dir of its `loopd up`)"
    return text


def describe_absence(target: dict[str, str], status: dict[str, Any], *, now: datetime | None = None) -> str | None:
    """The line saying a responder is not connected (None when it is), from ``GET /v1/actors/{kind}/{key}``."""
    if status.get("connected", True):
        return None
    name = f"{target['kind']}:{target['key']}"
    seen = "never seen"
    with contextlib.suppress(TypeError, ValueError):
        last = datetime.fromisoformat(str(status["last_seen"]))
        if last.tzinfo is None:
            last = last.replace(tzinfo=UTC)
        seen = f"last seen {last.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC, {_ago((now or datetime.now(UTC)) - last)}"
    return f"{name} is not connected ({seen}); the question waits for it"


def _ago(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 120:
        return f"{seconds}s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    if seconds < 172800:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} days ago"


@dataclass
class _View:
    """What has been shown of the response message so far."""

    console: Console
    out: Any
    state: StreamState | None = None
    shown_text: int = 0
    shown: str = ""
    """The answer text printed so far (a ``set`` that rewrites it, not only extends it, prints it again)."""
    tools: dict[str, str] = field(default_factory=dict)
    asked: set[str] = field(default_factory=set)
    final_status: str | None = None

    def apply(self, event: dict[str, Any]) -> None:
        try:
            self.state = reduce(self.state or StreamState(), event)
        except AgentUEError:
            return  # a duplicate after a reconnect, or something this client does not render

    def blocks(self) -> list[dict[str, Any]]:
        if self.state is None or self.state.model is None:
            return []
        return [b for b in self.state.model.to_json().get("blocks", []) if isinstance(b, dict)]

    def render_progress(self) -> list[dict[str, Any]]:
        """Print what is new; return gate blocks that wait for an answer."""
        pending: list[dict[str, Any]] = []
        for block in self.blocks():
            block_id = str(block.get("id", ""))
            if block_id == ANSWER_BLOCK:
                text = str(block.get("text") or block.get("content") or "")
                if text == self.shown:
                    continue
                if text.startswith(self.shown):
                    self.out.write(text[len(self.shown) :])
                else:  # rewritten (a model call re-issued after a restart said something else): show it anew
                    self.out.write("\n")
                    self.out.flush()
                    self.console.print("[dim]  (the answer was revised; here it is again)[/]")
                    self.out.write(text)
                self.out.flush()
                self.shown, self.shown_text = text, len(text)
            elif block_id.startswith(TOOL_PREFIX):
                status = str(block.get("status", ""))
                if self.tools.get(block_id) != status:
                    self.tools[block_id] = status
                    mark = {"running": "…", "completed": "✓", "failed": "✗"}.get(status, "·")
                    self.console.print(f"  [dim]{mark} {escape(str(block.get('name', 'tool')))} {escape(status)}[/]")
            elif block_id.startswith(GATE_PREFIX) and block.get("status") == "pending" and block_id not in self.asked:
                pending.append(block)
        return pending

    def final_text(self) -> str:
        for block in self.blocks():
            if block.get("type") == "result" and isinstance(block.get("content"), str):
                return str(block["content"])
        return ""

    def error(self) -> dict[str, Any] | None:
        if self.state is None or self.state.model is None:
            return None
        error = self.state.model.to_json().get("meta", {}).get("error")
        return error if isinstance(error, dict) else None


def _work_title(header: dict[str, Any], event: dict[str, Any]) -> str:
    """What a harness output in the work conversation is: its title (the call's effect key), else its id."""
    content = header.get("content") if isinstance(header.get("content"), dict) else None
    model = event.get("model") if isinstance(event.get("model"), dict) else content
    meta = (model or {}).get("meta") if isinstance(model, dict) else None
    title = meta.get("title") if isinstance(meta, dict) else None
    return str(title) if title else str(header.get("id", "output"))[-8:]


def _took(header: dict[str, Any], seen: float) -> float:
    """Seconds a message streamed: by the server's stamps (created → last update) when the header has them,
    else as this client saw it (a resumed view sees old messages end at once)."""
    try:
        created = datetime.fromisoformat(str(header["created_at"]))
        updated = datetime.fromisoformat(str(header["updated_at"]))
    except (KeyError, ValueError):
        return seen
    return max(0.0, (updated - created).total_seconds())


class ChatClient:
    def __init__(
        self, endpoint: Endpoint, console: Console, *, timeout: float = 30.0, http: httpx.AsyncClient | None = None
    ) -> None:
        headers = {"Accept": "application/json"}
        if endpoint.token:
            headers["Authorization"] = f"Bearer {endpoint.token}"
        self._http = http or httpx.AsyncClient(
            base_url=endpoint.url, headers=headers, timeout=httpx.Timeout(timeout, read=None)
        )
        self._console = console
        self._input = LineInput.for_stdin()
        self._work_id: str | None = None
        self._work_started: dict[str, tuple[str, float]] = {}  # harness message id → (its line's name, first seen)
        self._work_ended: set[str] = set()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _json(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            response = await self._http.request(method, path, json=body, timeout=30.0)
        except httpx.HTTPError as exc:
            raise ChatFailure(
                f"cannot reach loopd at {self._http.base_url} ({type(exc).__name__}: {exc}); is `loopd up` running?"
            ) from exc
        if response.status_code >= 400:
            raise ChatFailure(_error_text(response), code=2 if response.status_code in (400, 401, 404) else 1)
        return response.json()

    async def conversation(self, conversation_id: str | None, text: str) -> str:
        if conversation_id:
            await self._json("GET", f"/v1/conversations/{conversation_id}")
            return conversation_id
        created = await self._json("POST", "/v1/conversations", {"name": text[:60]})
        return str(created["id"])

    async def absence(self, target: dict[str, str]) -> str | None:
        """A line saying the target is not connected, or None (connected, or a server that cannot say)."""
        try:
            response = await self._http.get(f"/v1/actors/{target['kind']}/{target['key']}", timeout=10.0)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        with contextlib.suppress(ValueError, TypeError):
            status = response.json()
            if isinstance(status, dict):
                return describe_absence(target, status)
        return None

    async def ask(self, conversation_id: str, target: dict[str, str], text: str) -> dict[str, Any]:
        return dict(
            await self._json("POST", f"/v1/conversations/{conversation_id}/messages", {"target": target, "text": text})
        )

    async def follow(self, conversation_id: str, asked: dict[str, Any], view: _View) -> None:
        """Stream the response message until it ends, resuming from the last cursor after a dropped connection."""
        response_id = str(asked["response"]["id"])
        cursor = int(asked.get("cursor", 0))
        failures = 0
        while True:
            try:
                async with self._http.stream(
                    "GET",
                    f"/v1/conversations/{conversation_id}/stream",
                    headers={"Accept": "text/event-stream", "Last-Event-ID": str(cursor)},
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        raise ChatFailure(_error_text(response))
                    async for message in read_sse(response.aiter_text()):
                        failures = 0
                        if message.data is None:
                            continue
                        if message.event == "error":
                            raise httpx.ReadError("the server ended the stream")
                        if message.id is not None:
                            cursor = int(message.id)
                        data = json.loads(message.data)
                        if data.get("message_id") != response_id:
                            continue
                        event = data.get("event", {})
                        view.apply(event)
                        for gate in view.render_progress():
                            await self._answer_gate(gate, view)
                        if event.get("op") == "end":
                            header = data.get("message") or {}
                            view.final_status = str(header.get("status") or "completed")
                            return
            except (httpx.TransportError, httpx.RemoteProtocolError) as exc:
                failures += 1
                if failures > _RECONNECTS:
                    raise ChatFailure(f"lost the server: {exc}") from exc
                self._console.print(f"[dim]  connection lost ({exc.__class__.__name__}); resuming…[/]")
                await asyncio.sleep(_RECONNECT.after_failures(failures))

    async def follow_work(self, task_id: str) -> None:
        """Show the Task's work conversation as it happens: a line when each harness call starts and when it ends
        (calls that run in parallel show as several started lines before their ended lines). Runs until cancelled;
        a failure here only ends this view, never the answer."""
        work_id: str | None = None
        while work_id is None:
            try:
                found = await self._json("GET", f"/v1/conversations?task_id={task_id}")
            except ChatFailure:
                return
            data = found.get("data") if isinstance(found, dict) else None
            if data:
                work_id = str(data[0]["id"])
                break
            await asyncio.sleep(_WORK_POLL)
        self._work_id = work_id
        started, ended = self._work_started, self._work_ended
        cursor = 0
        loop = asyncio.get_running_loop()
        for _attempt in range(_RECONNECTS):
            try:
                async with self._http.stream(
                    "GET",
                    f"/v1/conversations/{work_id}/stream",
                    headers={"Accept": "text/event-stream", "Last-Event-ID": str(cursor)},
                ) as response:
                    if response.status_code >= 400:
                        return
                    async for message in read_sse(response.aiter_text()):
                        if message.data is None or message.event == "error":
                            continue
                        if message.id is not None:
                            cursor = int(message.id)
                        data = json.loads(message.data)
                        header = data.get("message") or {}
                        event = data.get("event") or {}
                        message_id = str(data.get("message_id", ""))
                        if header.get("kind") != "harness" or event.get("op") not in ("start", "end"):
                            continue
                        if event["op"] == "start" and message_id not in started:
                            name = f"{header.get('key', 'harness')} · {_work_title(header, event)}"
                            started[message_id] = (name, loop.time())
                            self._console.print(f"  [dim]… {escape(name)}[/]")
                        elif event["op"] == "end" and message_id in started and message_id not in ended:
                            name, since = started[message_id]
                            ended.add(message_id)
                            self._print_work_end(name, header, _took(header, loop.time() - since))
            except (httpx.TransportError, httpx.RemoteProtocolError, ValueError, KeyError, TypeError):
                await asyncio.sleep(_WORK_POLL)

    def _print_work_end(self, name: str, header: dict[str, Any], took: float) -> None:
        mark = "✓" if header.get("status") == "completed" else "✗"
        shown = f"{took * 1000:.0f} ms" if took < 1 else f"{took:.1f} s"
        self._console.print(f"  [dim]{mark} {escape(name)} ({shown})[/]")

    async def finish_work(self, task_id: str) -> None:
        """Once the answer has ended: the lines the live view (`follow_work`) has not shown yet — a fast answer can
        end before that view caught up — in the order the calls started. Best effort, like the live view."""
        try:
            work_id = self._work_id
            if work_id is None:
                found = await self._json("GET", f"/v1/conversations?task_id={task_id}")
                data = found.get("data") if isinstance(found, dict) else None
                if not data:
                    return
                work_id = str(data[0]["id"])
            page = await self._json("GET", f"/v1/conversations/{work_id}/messages?limit=200")
            headers = [h for h in page.get("data") or () if isinstance(h, dict)] if isinstance(page, dict) else []
        except (ChatFailure, ValueError, KeyError, TypeError):
            return
        for header in headers:
            message_id = str(header.get("id", ""))
            if header.get("kind") != "harness" or message_id in self._work_ended:
                continue
            name = f"{header.get('key', 'harness')} · {_work_title(header, {})}"
            if message_id not in self._work_started:
                self._work_started[message_id] = (name, 0.0)
                self._console.print(f"  [dim]… {escape(name)}[/]")
            if header.get("status") in ("pending", "streaming"):
                continue
            self._work_ended.add(message_id)
            self._print_work_end(self._work_started[message_id][0], header, _took(header, 0.0))

    async def _answer_gate(self, block: dict[str, Any], view: _View) -> None:
        block_id = str(block["id"])
        view.asked.add(block_id)
        gate_id = block_id[len(GATE_PREFIX) :]
        call_id = block.get("call_id")
        title = str(block.get("title", "")).strip()
        shown = "" if title.lower() in ("", "permission needed") else f" {escape(title)}"
        self._console.print(f"\n[bold yellow]permission needed[/]{shown}")
        self._console.print(escape(str(block.get("prompt", ""))))
        if not call_id:
            self._console.print("[red]  this server does not say which call asked; answer in the web UI[/]")
            return
        answer = "deny"
        if self._input.interactive:
            self._input.discard_pending()
            while True:
                self._console.print(escape("  [a]pprove once / a[l]ways / [d]eny: "), end="")
                try:
                    line = await self._input.readline()
                except InputInterrupted:
                    line = None
                if line is None:
                    break
                picked = _ANSWERS.get(line.strip().lower())
                if picked is not None:
                    answer = picked
                    break
        else:
            self._console.print("  stdin is not a terminal: denying")
        try:
            await self._json("POST", f"/v1/harness/calls/{call_id}/gates/{gate_id}", {"answer": answer})
        except ChatFailure as exc:
            self._console.print(f"[red]  the answer was not taken: {escape(str(exc))}[/]")
            return
        self._console.print(f"  [dim]answered {answer}[/]")


async def run_chat(
    endpoint: Endpoint, text: str, target: dict[str, str], conversation_id: str | None, console: Console, out: Any
) -> int:
    client = ChatClient(endpoint, console)
    try:
        cid = await client.conversation(conversation_id, text)
        asked = await client.ask(cid, target, text)
        console.print(f"[dim]conversation {cid} · task {asked['task_id']} · continue with --conversation {cid}[/]")
        absent = await client.absence(target)
        if absent is not None:
            console.print(f"[yellow]{escape(absent)}[/] [dim](Ctrl-C stops watching; the question stays)[/]")
        view = _View(console=console, out=out)
        if target.get("kind") == "operator":  # an operator's harness calls: shown as they start and end
            async with asyncio.TaskGroup() as group:
                work = group.create_task(client.follow_work(str(asked["task_id"])), name="loopd-chat-work")
                try:
                    await client.follow(cid, asked, view)
                finally:
                    work.cancel()
            await client.finish_work(str(asked["task_id"]))
        else:
            await client.follow(cid, asked, view)
        if view.shown_text == 0 and view.final_text():
            out.write(view.final_text())
        out.write("\n")
        out.flush()
        error = view.error()
        if view.final_status != "completed" or error is not None:
            detail = f"{error.get('code')}: {error.get('message')}" if error else view.final_status
            console.print(f"[red]the answer failed[/] ({escape(str(detail))})")
            return 1
        return 0
    finally:
        await client.aclose()


def chat_command(
    text: str = typer.Argument(..., help="What to ask."),
    server: str | None = typer.Option(None, "--server", help="Server URL (default: $LOOPD_SERVER or the local one)."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="Data directory of the local `loopd up`."),
    token: str | None = typer.Option(
        None,
        "--token",
        help=(
            "Bearer token of the server (default: $LOOPD_TOKEN, else the token of the `loopd up` in --data-dir). "
            "Other local users can see command lines: prefer LOOPD_TOKEN."
        ),
    ),
    to: str = typer.Option(
        DEFAULT_TARGET,
        "--to",
        help="Who answers: operator:<key> or harness:<key> (default: the Router, which plans the work and asks the "
        "built-in assistant; --to harness:assistant asks the assistant directly; --to operator:longhorizon works a "
        "longer task in rounds: a Manager plans, an Executor works in the Run's workspace, an Auditor checks it).",
    ),
    conversation: str | None = typer.Option(None, "--conversation", help="Continue this conversation."),
) -> None:
    """Ask a responder through a running loopd and stream the answer.

    loopd chat "Introduce Liu Bei, Guan Yu, and Zhang Fei"
    loopd chat --to operator:longhorizon "Create hello.txt containing hello world"
    loopd chat --to harness:assistant "list files"
    """
    console = cli_console()
    if not text.strip():
        console.print("[red]nothing to ask[/]")
        raise typer.Exit(code=2)
    try:
        endpoint = find_server(server, data_dir, token=token)
        target = parse_target(to)
    except ChatFailure as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(code=exc.code) from exc
    code = run_async(_main(endpoint, text, target, conversation, console))
    raise typer.Exit(code=code)


async def _main(
    endpoint: Endpoint, text: str, target: dict[str, str], conversation: str | None, console: Console
) -> int:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, task.cancel)
    try:
        return await run_chat(endpoint, text, target, conversation, console, sys.stdout)
    except ChatFailure as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        return exc.code
    except asyncio.CancelledError:
        console.print("\n[dim]stopped watching; the work goes on in the server[/]")
        return 130
