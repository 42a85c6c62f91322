"""Shared pieces of the loop-server benchmarks: a `loopd up` subprocess, a light SSE client, /proc readings.

* `running_server(directory)`: starts ``loopd up --port 0 --data-dir <directory>/data`` in a child process (with a
  raised open-file limit), waits for its ``server.json``, yields where it listens and its token, and stops it by
  its pid (SIGTERM, then SIGKILL after a grace period);
* `open_event_stream(...)`: one HTTP/1.1 request on a raw asyncio connection whose response is
  ``text/event-stream``; `EventStream.frames()` yields each SSE message's bytes. Raw streams keep a client process
  able to hold hundreds of connections without the client library dominating the measurement;
* `Api`: the JSON calls the benchmarks make (conversations, the operator registry, chat, the Task API), on httpx;
* `rss_kb`, `cpu_seconds`: VmRSS and utime+stime of a process, from /proc.

Loopback only; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final
from urllib.parse import urlsplit

import httpx

from benchmarks._busy import children_map, descendants, stat_ticks
from benchmarks._children import spawn
from benchmarks._stacks import is_idle, read, render, stacks

START_TIMEOUT: Final = 60.0
STOP_TIMEOUT: Final = 20.0
OPERATOR: Final = "bench"

_LAUNCH = (
    "import resource, sys\n"
    "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
    "want = hard if hard != resource.RLIM_INFINITY else 65536\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(want, 65536)), hard))\n"
    "from loopd.cli import main\n"
    "sys.argv[0] = 'loopd'\n"
    "sys.exit(main())\n"
)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5 - 1e-9)))
    return ordered[rank - 1]


def raise_open_files(wanted: int) -> int:
    """Raise this process's soft open-file limit to at least ``wanted`` (within the hard limit); the new soft."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def rss_kb(pid: int) -> int:
    """The resident set size of process ``pid`` in KiB (``VmRSS`` of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used so far (/proc/<pid>/stat)."""
    return stat_ticks(pid, reaped=False) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """`cpu_seconds` of ``pid`` and of every live process below it (a server that runs its work in child processes,
    e.g. a reloader's worker, is counted whole). A process that ends meanwhile is skipped."""
    total = 0.0
    for member in descendants(pid, children_map()):
        try:
            total += cpu_seconds(member)
        except (OSError, ValueError):
            continue
    return total


# --- the server process ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerProcess:
    url: str
    host: str
    port: int
    token: str
    pid: int
    data_dir: Path

    def rss_kb(self) -> int:
        return rss_kb(self.pid)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)


@contextlib.contextmanager
def running_server(
    directory: Path,
    *,
    extra_args: Sequence[str] = (),
    command_name: str = "up",
    env: Mapping[str, str] | None = None,
) -> Iterator[ServerProcess]:
    """`loopd up` (or ``command_name``, e.g. ``server``) on a free loopback port with its data in
    ``directory/data``, stopped (by pid) on exit; ``env``: more environment variables for it."""
    data_dir = directory / "data"
    log = (directory / "server.log").open("wb")
    command = [sys.executable, "-c", _LAUNCH, command_name, "--port", "0", "--data-dir", str(data_dir), *extra_args]
    child_env = {**os.environ, "LOOPD_MODEL": "demo", "COLUMNS": "200", **(env or {})}
    child = spawn(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env)
    try:
        server = _wait_for_server(child, data_dir, directory / "server.log")
        yield server
    finally:
        _stop(child)
        log.close()


def _wait_for_server(child: subprocess.Popen[bytes], data_dir: Path, log: Path) -> ServerProcess:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"loopd up exited {child.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(OSError, ValueError):
            info = json.loads((data_dir / "server.json").read_text())
            if info.get("pid") == child.pid:
                url = str(info["url"])
                parts = urlsplit(url)
                token = Path(info["token_file"]).read_text().strip()
                return ServerProcess(url, parts.hostname or "127.0.0.1", parts.port or 80, token, child.pid, data_dir)
        time.sleep(0.05)
    raise RuntimeError(f"loopd up did not write {data_dir / 'server.json'} within {START_TIMEOUT:g} s")


@dataclass(frozen=True)
class ModelServer:
    """The demo model served on its own (an OpenAI-compatible server in another process): its base URL and pid."""

    base_url: str
    pid: int


@contextlib.contextmanager
def running_model_server(directory: Path, *, chunk_delay: float) -> Iterator[ModelServer]:
    """loopd's demo model as a standalone OpenAI-compatible server (``python -m
    loopd.harness.models._scripted_server``) on a free loopback port, streaming a piece every ``chunk_delay``
    seconds; stopped by its pid on exit. Point a server at it with ``LOOPD_MODEL``, ``OPENAI_BASE_URL`` and
    ``OPENAI_API_KEY`` (any value)."""
    log_path = directory / "model.log"
    log = log_path.open("wb")
    command = [
        sys.executable,
        "-m",
        "loopd.harness.models._scripted_server",
        "--port",
        "0",
        "--chunk-delay",
        f"{chunk_delay:g}",
    ]
    child = spawn(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            found = re.search(r"on (http://\S+/v1)", log_path.read_text(errors="replace"))
            if found:
                break
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the demo model server did not start:\n{log_path.read_text(errors='replace')}")
            time.sleep(0.05)
        yield ModelServer(found.group(1), child.pid)
    finally:
        _stop(child)
        log.close()


def _stop(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is not None:
        return
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(STOP_TIMEOUT)


# --- a raw SSE client --------------------------------------------------------------------------------------


class StreamRefused(RuntimeError):
    """The server answered the stream request with something other than 200 text/event-stream."""


class EventStream:
    """One open ``text/event-stream`` response on its own connection (see `open_event_stream`)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, chunked: bool) -> None:
        self._reader = reader
        self._writer = writer
        self._chunked = chunked

    async def frames(self) -> AsyncIterator[bytes]:
        """Each SSE message (the bytes between blank lines, comments included) until the response ends; CRLF line
        ends (some peers' servers) are read as LF."""
        buffer = b""
        async for data in self._body():
            buffer += data
            if b"\r" in buffer:
                buffer = buffer.replace(b"\r\n", b"\n")  # a CR at the end waits for its LF in the next data
            while (end := buffer.find(b"\n\n")) >= 0:
                yield buffer[:end]
                buffer = buffer[end + 2 :]

    async def _body(self) -> AsyncIterator[bytes]:
        if not self._chunked:
            while data := await self._reader.read(65536):
                yield data
            return
        while True:
            line = await self._reader.readline()
            if not line:
                return  # the connection closed mid-body
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                return
            chunk = await self._reader.readexactly(size + 2)
            yield chunk[:-2]

    async def aclose(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(self._writer.wait_closed(), 5.0)

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


async def open_event_stream(
    host: str,
    port: int,
    path: str,
    *,
    token: str,
    method: str = "GET",
    body: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> EventStream:
    """Send one request and read its response head; a 200 event stream is returned, anything else raises."""
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        try:
            payload = b"" if body is None else json.dumps(body).encode()
            lines = [
                f"{method} {path} HTTP/1.1",
                f"Host: {host}:{port}",
                f"Authorization: Bearer {token}",
                "Accept: text/event-stream",
                *(f"{name}: {value}" for name, value in (headers or {}).items()),
            ]
            if body is not None:
                lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status_line, *header_lines = head.decode("latin-1").split("\r\n")
            status = int(status_line.split()[1])
            fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
            if status != 200 or not fields.get("content-type", "").startswith("text/event-stream"):
                rest = await asyncio.wait_for(reader.read(4096), 2.0)
                raise StreamRefused(f"{method} {path}: {status_line} {rest[:500]!r}")
        except BaseException:
            writer.close()
            raise
    return EventStream(reader, writer, chunked="chunked" in fields.get("transfer-encoding", "").lower())


def frame_data(frame: bytes) -> tuple[str | None, str | None, Any]:
    """``(id, event, data)`` of one SSE message (``data`` decoded from JSON; None for a comment)."""
    event_id: str | None = None
    event: str | None = None
    data: list[bytes] = []
    for line in frame.split(b"\n"):
        if line.startswith(b"data:"):
            data.append(line[5:].lstrip(b" "))
        elif line.startswith(b"id:"):
            event_id = line[3:].strip().decode()
        elif line.startswith(b"event:"):
            event = line[6:].strip().decode()
    return event_id, event, json.loads(b"\n".join(data)) if data else None


# --- JSON calls --------------------------------------------------------------------------------------------


class Api:
    """The server's JSON API as the benchmarks use it (one httpx client, bounded timeouts)."""

    def __init__(self, server: ServerProcess, *, connections: int = 100, timeout: float = 30.0) -> None:
        self.server = server
        self._client = httpx.AsyncClient(
            base_url=server.url,
            headers={"Authorization": f"Bearer {server.token}"},
            timeout=timeout,
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> Api:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _json(self, method: str, path: str, body: Any = None, *, actor: str | None = None) -> Any:
        headers = {"X-Loopd-Actor": actor} if actor else {}
        response = await self._client.request(method, path, json=body, headers=headers)
        if response.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:500]}")
        return response.json()

    async def create_conversation(self, name: str) -> str:
        return str((await self._json("POST", "/v1/conversations", {"name": name}))["id"])

    async def register_operator(self, key: str = OPERATOR) -> None:
        body = {"display_name": "Benchmark", "lease_seconds": 300}
        await self._json("PUT", f"/v1/operators/{key}", body, actor=f"operator:{key}")

    async def ask(self, conversation_id: str, kind: str, key: str, text: str) -> dict[str, Any]:
        body = {"target": {"kind": kind, "key": key}, "text": text}
        result = await self._json("POST", f"/v1/conversations/{conversation_id}/messages", body)
        return dict(result)

    async def emit(self, task_id: str, events: list[dict[str, Any]], *, operator: str = OPERATOR) -> dict[str, Any]:
        body = {"events": events}
        return dict(await self._json("POST", f"/v1/tasks/{task_id}/events", body, actor=f"operator:{operator}"))

    async def complete(self, task_id: str, *, operator: str = OPERATOR) -> None:
        await self._json("POST", f"/v1/tasks/{task_id}/complete", {}, actor=f"operator:{operator}")


def now() -> float:
    """The benchmarks' clock: CLOCK_MONOTONIC, the same in every process of the machine (Linux)."""
    return time.monotonic()


# --- sampling the server process (py-spy, when installed) -------------------------------------------------


def py_spy() -> Path | None:
    """The py-spy next to this interpreter, if installed (``pip install py-spy``)."""
    candidate = Path(sys.executable).parent / "py-spy"
    return candidate if candidate.exists() else None


@contextlib.contextmanager
def sampling(pid: int, out: Path | None, seconds: float, *, summary: bool = True) -> Iterator[None]:
    """Sample process ``pid`` with py-spy for ``seconds`` (all threads) into ``out`` (collapsed stacks) while the
    block runs, then print where its CPU went (``summary``); nothing when ``out`` is None. The sampler is a child of
    this process, stopped by its pid."""
    spy = py_spy()
    if out is None:
        yield
        return
    if spy is None:
        print("  (py-spy is not installed: no profile)", flush=True)
        yield
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [str(spy), "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))), "--rate", "250"]
    # Pausing the process for each sample (py-spy's default) costs it a little time but gives whole stacks, which the
    # breakdown by stage needs (--nonblocking cut about a third of them short); a profiled run is never quoted for
    # its timings anyway.
    command += ["--format", "raw", "--output", str(out)]
    sampler = spawn(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        try:
            sampler.wait(seconds + 30)
        except subprocess.TimeoutExpired:
            sampler.kill()
            sampler.wait(10)
    if out.exists() and summary:
        print(render(read([out]), str(out)), flush=True)
        print(summarize_stacks(out), flush=True)


def summarize_stacks(path: Path, top: int = 25) -> str:
    """The busiest functions in py-spy's collapsed stacks: own ("self") samples and, for loopd code, inclusive (shares
    of the busy samples: a thread waiting for work is left out, as in `benchmarks._stacks`)."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for frames, samples in stacks(path.read_text().splitlines()):
        if is_idle(frames):
            continue
        total += samples
        own[frames[-1]] = own.get(frames[-1], 0) + samples
        for frame in set(frames):
            if "loopd/" in frame:
                inclusive[frame] = inclusive.get(frame, 0) + samples
    if not total:
        return f"{path}: no samples"

    def ranked(table: dict[str, int]) -> list[str]:
        best = sorted(table.items(), key=lambda item: -item[1])[:top]
        return [f"  {n / total:6.1%}  {frame}" for frame, n in best]

    lines = [f"profile {path} ({total} busy samples, all threads)", " own time:", *ranked(own)]
    lines += [" inclusive, loopd functions:", *ranked(inclusive)]
    return "\n".join(lines)
