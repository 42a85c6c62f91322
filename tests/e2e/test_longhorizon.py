"""LongHorizon end to end, on real processes: `loopd up` (LongHorizon in process, or `--no-longhorizon` and standalone
`loopd operator longhorizon` processes beside it), `loopd chat`, kubectl, and a scripted OpenAI-compatible model.

- the demo question through `loopd up` with the demo model: `loopd chat --to operator:longhorizon "Create hello.txt
  containing hello world"` answers; the Run went Planning → Executing → Auditing (round 1) → Planning → Succeeded
  (round 2: the Manager's ``done`` after a clean, complete audit); hello.txt is really in the Run's workspace; the
  ledger holds exactly the four calls; `kubectl get runs,executions,audits` shows the printer columns;
- kill -9 of a standalone operator in each phase of one Run (Planning, Executing, Auditing), a new one started each
  time: the Run continues from its status and completes, with one execution per effect key in the ledger and each
  role's prompt reaching the model once per call (no harness call repeated).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import ssl
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from loopd.harness.models import DemoOptions, ScriptedServer, ServerReply, demo_reply
from loopd.harness.models._scripted_server import IncomingRequest, current_request
from loopd.operators.longhorizon import AUDITOR_HEADER, EXECUTOR_HEADER, MANAGER_HEADER, demo_rules
from tests.support.availability import missing
from tests.support.model_thread import scripted_model_thread
from tests.support.titles import is_title_request
from tests.support.waiting import wait_until

from .conftest import LOOPD, UpProcess, env_for, start_up
from .router_support import API_KEY, RouterProcess, ask, executions_per_effect, harness_calls, wait_answer

QUESTION = "Create hello.txt containing hello world"
RUNS = "/apis/longhorizon.loopd.dev/v1alpha1/namespaces/default/runs"
LEASE_SECONDS = 3.0
"""The standalone operators' lease: a new one takes over this long after the killed one last renewed."""
ROLE_DELAY = 2.0
"""Seconds the scripted model holds each role's first request of a call: the window in which the operator dies."""


def _api(up: UpProcess) -> httpx.Client:
    """The embedded Kubernetes API, with the admin token."""
    endpoint = (up.data_dir / "resources-api" / "endpoint").read_text().strip()
    trust = ssl.create_default_context(cafile=str(up.data_dir / "resources-api" / "ca.crt"))
    return httpx.Client(base_url=endpoint, headers={"Authorization": f"Bearer {up.token}"}, verify=trust, timeout=10)


def _run(up: UpProcess, name: str) -> dict[str, Any] | None:
    with _api(up) as api:
        got = api.get(f"{RUNS}/{name}")
    if got.status_code == 404:
        return None
    assert got.status_code == 200, got.text
    return dict(got.json())


def _phase(up: UpProcess, name: str) -> str | None:
    run = _run(up, name)
    return None if run is None else (run.get("status") or {}).get("phase")


def _workspace(up: UpProcess, run: dict[str, Any]) -> Path:
    """Where the Run's Executor and Auditor work: <data dir>-workspaces/operator/longhorizon/runs/<run uid>."""
    root = up.data_dir.parent / f"{up.data_dir.name}-workspaces"
    return root / "operator" / "longhorizon" / "runs" / str(run["metadata"]["uid"])


# --- one `loopd up` with the demo model, LongHorizon in process ------------------------------------------------


@dataclass
class DemoRun:
    up: UpProcess
    chat: subprocess.CompletedProcess[bytes]
    task_id: str


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    tmp = tmp_path_factory.mktemp("longhorizon")
    up = start_up(tmp / "data", tmp)
    try:
        chat = subprocess.run(
            [LOOPD, "chat", "--to", "operator:longhorizon", QUESTION],
            env=env_for(up.data_dir),
            capture_output=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        err = chat.stderr.decode()
        found = [part.split()[1] for part in err.split(" · ") if part.startswith("task ")]
        assert chat.returncode == 0 and found, f"{chat.stdout.decode()}\n{err}\n{up.log.read_text()}"
        yield DemoRun(up, chat, found[0])
    finally:
        up.kill(signal.SIGTERM)


def test_the_demo_question_runs_the_three_roles_and_really_writes_hello_txt(demo_run: DemoRun) -> None:
    up, task_id = demo_run.up, demo_run.task_id
    answer, err = demo_run.chat.stdout.decode(), demo_run.chat.stderr.decode()
    assert "hello world" in answer, answer
    ended = [line.strip() for line in err.splitlines() if line.strip().startswith("✓ assistant")]
    roles = [line.rsplit("/", 1)[-1].split()[0] for line in ended]
    assert roles == ["manager", "executor", "auditor", "manager"], err  # the calls as `loopd chat` showed them

    run = _run(up, task_id)
    assert run is not None, "the Run (named after the Task) is kept for its retention time"
    status = run["status"]
    assert (status["phase"], status["round"], status["contractVersion"]) == ("Succeeded", 2, 1)
    assert status["lastAudit"]["verdict"]["complete"] is True
    assert status["lastAudit"]["verdict"]["integrity"] == "clean"
    assert "hello world" in status["lastAudit"]["verdict"]["evidence"]  # what the Auditor really read
    assert [r["decision"] for r in status["rounds"]] == ["cli", "done"]
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["Succeeded"] == "True"
    assert (_workspace(up, run) / "hello.txt").read_text().strip() == "hello world"

    with up.client() as client:
        calls = harness_calls(client, task_id)
        keys = sorted(str(call["effect_key"]).split("/", 1)[1] for call in calls)
        assert keys == ["round/1/auditor", "round/1/executor", "round/1/manager", "round/2/manager"], calls
        assert all(call["phase"] == "succeeded" for call in calls), calls
        profiles = {str(call["effect_key"]).rsplit("/", 1)[1]: (call["tools"], call["workspace"]) for call in calls}
        workspace = f"operator/longhorizon/runs/{run['metadata']['uid']}"
        assert profiles["executor"] == ("write", workspace) and profiles["auditor"] == ("read", workspace)
        assert profiles["manager"][0] == "none"
        created = sorted((str(c["created_at"]), str(c["effect_key"]).split("/", 1)[1]) for c in calls)
        assert [key for _, key in created] == [
            "round/1/manager",
            "round/1/executor",
            "round/1/auditor",
            "round/2/manager",
        ]  # Planning → Executing → Auditing → Planning, one after the other


def test_kubectl_shows_runs_executions_and_audits_with_their_columns(demo_run: DemoRun, tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        missing("kubectl is not installed")
    up = demo_run.up
    config = tmp_path / "kubeconfig"
    made = subprocess.run(
        [LOOPD, "kubeconfig", "--data-dir", str(up.data_dir)], capture_output=True, timeout=30, env=env_for(up.data_dir)
    )
    assert made.returncode == 0, made.stderr.decode()
    config.write_bytes(made.stdout)
    shown = subprocess.run(
        [str(kubectl), "--kubeconfig", str(config), "get", "runs,executions,audits"],
        capture_output=True,
        timeout=30,
    )
    out = shown.stdout.decode()
    assert shown.returncode == 0, shown.stderr.decode()
    lines = [line.split() for line in out.splitlines() if line.strip()]
    headers = [line for line in lines if line[0] == "NAME"]
    assert headers == [
        ["NAME", "PHASE", "ROUND", "BUDGET", "CONTRACT", "AGE"],
        ["NAME", "RUN", "ROUND", "PHASE", "AGE"],
        ["NAME", "RUN", "ROUND", "PHASE", "COMPLETE", "INTEGRITY", "AGE"],
    ], out
    task = demo_run.task_id
    rows = {line[0]: line[1:] for line in lines if line[0] != "NAME"}
    assert rows[f"run.longhorizon.loopd.dev/{task}"][:4] == ["Succeeded", "2", "25", "1"], out
    assert rows[f"execution.longhorizon.loopd.dev/{task}-r1"][:3] == [task, "1", "Completed"], out
    assert rows[f"audit.longhorizon.loopd.dev/{task}-r1"][:5] == [task, "1", "Completed", "true", "clean"], out


# --- kill -9 of a standalone operator in each phase ------------------------------------------------------------


@dataclass
class RoleModel:
    """A scripted model that answers like the demo model with LongHorizon's rules, holds each call's first request
    for `ROLE_DELAY` seconds, and counts those first requests per role (a repeated call would ask again)."""

    base_url: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    asked: Counter[str] = field(default_factory=Counter)

    def counts(self) -> Counter[str]:
        with self.lock:
            return Counter(self.asked)

    def env(self) -> dict[str, str]:
        return {"LOOPD_MODEL": "gpt-4o-mini", "OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": API_KEY}


def _role(request: IncomingRequest) -> str:
    text = current_request(request.last_user_text)
    for role, header in (("manager", MANAGER_HEADER), ("executor", EXECUTOR_HEADER), ("auditor", AUDITOR_HEADER)):
        if header in text:
            return role
    return "other"


@contextlib.contextmanager
def role_model() -> Iterator[RoleModel]:
    holder: list[RoleModel] = []
    options = DemoOptions(rules=tuple(demo_rules()))

    def rule(request: IncomingRequest) -> ServerReply:
        reply = demo_reply(request, options)
        first = (request.last_message or {}).get("role") == "user"
        if not first or not holder or is_title_request(request):
            return reply
        with holder[0].lock:
            holder[0].asked[_role(request)] += 1
        return reply.model_copy(update={"delay": ROLE_DELAY})

    server = ScriptedServer(rule, api_key=API_KEY)

    with scripted_model_thread(server, name="longhorizon-model") as base_url:
        holder.append(RoleModel(base_url))
        yield holder[0]


def _start_operator(up: UpProcess, tmp_path: Path, name: str) -> RouterProcess:
    """``loopd operator longhorizon --data-dir <up's>`` with a short lease."""
    log = tmp_path / f"{name}.log"
    command = [LOOPD, "--log-level", "info", "operator", "longhorizon", "--data-dir", str(up.data_dir)]
    command += ["--lease-duration", str(LEASE_SECONDS)]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env_for(up.data_dir)
        )
    return RouterProcess(process, log)


def _wait_registered(client: httpx.Client, operator: RouterProcess) -> None:
    """Until ``GET /v1/actors`` lists operator:longhorizon (an operator that exits meanwhile fails the wait)."""

    def listed() -> bool:
        if not operator.alive():
            raise AssertionError(f"loopd operator longhorizon exited:\n{operator.output()}")
        actors = client.get("/v1/actors").json()["data"]
        return any(a["kind"] == "operator" and a["key"] == "longhorizon" for a in actors)

    wait_until(listed, timeout=30, what="operator:longhorizon to register")


def _leader(operators: list[RouterProcess]) -> RouterProcess | None:
    leading = [o for o in operators if o.alive() and "now leads lease" in o.output()]
    return leading[0] if leading else None


def test_kill_9_of_a_standalone_operator_in_each_phase_repeats_no_harness_call(tmp_path: Path) -> None:
    with role_model() as model:
        up = start_up(tmp_path / "data", tmp_path, args=["--no-longhorizon", "--no-router"], env=model.env())
        # Two replicas: the standby takes over the Lease within its duration once the leader dies; each kill starts
        # a new standby, so every phase has one waiting (a process start is slow on a loaded machine).
        operators = [_start_operator(up, tmp_path, f"longhorizon-{n}") for n in (1, 2)]
        try:
            with up.client() as client:
                _wait_registered(client, operators[0])
                asked = ask(client, QUESTION, target="operator:longhorizon")
                for number, (phase, role) in enumerate(
                    [("Planning", "manager"), ("Executing", "executor"), ("Auditing", "auditor")], start=3
                ):
                    wait_until(
                        lambda phase=phase, role=role: (
                            _phase(up, asked.task_id) == phase  # type: ignore[misc]
                            and model.counts()[role] >= 1
                        ),
                        timeout=30,
                        what=f"the Run in {phase} with its {role} call at the model",
                    )
                    leader = wait_until(lambda: _leader(operators), timeout=10, what="the leading replica")
                    leader.kill(signal.SIGKILL)  # mid-call: the call goes on in the server
                    operators.append(_start_operator(up, tmp_path, f"longhorizon-{number}"))
                message = wait_answer(client, asked, timeout=40)
                assert message["status"] == "completed", (message, [o.output()[-2000:] for o in operators])
                executions = executions_per_effect(client, asked.task_id)
                keys = sorted(effect.split("/", 1)[1] for effect in executions)
                assert keys == ["round/1/auditor", "round/1/executor", "round/1/manager", "round/2/manager"]
                assert set(executions.values()) == {1}, executions  # one execution per effect key
            assert sum(not o.alive() for o in operators) == 3  # one leader killed in each phase
            run = _run(up, asked.task_id)
            assert run is not None and run["status"]["phase"] == "Succeeded", run
            assert (_workspace(up, run) / "hello.txt").read_text().strip() == "hello world"
            asked_per_role = model.counts()
            print(f"\nmodel requests per role after three kill -9s: {dict(asked_per_role)}")
            assert asked_per_role == Counter({"manager": 2, "executor": 1, "auditor": 1}), asked_per_role
        finally:
            for operator in operators:
                operator.kill(signal.SIGKILL)  # nothing of theirs is left to finish: the Run is done
            up.kill(signal.SIGTERM)


def test_loopd_up_installed_the_three_crds_at_start(demo_run: DemoRun) -> None:
    with _api(demo_run.up) as api:
        found = api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
    assert found.status_code == 200, found.text
    names = {item["metadata"]["name"] for item in found.json()["items"]}
    assert {"runs.longhorizon.loopd.dev", "executions.longhorizon.loopd.dev", "audits.longhorizon.loopd.dev"} <= names
