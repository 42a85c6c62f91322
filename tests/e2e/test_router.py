"""The Router end to end, on real processes: `loopd up` (the Router in process, or `--no-router` and standalone
`loopd operator router` processes beside it), `loopd chat`, and a scripted OpenAI-compatible model.

- the Liu Bei question through `loopd up` with the demo model: 1 plan + 3 work + 1 summarize harness messages in the
  work conversation, the work calls overlapping, an answer naming all three, the Task gone, 5 calls in the ledger;
- kill -9 of a standalone Router while the work runs (a slow model), restarted: the answer completes with one
  execution per effect key, and the model is asked once per effect key;
- two replicas: killing the leader lets the other take over the Lease and finish the Task;
- a follow-up while the work runs: a progress message in the conversation, a replan, an answer covering it.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections import Counter
from datetime import datetime
from pathlib import Path

from tests.support.waiting import wait_until

from .conftest import LOOPD, UpProcess, env_for, start_up
from .router_support import (
    HEROES,
    QUESTION,
    RouterProcess,
    answer_text,
    ask,
    executions_per_effect,
    harness_calls,
    overlapping,
    router_model,
    start_router,
    task_gone,
    wait_answer,
    wait_registered,
    work_messages,
)

EFFECTS = ["plan", "summarize", "work/0", "work/1", "work/2"]
WORK_DELAY = 2.0
FOLLOWUP_WORK_DELAY = 6.0
"""The follow-up must reach the Router while the work runs: slow enough for a loaded machine's round trips."""


def _interval(call: dict[str, object]) -> tuple[datetime, datetime]:
    return datetime.fromisoformat(str(call["created_at"])), datetime.fromisoformat(str(call["updated_at"]))


def test_the_liu_bei_question_through_loopd_up_with_the_demo_model(up: UpProcess) -> None:
    with up.client() as client:
        # loopd up writes server.json (how clients find it) only once its Router has registered: asking at once
        # is never refused for an unknown operator:router.
        actors = client.get("/v1/actors").json()["data"]
        assert any(a["kind"] == "operator" and a["key"] == "router" for a in actors), actors
    done = subprocess.run(
        [LOOPD, "chat", "--to", "operator:router", QUESTION],
        env=env_for(up.data_dir),
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, f"{out}\n{err}\n{up.log.read_text()}"
    for hero in HEROES:
        assert hero in out, out
    # The terminal shows the Router's harness calls as they start and end (that they overlap is checked on the
    # calls' own times below: with the zero-latency demo model the lines may come in either order).
    lines = [line.strip() for line in err.splitlines()]
    starts = [i for i, line in enumerate(lines) if re.fullmatch(r"… assistant · work/\d", line)]
    ends = [i for i, line in enumerate(lines) if re.match(r"✓ assistant · work/\d \(", line)]
    assert len(starts) == 3 and len(ends) == 3, err
    assert any(line.startswith("✓ assistant · plan (") for line in lines), err
    found = re.search(r"task (\S+)", err)
    assert found is not None, err
    task_id = found.group(1)

    with up.client() as client:
        calls = harness_calls(client, task_id)
        assert sorted(call["effect_key"] for call in calls) == EFFECTS  # the ledger shows the 5 calls
        assert all(call["phase"] == "succeeded" for call in calls), calls
        harness = [m for m in work_messages(client, task_id) if m["kind"] == "harness"]
        assert len(harness) == 5, harness
        assert {m["id"] for m in harness} == {call["message_id"] for call in calls}
        work = [_interval(call) for call in calls if str(call["effect_key"]).startswith("work/")]
        assert overlapping(work), work  # all three started before any of them ended
        wait_until(lambda: task_gone(up, task_id), timeout=15, what="the Task to be deleted")
        actors = client.get("/v1/actors").json()
        assert any(a["kind"] == "operator" and a["key"] == "router" for a in actors["data"]), actors


def test_kill_9_of_a_standalone_router_mid_work_then_restart_completes_once(tmp_path: Path) -> None:
    with router_model(work_delay=WORK_DELAY) as model:
        up = start_up(tmp_path / "data", tmp_path, args=["--no-router"], env=model.env())
        routers: list[RouterProcess] = []
        try:
            routers.append(start_router(up, tmp_path, "router-1"))
            with up.client() as client:
                wait_registered(client, *routers)
                asked = ask(client)
                wait_until(
                    lambda: sum(n for e, n in model.counts().items() if e.startswith("work/")) >= 3,
                    timeout=30,
                    what="the three work calls to reach the model",
                )
                routers[0].kill(signal.SIGKILL)
                routers.append(start_router(up, tmp_path, "router-2"))
                message = wait_answer(client, asked, timeout=50)
                assert message["status"] == "completed", (message, routers[-1].output())
                text = answer_text(message)
                assert all(hero in text for hero in HEROES), text
                executions = executions_per_effect(client, asked.task_id)
                assert sorted(executions) == EFFECTS and set(executions.values()) == {1}, executions
            requests = model.counts()
            print(f"\nmodel requests per effect key after kill -9 + restart: {dict(sorted(requests.items()))}")
            assert requests.get("plan") == 1 and requests.get("summarize") == 1, requests
            assert Counter(n for e, n in requests.items() if e.startswith("work/")) == Counter({1: 3}), requests
        finally:
            for router in routers:
                router.kill(signal.SIGTERM)
            up.kill(signal.SIGTERM)


def test_two_replicas_the_leader_killed_the_other_takes_over_and_finishes(tmp_path: Path) -> None:
    with router_model(work_delay=WORK_DELAY) as model:
        up = start_up(tmp_path / "data", tmp_path, args=["--no-router"], env=model.env())
        routers = [start_router(up, tmp_path, f"replica-{i}") for i in (1, 2)]
        try:

            def leader() -> RouterProcess | None:
                leading = [r for r in routers if r.alive() and "now leads lease" in r.output()]
                return leading[0] if leading else None

            first = wait_until(leader, timeout=30, what="one replica to lead")
            other = next(r for r in routers if r is not first)
            assert "now leads lease" not in other.output()
            with up.client() as client:
                wait_registered(client, *routers)
                asked = ask(client)
                wait_until(
                    lambda: any(e.startswith("work/") for e in model.counts()),
                    timeout=30,
                    what="the work to reach the model",
                )
                first.kill(signal.SIGKILL)
                message = wait_answer(client, asked, timeout=50)
                assert "now leads lease" in other.output(), other.output()
                assert message["status"] == "completed", (message, other.output())
                assert all(hero in answer_text(message) for hero in HEROES)
                executions = executions_per_effect(client, asked.task_id)
                assert set(executions.values()) == {1}, executions
                wait_until(lambda: task_gone(up, asked.task_id), timeout=15, what="the Task to be deleted")
        finally:
            for router in routers:
                router.kill(signal.SIGTERM)
            up.kill(signal.SIGTERM)


def test_a_followup_during_the_work_gets_a_progress_message_and_a_replan(tmp_path: Path) -> None:
    with router_model(work_delay=FOLLOWUP_WORK_DELAY) as model:
        up = start_up(tmp_path / "data", tmp_path, env=model.env())  # the Router runs in loopd up
        try:
            with up.client() as client:
                asked = ask(client)
                wait_until(
                    lambda: any(e.startswith("work/") for e in model.counts()),
                    timeout=30,
                    what="the work to reach the model",
                )
                said = client.post(
                    f"/v1/conversations/{asked.conversation_id}/messages",
                    json={"target": {"kind": "harness", "key": "assistant"}, "text": "Also introduce Cao Cao"},
                )
                assert said.status_code == 201, said.text
                message = wait_answer(client, asked, timeout=45)
                assert message["status"] == "completed", message
                assert "Cao Cao" in answer_text(message)
                keys = sorted(call["effect_key"] for call in harness_calls(client, asked.task_id))
                assert "plan/1" in keys and "work/1/0" in keys, keys
                page = client.get(f"/v1/conversations/{asked.conversation_id}/messages", params={"limit": 200})
                progress = [
                    m
                    for m in page.json()["data"]
                    if m["kind"] == "operator" and m["content"].get("meta", {}).get("phase") == "progress"
                ]
                assert len(progress) == 1, page.json()["data"]
        finally:
            up.kill(signal.SIGTERM)
