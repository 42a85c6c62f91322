"""The demo run end to end against a real loop-server: Planning → Executing → Auditing → Succeeded, with hello.txt
really written by the Executor's tool call and really read by the Auditor."""

from __future__ import annotations

from pathlib import Path

from loopd.server._composition import default_workspaces
from tests.operators_longhorizon.rig import HELLO, demo_rules, rig


async def test_the_demo_run_writes_hello_txt_audits_it_and_succeeds(tmp_path: Path) -> None:
    async with rig(tmp_path, rules=demo_rules()) as r:
        asked = await r.ask(HELLO)
        task_id = asked["task_id"]
        response = await r.finished(asked)

        assert response["status"] == "completed", response
        answer = next(b["content"] for b in response["content"]["blocks"] if b["id"] == "answer")
        assert answer.startswith("Done in round 2: hello.txt contains") and "hello.txt" in answer

        run = await r.run(task_id)
        assert run is not None and run.status is not None
        assert run.status.phase == "Succeeded" and run.status.round == 2 and run.status.contract_version == 1
        assert not run.metadata.owner_references  # released from its Task: kept for the retention time
        last = run.status.last_audit
        assert last is not None and last.verdict.complete and last.verdict.integrity == "clean"
        assert "hello world" in last.verdict.evidence

        uid = str(run.metadata.uid)
        calls = await r.calls(uid)
        assert sorted(c.effect_key for c in calls) == [
            f"{uid}/round/1/auditor",
            f"{uid}/round/1/executor",
            f"{uid}/round/1/manager",
            f"{uid}/round/2/manager",
        ]
        assert all(c.phase == "succeeded" for c in calls)
        workspace = default_workspaces(tmp_path / "data") / "operator" / "longhorizon" / "runs" / uid
        assert (workspace / "hello.txt").read_text() == "hello world\n"  # really written by the Executor's tool

        reports = [m for m in await r.messages(task_id) if m.content.get("biz") == "loopd.longhorizon"]
        authors = [m.content["meta"]["author"] for m in reports]
        assert authors == [
            "operator/longhorizon/manager",
            "operator/longhorizon/executor",
            "operator/longhorizon/auditor",
            "operator/longhorizon/manager",
        ]
        assert all(m.status == "completed" for m in reports)
        assert {m.conversation_id for m in reports} != {asked["conversation_id"]}
        [execution] = await r.executions(task_id)
        [audit] = await r.audits(task_id)
        assert execution.status is not None and execution.status.phase == "Completed"
        assert audit.status is not None and audit.status.verdict is not None and audit.status.verdict.complete
