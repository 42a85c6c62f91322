"""A foreign loop as a harness target of a real `loopd up` (issue 17.5): the configuration file declares
``kind: foreign`` backed by the scripted fake claude CLI; `/v1/actors` lists it, a chat asks it, the CLI's
permission request is a gate in the answer that the asker approves, and the answer and its ledger usage arrive."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

from tests.support.waiting import wait_until

from .conftest import start_up
from .router_support import answer_text, ask, response, wait_answer

FAKE_CLAUDE = Path(__file__).resolve().parents[1] / "harness_foreign" / "fake_claude.py"


def test_loopd_up_answers_a_chat_with_a_configured_foreign_harness(tmp_path: Path) -> None:
    config = tmp_path / "loopd.yaml"
    config.write_text(
        "harnesses:\n"
        "  - key: claude-code\n"
        "    kind: foreign\n"
        "    title: Claude Code\n"
        "    engine: claude\n"
        f"    workspace: {tmp_path / 'code'}\n"
        f"    command: [{sys.executable}, {FAKE_CLAUDE}]\n"
    )
    server = start_up(tmp_path / "data", tmp_path, args=["--config", str(config)])
    try:
        with server.client() as client:
            actors = {(a["kind"], a["key"]): a for a in client.get("/v1/actors").json()["data"]}
            assert ("harness", "claude-code") in actors and actors["harness", "claude-code"]["display_name"] == (
                "Claude Code"
            )
            asked = ask(client, "use a tool please", target="harness:claude-code")

            def pending_gate() -> dict[str, Any] | None:
                blocks = response(client, asked)["content"].get("blocks", [])
                return next((b for b in blocks if b.get("type") == "ask" and b.get("status") == "pending"), None)

            gate = wait_until(pending_gate, timeout=45, what="the CLI's permission request as a gate")
            assert "Bash" in gate["prompt"]
            gate_id = gate["id"].removeprefix("gate/")
            answered = client.post(f"/v1/harness/calls/{gate['call_id']}/gates/{gate_id}", json={"answer": "approve"})
            assert answered.status_code < 300, answered.text
            message = wait_answer(client, asked, timeout=45)
            assert message["status"] == "completed", (message, server.log.read_text())
            assert answer_text(message) == "Bash said a.txt"
            tool = next(b for b in message["content"]["blocks"] if b.get("id") == "tool/toolu_1")
            assert (tool["status"], tool["output"]) == ("completed", "a.txt")

            def task_usage() -> dict[str, Any] | None:  # the ledger's roll-up of the Task: what the CLI reported
                got = client.get("/v1/ledger/usage", params={"task_id": asked.task_id})
                assert got.status_code == 200, got.text
                body: dict[str, Any] = got.json()
                return body if body.get("input_tokens") else None

            usage = wait_until(task_usage, timeout=15, what="the Task's ledger usage")
            assert (usage["input_tokens"], usage["output_tokens"]) == (12, 5), usage
            assert abs(float(usage["cost_usd"]) - 0.0042) < 1e-9, usage
    finally:
        server.kill(signal.SIGTERM)
