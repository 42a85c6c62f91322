"""`rt.harness.prompt(workspace=..., tools=...)` against a real loop-server: an operator's call works in its own
directory under the server's workspaces root (``operator/<key>/<id>``), the state says where and with which profile,
changed parameters are a Conflict, bad ones are refused (client side and server side)."""

from __future__ import annotations

import pytest

from loopd.runtime import Conflict, InvalidRequest, Runtime
from loopd.server._composition import RunningServer


async def _task(rt: Runtime) -> str:
    await rt.register("echo")
    conversation = await rt.chat.create_conversation("workspace test")
    sent = await rt.chat.send(conversation.id, "hello", target=("operator", "echo"))
    return sent.task_id


async def test_an_operators_call_works_in_its_own_workspace(rt: Runtime, server: RunningServer) -> None:
    task_id = await _task(rt)
    call = await rt.harness.prompt(
        "run-uid", "round/1/auditor", "assistant", "list files", task_id=task_id, workspace="runs/run-uid", tools="read"
    )
    assert (call.state.workspace, call.state.tools) == ("operator/echo/runs/run-uid", "read")
    state = await call.wait(timeout=30)
    assert state.succeeded, state.error
    assert "The `list_dir` tool returned" in state.text  # it listed the (empty) workspace: the read profile has it
    assert (server.workspace.parent / "operator" / "echo" / "runs" / "run-uid").is_dir()

    again = await rt.harness.prompt(
        "run-uid", "round/1/auditor", "assistant", "list files", task_id=task_id, workspace="runs/run-uid", tools="read"
    )
    assert again.id == call.id
    with pytest.raises(Conflict):
        await rt.harness.prompt(
            "run-uid", "round/1/auditor", "assistant", "list files", task_id=task_id, workspace="runs/run-uid",
            tools="write",
        )  # fmt: skip


async def test_bad_workspaces_and_profiles_are_refused(rt: Runtime, server: RunningServer) -> None:
    task_id = await _task(rt)
    with pytest.raises(InvalidRequest, match="tools must be one of"):
        await rt.harness.prompt("o", "k", "assistant", "hi", task_id=task_id, tools="admin")  # type: ignore[arg-type]
    for workspace in ("../assistant", "/etc", "a/../../b"):
        with pytest.raises(InvalidRequest):
            await rt.harness.prompt("o", "k", "assistant", "hi", task_id=task_id, workspace=workspace, tools="write")
    with pytest.raises(InvalidRequest, match="need a workspace"):
        await rt.harness.prompt("o", "k", "assistant", "hi", task_id=task_id, tools="write")
    assert not (server.workspace.parent / "operator").exists()
