"""What the web UI's browser tests share: Debian's chromium through Playwright (never a downloaded browser), a real
`loopd up` on a fixed loopback port (so a page survives a restart), a paced scripted model, and page helpers over
the ``data-testid`` selectors of the UI contract.

The model runs in a thread of the test process (an OpenAI-compatible `ScriptedServer` on loopback): it answers like
the demo model with the Router's demo rules (`loopd up`'s own setup), but its streaming pace is the test's to set
(`PacedModel.pace`), so a test can cut the network or kill the server while an answer streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Browser, BrowserContext, Locator, Page, Playwright, expect

from loopd.harness.models import DemoOptions, ScriptedServer, ServerReply, demo_reply
from loopd.harness.models._scripted_server import IncomingRequest
from loopd.operators.longhorizon import demo_rules as longhorizon_rules
from loopd.operators.router import demo_rules
from loopd.server.webui import DIST_DIR
from tests.e2e.conftest import UpProcess, env_for, start_up
from tests.support.availability import missing
from tests.support.model_thread import scripted_model_thread
from tests.support.waiting import wait_until

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
ASKER = Path(__file__).resolve().parent / "asker.py"
API_KEY = f"sk-web-{secrets.token_hex(8)}"
QUESTION = "Introduce Liu Bei, Guan Yu, and Zhang Fei"
HEROES = ("Liu Bei", "Guan Yu", "Zhang Fei")
NOTE = "remember the milk"
UI_TIMEOUT_MS = 30_000
expect.set_options(timeout=UI_TIMEOUT_MS)  # a loaded CI machine: conditions, never sleeps, bound every wait


# --- preconditions ----------------------------------------------------------------------------------------------


def chromium_executable() -> str:
    """Debian's chromium (``$LOOPD_CHROMIUM`` overrides); missing → skip locally, fail under CI=true."""
    for candidate in (os.environ.get("LOOPD_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    missing("Debian's chromium is not installed (apt-get install chromium)")
    raise AssertionError("unreachable")


def require_built_page() -> None:
    """The built page must be there (``make web``, which ``make test`` runs first)."""
    if not (DIST_DIR / "index.html").is_file():
        missing(f"the web UI is not built ({DIST_DIR} is empty): run make web")


def launch(playwright: Playwright) -> Browser:
    """Headless Debian chromium (``--no-sandbox``: tests run as root in CI)."""
    return playwright.chromium.launch(
        executable_path=chromium_executable(), headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"]
    )


# --- the model --------------------------------------------------------------------------------------------------


RULES = (*demo_rules(), *longhorizon_rules())
"""Both operators' demo answers, as `loopd up` gives its demo model."""


@dataclass
class PacedModel:
    """The scripted model's base URL; ``pace`` sets how its answers stream (seconds between chunks, chunk size)."""

    base_url: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    chunk_delay: float = 0.0
    chunk_size: int = 12
    extra: Callable[[IncomingRequest], ServerReply | None] | None = None
    """A rule tried before the demo's (e.g. the benchmark's long answer)."""

    def pace(self, chunk_delay: float, chunk_size: int = 12) -> None:
        with self.lock:
            self.chunk_delay, self.chunk_size = chunk_delay, chunk_size

    def options(self) -> DemoOptions:
        with self.lock:
            return DemoOptions(rules=RULES, chunk_delay=self.chunk_delay, chunk_size=self.chunk_size)

    def env(self) -> dict[str, str]:
        """What `loopd up` needs to use this model (a priced model id: the ledger shows USD)."""
        return {"LOOPD_MODEL": "gpt-4o-mini", "OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": API_KEY}


@contextlib.contextmanager
def paced_model() -> Iterator[PacedModel]:
    """A scripted model in a thread, answering like `loopd up`'s demo model at the pace the test sets."""
    holder: list[PacedModel] = []

    def rule(request: IncomingRequest) -> ServerReply:
        if holder and holder[0].extra is not None and (reply := holder[0].extra(request)) is not None:
            return reply
        options = holder[0].options() if holder else DemoOptions(rules=RULES)
        return demo_reply(request, options)

    with scripted_model_thread(ScriptedServer(rule, api_key=API_KEY), name="web-model") as base_url:
        holder.append(PacedModel(base_url))
        yield holder[0]


# --- loopd up ---------------------------------------------------------------------------------------------------


@dataclass
class WebServer:
    """A `loopd up` behind a `Relay` (the URL the browser uses), restartable on the same data directory."""

    root: Path
    model: PacedModel
    relay: Relay
    up: UpProcess | None = None
    starts: int = 0

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        """What the browser opens: the relay."""
        return self.relay.url

    @property
    def workspace(self) -> Path:
        """The built-in assistant's workspace (next to the data directory)."""
        return self.root / "data-workspaces" / "assistant"

    def start(self) -> UpProcess:
        self.starts += 1
        self.up = start_up(self.data_dir, self.root, f"up-{self.starts}", env=self.model.env())
        self.relay.retarget(int(self.up.url.rsplit(":", 1)[1]))
        return self.up

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.up is not None:
            self.up.kill(sig)

    def client(self) -> httpx.Client:
        """An admin client straight to the server (not through the relay)."""
        assert self.up is not None
        return self.up.client()


@contextlib.contextmanager
def web_server(root: Path) -> Iterator[WebServer]:
    """The paced model, a relay and a started `loopd up` behind it, for a module; the page must be built."""
    require_built_page()
    with paced_model() as model, Relay(0) as relay:
        server = WebServer(root, model, relay)
        server.workspace.mkdir(parents=True, exist_ok=True)
        (server.workspace / "notes.txt").write_text(NOTE + "\n")
        server.start()
        try:
            yield server
        finally:
            server.kill(signal.SIGTERM)


@contextlib.contextmanager
def asker_operator(server: WebServer) -> Iterator[None]:
    """tests/web/asker.py registered as ``operator:asker`` for the block."""
    log = server.root / "asker.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, str(ASKER), "--data-dir", str(server.data_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env_for(server.data_dir),
        )
    try:
        with server.client() as http:

            def registered() -> bool:
                if process.poll() is not None:
                    raise AssertionError(f"asker.py exited with {process.returncode}:\n{log.read_text()}")
                return bool(http.get("/v1/actors/operator/asker").json().get("connected"))

            wait_until(registered, timeout=30, what="asker.py to register")
        yield
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(timeout=30)


# --- pages ------------------------------------------------------------------------------------------------------


def tid(name: str) -> str:
    return f'[data-testid="{name}"]'


def screenshot(page: Page, name: str) -> Path:
    """Save a full-page screenshot under tests/web/artifacts/ (git-ignored)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / (re.sub(r"[^A-Za-z0-9_.-]+", "-", name) + ".png")
    page.screenshot(path=str(path), full_page=True)
    return path


def open_page(context: BrowserContext, url: str) -> Page:
    """A new page on the UI, once its picker lists the Router (the page is interactive)."""
    page = context.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    page.goto(url)
    expect(page.locator(f'{tid("actor-picker")} option[value="operator:router"]')).to_have_count(1)
    return page


def new_conversation(page: Page) -> str:
    """Click "new conversation"; the id of the conversation that becomes active."""
    items = page.locator(tid("conversation-item"))
    before = set(items.evaluate_all("els => els.map(e => e.dataset.conversationId)"))
    page.locator(tid("new-conversation")).click()
    active = page.locator(f'{tid("conversation-item")}[aria-current="true"]')
    wait_until(
        lambda: active.count() == 1 and active.get_attribute("data-conversation-id") not in before,
        timeout=15,
        what="the new conversation to become active",
    )
    return str(active.get_attribute("data-conversation-id"))


def send(page: Page, target: str, text: str) -> None:
    """Pick ``target`` (e.g. ``operator:router``) and send ``text`` with Enter."""
    page.locator(tid("actor-picker")).select_option(target)
    box = page.locator(tid("composer-input"))
    box.fill(text)
    box.press("Enter")


CHAT = ':is([data-testid="chat-pane"], #pane-chat)'
"""The chat pane (not the detail panel, whose messages carry the same ``message`` testid)."""


def answers(page: Page) -> Locator:
    """The answers (``response`` messages) of the chat pane."""
    return page.locator(f'{CHAT} {tid("message")}[data-role="response"]')


def questions(page: Page) -> Locator:
    """The user's own messages in the chat pane."""
    return page.locator(f'{CHAT} {tid("message")}[data-author^="user:"]')


def badge(page: Page, status: str) -> Locator:
    """The chat pane's status badges saying ``status`` (``.last``: the latest Task's)."""
    return page.locator(f'{CHAT} {tid("status-badge")}[data-status="{status}"]')


def select(message: Locator) -> None:
    """Point the detail panel at this message's Task (its "Details" button)."""
    message.get_by_role("button", name=re.compile(r"show the work", re.I)).click()


def message_text(message: Locator) -> str:
    """The rendered text blocks of one message, whitespace collapsed."""
    return " ".join(" ".join(message.locator(tid("message-text")).all_inner_texts()).split())


def cookie_client(context: BrowserContext, url: str) -> httpx.Client:
    """An HTTP client with the browser context's identity cookie (reads only: no Origin)."""
    cookies = {c["name"]: c["value"] for c in context.cookies(url) if c["name"] == "loopd-human"}
    return httpx.Client(base_url=url, cookies=cookies, timeout=15.0)


def stored_answer(context: BrowserContext, url: str, conversation_id: str, message_id: str) -> dict[str, Any]:
    """The response message as the server stores it (read with the browser's own cookie)."""
    with cookie_client(context, url) as http:
        snapshot = http.get(f"/v1/conversations/{conversation_id}/snapshot")
        assert snapshot.status_code == 200, snapshot.text
        return dict(next(m for m in snapshot.json()["messages"] if m["id"] == message_id))


def text_of_blocks(message: dict[str, Any]) -> str:
    """The text blocks' content of a stored message, whitespace collapsed."""
    texts = [str(b.get("content", "")) for b in message["content"]["blocks"] if b.get("type") == "text"]
    return " ".join(" ".join(texts).split())


# --- a cuttable network ------------------------------------------------------------------------------------------


class Relay:
    """A TCP relay on loopback in front of `loopd up` (in a thread): the browser talks to it, so a test can cut
    every connection and refuse new ones (``cut``), then let traffic through again (``restore``), and point it at a
    restarted server (``target``). Bytes pass unchanged (Host, Origin and cookies stay the browser's)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._open = True
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), name="web-relay", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Relay:
        self._thread.start()
        if not self._ready.wait(10):
            raise AssertionError("the relay did not start")
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def cut(self) -> None:
        """Drop every open connection now and refuse new ones until `restore`."""
        self._call(self._cut)

    def restore(self) -> None:
        self._call(lambda: setattr(self, "_open", True))

    def retarget(self, port: int) -> None:
        self._call(lambda: setattr(self, "target_port", port))

    def _call(self, action: Any) -> None:
        assert self._loop is not None
        done = threading.Event()

        def run() -> None:
            try:
                action()
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        if not done.wait(10):
            raise AssertionError("the relay did not answer")

    def _cut(self) -> None:
        self._open = False
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(server.sockets[0].getsockname()[1])
        self._ready.set()
        async with server:
            await self._stop.wait()
            self._cut()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._open:
            writer.transport.abort()
            return
        try:
            async with asyncio.timeout(5):
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except (OSError, TimeoutError):
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(_pipe(reader, up_writer))
                group.create_task(_pipe(up_reader, writer))
        except* (OSError, ConnectionError):
            pass
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.transport.abort()
