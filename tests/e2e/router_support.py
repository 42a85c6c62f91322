"""What the Router's end-to-end tests share: a standalone `loopd operator router` process, a scripted (slow) model
that answers the Router's prompts and counts the requests per effect key, and reads of a Task's trail.

The model runs in a thread of the test process (an OpenAI-compatible `ScriptedServer` on loopback); `loopd up` uses
it through ``LOOPD_MODEL`` / ``OPENAI_BASE_URL``. Its replies come from the Router's demo rules (the ones `loopd up`
gives the demo model), so the plan, the work and the synthesis are the same as with the demo model; only the work
calls are slowed down, so a test can kill a process while they run.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import ssl
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from loopd.harness.models import DemoOptions, ScriptedServer, ServerReply, demo_reply
from loopd.harness.models._scripted_server import IncomingRequest
from loopd.operators.router import PLAN_HEADER, REPLAN_HEADER, SUMMARIZE_HEADER, WORK_HEADER, demo_rules
from tests.support.model_thread import scripted_model_thread
from tests.support.titles import is_title_request, title_reply
from tests.support.waiting import wait_until

from .conftest import LOOPD, UpProcess, env_for

API_KEY = f"sk-e2e-{secrets.token_hex(8)}"
QUESTION = "Introduce Liu Bei, Guan Yu, and Zhang Fei"
HEROES = ("Liu Bei", "Guan Yu", "Zhang Fei")
LEASE_SECONDS = 4.0
"""The standalone Routers' lease: a standby takes over this long after the leader last renewed."""


# --- the model --------------------------------------------------------------------------------------------------


def effect_of(request: IncomingRequest) -> str:
    """Which of the Router's steps a model request belongs to: ``plan``, ``work/<hero>``, ``summarize`` or ``other``.

    Read from the prompt's header line (the Router's prompts each start with their own), and for a work prompt from
    its ``Task:`` section (the one hero it is about).
    """
    text = request.last_user_text
    if PLAN_HEADER in text or REPLAN_HEADER in text:
        return "plan"
    if SUMMARIZE_HEADER in text:
        return "summarize"
    if WORK_HEADER in text:
        task = text.rsplit("\nTask:", 1)[-1]
        named = [hero for hero in HEROES if hero in task]
        return f"work/{named[0]}" if len(named) == 1 else f"work/{task.strip()[:40]}"
    return "other"


@dataclass
class RouterModel:
    """The scripted model's base URL, and what it was asked (per effect key)."""

    base_url: str
    server: ScriptedServer
    lock: threading.Lock = field(default_factory=threading.Lock)
    asked: Counter[str] = field(default_factory=Counter)

    def count(self, effect: str) -> None:
        with self.lock:
            self.asked[effect] += 1

    def counts(self) -> dict[str, int]:
        with self.lock:
            return dict(self.asked)

    def env(self) -> dict[str, str]:
        """What `loopd up` needs to use this model."""
        return {"LOOPD_MODEL": "gpt-4o-mini", "OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": API_KEY}


def router_reply(request: IncomingRequest) -> str:
    """The demo model's answer to ``request``, with the Router's rules first (as `loopd up` configures it)."""
    return demo_reply(request, DemoOptions(rules=tuple(demo_rules()))).text


@contextlib.contextmanager
def router_model(*, work_delay: float = 0.0) -> Iterator[RouterModel]:
    """A scripted model answering the Router's prompts; each work call's reply waits ``work_delay`` seconds."""
    holder: list[RouterModel] = []

    def rule(request: IncomingRequest) -> ServerReply:
        if is_title_request(request):  # the conversation's title: not one of the Router's steps
            return title_reply()
        effect = effect_of(request)
        if holder:
            holder[0].count(effect)
        delay = work_delay if effect.startswith("work/") else 0.0
        return ServerReply(text=router_reply(request), delay=delay)

    server = ScriptedServer(rule, api_key=API_KEY)

    with scripted_model_thread(server, name="router-model") as base_url:
        holder.append(RouterModel(base_url, server))
        yield holder[0]


# --- a standalone Router ----------------------------------------------------------------------------------------


@dataclass
class RouterProcess:
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal this process (by its pid) and wait for it."""
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)
        self.process.wait(timeout=30)


def start_router(
    up: UpProcess, tmp_path: Path, name: str = "router", *, args: Sequence[str] = (), lease_name: str | None = None
) -> RouterProcess:
    """``loopd operator router --data-dir <up's>`` with a short lease (info logs: the log says when it leads)."""
    log = tmp_path / f"{name}.log"
    command = [LOOPD, "--log-level", "info", "operator", "router", "--data-dir", str(up.data_dir)]
    command += ["--lease-duration", str(LEASE_SECONDS), *args]
    if lease_name is not None:
        command += ["--lease-name", lease_name]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env_for(up.data_dir)
        )
    return RouterProcess(process, log)


def wait_registered(client: httpx.Client, *routers: RouterProcess) -> None:
    """Until ``GET /v1/actors`` lists operator:router (a Router that exits meanwhile fails the wait)."""

    def listed() -> bool:
        for router in routers:
            if not router.alive():
                raise AssertionError(f"loopd operator router exited:\n{router.output()}")
        actors = client.get("/v1/actors").json()["data"]
        return any(a["kind"] == "operator" and a["key"] == "router" for a in actors)

    wait_until(listed, timeout=30, what="operator:router to register")


# --- asking and reading the trail -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Asked:
    conversation_id: str
    task_id: str
    response_id: str


def ask(client: httpx.Client, text: str = QUESTION, target: str = "operator:router") -> Asked:
    conversation = client.post("/v1/conversations", json={"name": "router e2e"})
    assert conversation.status_code == 201, conversation.text
    cid = conversation.json()["id"]
    kind, _, key = target.partition(":")
    asked = client.post(f"/v1/conversations/{cid}/messages", json={"target": {"kind": kind, "key": key}, "text": text})
    assert asked.status_code == 201, asked.text
    body = asked.json()
    return Asked(cid, body["task_id"], body["response"]["id"])


def response(client: httpx.Client, asked: Asked) -> dict[str, Any]:
    page = client.get(f"/v1/conversations/{asked.conversation_id}/messages", params={"limit": 200})
    assert page.status_code == 200, page.text
    for message in page.json()["data"]:
        if message["id"] == asked.response_id:
            return dict(message)
    raise AssertionError(f"no response message {asked.response_id}")


def wait_answer(client: httpx.Client, asked: Asked, *, timeout: float = 45.0) -> dict[str, Any]:
    """The response message once it has ended (completed or failed)."""

    def ended() -> dict[str, Any] | None:
        message = response(client, asked)
        return message if message["status"] not in ("pending", "streaming") else None

    return wait_until(ended, timeout=timeout, what=f"the Router's answer to task {asked.task_id}")


def answer_text(message: dict[str, Any]) -> str:
    blocks = message["content"].get("blocks", [])
    return "\n".join(str(b.get("content") or "") for b in blocks if b.get("id") == "answer")


def work_messages(client: httpx.Client, task_id: str) -> list[dict[str, Any]]:
    """The messages of the Task's work conversation (empty when it has none)."""
    found = client.get("/v1/conversations", params={"task_id": task_id})
    assert found.status_code == 200, found.text
    data = found.json()["data"]
    if not data:
        return []
    page = client.get(f"/v1/conversations/{data[0]['id']}/messages", params={"limit": 200})
    assert page.status_code == 200, page.text
    return list(page.json()["data"])


def ledger(client: httpx.Client, task_id: str) -> dict[str, Any]:
    trail = client.get("/v1/ledger", params={"task_id": task_id})
    assert trail.status_code == 200, trail.text
    return dict(trail.json())


def harness_calls(client: httpx.Client, task_id: str) -> list[dict[str, Any]]:
    """The harness calls the ledger shows under the Task, each read from ``GET /v1/harness/calls/{id}``."""
    ids = sorted({lane["harness_call_id"] for lane in ledger(client, task_id)["lanes"] if lane.get("harness_call_id")})
    calls = []
    for call_id in ids:
        got = client.get(f"/v1/harness/calls/{call_id}")
        assert got.status_code == 200, got.text
        calls.append(dict(got.json()))
    return calls


def executions_per_effect(client: httpx.Client, task_id: str) -> Counter[str]:
    """How many executions (``run.started`` events) the ledger holds per effect key of the Task's harness calls."""
    trail = ledger(client, task_id)
    effect_of_lane = {lane["id"]: (lane.get("attributes") or {}).get("effect_key") for lane in trail["lanes"]}
    runs: dict[str, set[str]] = {}
    for event in trail["events"]:
        effect = effect_of_lane.get(event["lane_id"])
        if effect is not None and event["event_type"] == "run.started":
            runs.setdefault(effect, set()).add(event["subject_id"])
    return Counter({effect: len(ids) for effect, ids in runs.items()})


def task_gone(up: UpProcess, task_id: str) -> bool:
    """Whether the Task resource is gone from the embedded Kubernetes API (read with the admin token)."""
    endpoint = (up.data_dir / "resources-api" / "endpoint").read_text().strip()
    trust = ssl.create_default_context(cafile=str(up.data_dir / "resources-api" / "ca.crt"))
    with httpx.Client(
        base_url=endpoint, headers={"Authorization": f"Bearer {up.token}"}, verify=trust, timeout=10.0
    ) as api:
        got = api.get(f"/apis/loopd.dev/v1alpha1/namespaces/default/tasks/{task_id}")
    return got.status_code == 404


def overlapping(intervals: Sequence[tuple[datetime, datetime]]) -> bool:
    """Whether every interval overlaps every other (all started before any ended)."""
    return max(start for start, _ in intervals) < min(end for _, end in intervals)


def leader_lines(router: RouterProcess) -> bool:
    return "now leads lease" in router.output()
