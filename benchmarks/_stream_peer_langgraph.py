"""The joined-stream peer of `server_streams`: N clients join one run's stream on LangGraph's Agent Server.

LangGraph's local Agent Server (``langgraph dev --no-browser``, from ``langgraph-cli[inmem]``: in-memory state)
serves a one-node graph that, once every client has joined, writes ``--rate`` custom stream events per second for
``--seconds`` (each carries its index and CLOCK_MONOTONIC time taken just before the write, like loopd's emits),
then ``bench-done``. The benchmark creates a thread and a run (``stream_mode: custom``), N clients join it with
``GET /threads/{thread_id}/runs/{run_id}/stream`` (the same bare-protocol subscribers as loopd's, in worker
processes), and the same delay percentiles are computed.

The server is started and stopped by `benchmarks._langgraph` (shared with `benchmarks.server_chats`), which also
finds the ``langgraph`` command (``LOOPD_BENCH_LANGGRAPH``, next to this interpreter, or the peer's own virtualenv
that ``python -m benchmarks._langgraph ensure`` installs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx

from benchmarks._langgraph import LANGGRAPH_ENV, LangGraphServer, langgraph_command, running_graph

__all__ = ["LANGGRAPH_ENV", "LangGraphServer", "langgraph_command", "running_langgraph", "start_run"]

_GRAPH = """
import asyncio, os, time
from typing import TypedDict
from langgraph.config import get_stream_writer
from langgraph.graph import StateGraph, START, END


class State(TypedDict, total=False):
    events: int
    rate: float
    flag: str
    sent: int


async def ticks(state: State) -> State:
    write = get_stream_writer()
    deadline = time.monotonic() + 600
    while not os.path.exists(state["flag"]):  # every client joined
        if time.monotonic() > deadline:
            raise TimeoutError("the clients never joined")
        await asyncio.sleep(0.01)
    start = time.monotonic() + 0.05
    for index in range(state["events"]):
        await asyncio.sleep(max(0.0, start + index / state["rate"] - time.monotonic()))
        write({"tick": f"bench:{index}:{time.monotonic():.6f};"})
    write({"tick": "bench-done"})
    return {"sent": state["events"]}


builder = StateGraph(State)
builder.add_node("ticks", ticks)
builder.add_edge(START, "ticks")
builder.add_edge("ticks", END)
graph = builder.compile()
"""


@contextlib.contextmanager
def running_langgraph(directory: Path, command: Path) -> Iterator[LangGraphServer]:
    """``langgraph dev --no-browser`` serving the tick graph from ``directory``; stopped by its pid on exit."""
    with running_graph(directory, command, _GRAPH, graph_id="bench") as server:
        yield server


def start_run(server: LangGraphServer, events: int, rate: float, flag: Path) -> str:
    """A thread and a run of the tick graph (waiting for ``flag``); the run's stream path to join."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        thread = client.post("/threads", json={})
        thread.raise_for_status()
        thread_id = thread.json()["thread_id"]
        body = {
            "assistant_id": "bench",
            "input": {"events": events, "rate": rate, "flag": str(flag)},
            "stream_mode": ["custom"],
        }
        run = client.post(f"/threads/{thread_id}/runs", json=body)
        run.raise_for_status()
        return f"/threads/{thread_id}/runs/{run.json()['run_id']}/stream"
