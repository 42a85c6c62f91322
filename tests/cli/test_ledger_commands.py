"""`loopd ledger TASK_ID` and `loopd cost`: the server's ledger answers drawn as a tree and as a table with bars,
and their one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from loopd.cli._chat import ChatFailure, Endpoint
from loopd.cli._ledger_commands import fetch, render_cost, render_tree
from loopd.server.audit import ledger_router
from loopd.server.ledger import SqlLedgerStore
from tests.cli.conftest import child_env, loopd
from tests.server_http.support import BASE, Rig, ask, new_conversation
from tests.server_http.test_ledger_prompts import record_model_call


def _text(renderable: object) -> str:
    console = Console(record=True, width=160, color_system=None)
    console.print(renderable)
    return console.export_text()


async def test_the_trail_tree_and_the_cost_table(rig: Rig) -> None:
    ledger = SqlLedgerStore(rig.db)
    rig.app.include_router(ledger_router(ledger, tasks=rig.task_api, conversations=rig.conversations))
    user = rig.client(token=False, cookie="e5" * 32, origin=BASE)
    task_id = (await ask(user, await new_conversation(user), target="operator:echo"))["task_id"]
    await record_model_call(ledger, task_id=task_id, call_id="call-t1", model="gpt-a", target="assistant", cost=0.5)
    await record_model_call(ledger, task_id=task_id, call_id="call-t2", model="gpt-b", target="coder", cost=0.125)
    endpoint = Endpoint("http://in-process", None)

    tree = await fetch(endpoint, "/v1/ledger/tree", {"task_id": task_id}, http=user)
    drawn = _text(render_tree(tree))
    assert f"Task {task_id}" in drawn and "200→20 tok  $0.6250" in drawn  # the roll-up
    assert "call call-t1" in drawn and "harness:assistant" in drawn and "harness:coder" in drawn
    assert "model gpt-a" in drawn and "250 ms" in drawn and "$0.5000" in drawn and "finish=stop" in drawn

    table = await fetch(endpoint, "/v1/ledger/cost", {"since": "7d", "by": "model"}, http=rig.client())
    console = Console(record=True, width=160, color_system=None)
    render_cost(table, console)
    printed = console.export_text()
    lines = {line.split("│")[1].strip(): line for line in printed.splitlines() if line.count("│") >= 6}
    assert "gpt-a" in lines and "gpt-b" in lines and "total" in lines
    assert lines["gpt-a"].count("█") == 24 and lines["gpt-b"].count("█") == 6  # bars scale to the largest spend
    assert "$0.6250" in lines["total"]

    with pytest.raises(ChatFailure, match="forbidden") as refused:
        await fetch(endpoint, "/v1/ledger/cost", {}, http=user)
    assert refused.value.code == 1


def test_bad_input_and_no_server_are_one_line(tmp_path: Path) -> None:
    env = child_env(tmp_path / "home")
    line = loopd(["cost", "--by", "mood", "--server", "http://127.0.0.1:9", "--token", "t"], env=env).one_line_error(2)
    assert "--by takes conversation, target, model" in line
    line = loopd(["ledger", "some-task", "--server", "http://127.0.0.1:9", "--token", "t"], env=env).one_line_error(1)
    assert "cannot reach http://127.0.0.1:9" in line
