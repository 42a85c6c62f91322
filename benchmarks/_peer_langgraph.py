"""The workload on LangGraph: a tool-calling agent graph (model node → tool node → back) with AsyncSqliteSaver.

The model node is an async function that returns an ``AIMessage`` with one tool call (no chat-model wrapper,
so no callback machinery is counted against LangGraph); the tool node is the prebuilt ``ToolNode`` over an async
echo tool. ``durability="sync"`` makes every superstep's checkpoint commit before the next one starts, which is
what loopd does for every step (the default, ``"async"``, writes it while the next step runs). ``delta=True``
uses the beta ``DeltaChannel`` for the messages (checkpoints store the new writes plus a periodic snapshot instead
of the whole list); the default graph state, ``MessagesState``, stores the whole list in every checkpoint.
``synchronous`` sets SQLite's ``PRAGMA synchronous`` of the saver's one connection: FULL (SQLite's default) or
NORMAL, for the matched-durability rows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import reduce
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph, add_messages
from langgraph.prebuilt import ToolNode, tools_condition

from benchmarks._workload import (
    FINAL_TEXT,
    TOOL_ARGUMENTS,
    USER_TEXT,
    GcTime,
    PeerRun,
    StepClock,
    count_rows,
    directory_bytes,
    finish,
)

DB = "langgraph.db"
THREAD = "bench"


def _add_message_batches(state: list[AnyMessage] | None, writes: Sequence[Any]) -> list[AnyMessage]:
    return reduce(add_messages, writes, state or [])  # type: ignore[arg-type]  # add_messages accepts lists


class DeltaMessagesState(TypedDict):
    """``MessagesState`` with the beta ``DeltaChannel``: checkpoints keep writes, not the whole list."""

    messages: Annotated[list[AnyMessage], DeltaChannel(_add_message_batches)]


@tool
async def echo(text: str) -> str:
    """Echo the given text back."""
    return text


def build_graph(clock: StepClock, probe: list[int] | None, path: Path, *, delta: bool) -> StateGraph[Any]:
    async def model(_state: Any) -> dict[str, list[AIMessage]]:
        index, started = clock.enter()
        if probe is not None:
            probe.append(count_rows(path, "SELECT count(*) FROM checkpoints"))
        if clock.wants_tool(index):
            call = {"name": "echo", "args": dict(TOOL_ARGUMENTS), "id": f"call_{index}", "type": "tool_call"}
            message = AIMessage(content="", tool_calls=[call])
        else:
            message = AIMessage(content=FINAL_TEXT)
        clock.leave(started)
        return {"messages": [message]}

    graph: StateGraph[Any] = StateGraph(DeltaMessagesState if delta else MessagesState)
    graph.add_node("model", model)  # type: ignore[call-overload]  # state typed Any: it is the graph's state
    graph.add_node("tools", ToolNode([echo]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    return graph


async def run(
    steps: int,
    directory: Path,
    *,
    probe: bool = False,
    durability: Literal["sync", "async"] = "sync",
    delta: bool = False,
    synchronous: Literal["FULL", "NORMAL"] = "FULL",
) -> PeerRun:
    path = directory / DB
    clock = StepClock(steps)
    durable_rows: list[int] | None = [] if probe else None
    config: Any = {"configurable": {"thread_id": THREAD}, "recursion_limit": 2 * steps + 10}
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        await saver.setup()  # its own pragmas first (WAL), then ours: the saver writes through this one connection
        await saver.conn.execute(f"PRAGMA synchronous={synchronous}")
        app = build_graph(clock, durable_rows, path, delta=delta).compile(checkpointer=saver)
        with GcTime().measuring() as gc_time:
            started = time.perf_counter()
            result = await app.ainvoke({"messages": [HumanMessage(content=USER_TEXT)]}, config, durability=durability)
            wall = time.perf_counter() - started
    disk = directory_bytes(directory, DB)
    problem = ""
    messages = result["messages"]
    if len(messages) != 2 * steps + 2:
        problem = f"final state holds {len(messages)} messages, expected {2 * steps + 2}"
    persisted = {
        "checkpoints": count_rows(path, "SELECT count(*) FROM checkpoints"),
        "writes": count_rows(path, "SELECT count(*) FROM writes"),
    }
    if persisted["checkpoints"] < 2 * steps + 2:
        problem = problem or f"only {persisted['checkpoints']} checkpoints for {steps} steps"
    peer = "LangGraph" + (" (durability=async)" if durability == "async" else "") + (" + DeltaChannel" if delta else "")
    peer += f" (synchronous={synchronous})"
    return finish(peer, clock, wall, disk, persisted, problem, durable_rows or [], gc_time)
