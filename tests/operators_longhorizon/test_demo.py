"""demo_rules(): the demo model's scripted but honest answers to the three roles' prompts."""

from __future__ import annotations

import json
from dataclasses import replace

from loopd.operators.longhorizon._auditor import auditor_prompt, parse_verdict
from loopd.operators.longhorizon._demo import demo_rules, file_task
from loopd.operators.longhorizon._executor import executor_prompt
from loopd.operators.longhorizon._manager import manager_prompt, parse_decision
from loopd.operators.longhorizon._phases import AuditRecord, Ref, Verdict, start

GOAL = "Create hello.txt containing hello world"
TOOLS = "\n\nTool results so far:\n"


def ask(text: str) -> object:
    for rule in demo_rules():
        if (answer := rule(text)) is not None:
            return answer
    return None


def test_the_goal_names_a_file_and_its_content() -> None:
    assert file_task(GOAL) == ("hello.txt", "hello world")
    assert file_task("write notes/a.md with the content: 'x y'") == ("notes/a.md", "x y")
    assert file_task("Tell me a joke") == ("goal.md", "Tell me a joke")
    assert file_task("create ../x.txt containing y")[0] == "goal.md"


def test_the_three_roles_follow_the_scripted_path() -> None:
    state = start(GOAL, 25, "in")
    decision = parse_decision(str(ask(manager_prompt(state, goal=GOAL))))
    assert decision.next == "cli" and decision.plan == "Write file: hello.txt\nContent: hello world"

    executor = executor_prompt(state, plan=decision.plan)
    assert ask(executor) == {"tool": "write_file", "arguments": {"path": "hello.txt", "content": "hello world\n"}}
    report = str(ask(executor + TOOLS + "[write_file] wrote 12 bytes to hello.txt"))
    assert "wrote 12 bytes to hello.txt" in report

    auditor = auditor_prompt(state, plan=decision.plan, report=report)
    assert ask(auditor) == {"tool": "read_file", "arguments": {"path": "hello.txt"}}
    verdict = parse_verdict(str(ask(auditor + TOOLS + "[read_file] hello world")))
    assert verdict.complete and verdict.integrity == "clean" and "hello world" in verdict.evidence

    audited = replace(state, round=2, last_audit=AuditRecord(Ref("r-r1", "u"), 1, "m", verdict))
    assert parse_decision(str(ask(manager_prompt(audited, goal=GOAL)))).next == "done"


def test_the_auditor_reports_what_it_really_read() -> None:
    state = start(GOAL, 25, "in")
    auditor = auditor_prompt(state, plan="Write file: hello.txt\nContent: hello world", report="I wrote it")

    verdict = parse_verdict(str(ask(auditor + TOOLS + "[read_file] error: hello.txt does not exist")))

    assert not verdict.complete and "hello world" in verdict.feedback
    incomplete = replace(state, round=2, last_audit=AuditRecord(Ref("r-r1", "u"), 1, "m", verdict))
    assert json.loads(str(ask(manager_prompt(incomplete, goal=GOAL))))["next"] == "cli"


def test_other_prompts_are_left_alone() -> None:
    assert ask("hello") is None
    assert ask("Current request: LongHorizon manager") is None
    assert Verdict(complete=False, integrity="unknown").evidence == ""
