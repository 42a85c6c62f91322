"""LangGraph's Agent Server as a benchmark peer: its own virtualenv, and ``langgraph dev`` serving one graph.

The peer runs ``langgraph dev --no-browser`` (``langgraph-cli[inmem]``: the local Agent Server, which keeps its
state in memory) on loopback, in its own process group, from a temporary directory that holds the graph's source
and a ``langgraph.json``; it is stopped by its pid. Both `benchmarks.server_chats` (a chat graph) and
`benchmarks.server_streams` (a tick graph) use it.

langgraph-api pins some libraries differently from loopd's dev tools (installing it into loopd's virtualenv would
downgrade jsonschema_rs, which schemathesis needs), so the peer lives in a virtualenv of its own:
``${XDG_CACHE_HOME:-~/.cache}/loopd/bench-langgraph``, created with the pinned `REQUIREMENTS` by
``python -m benchmarks._langgraph ensure`` (`make bench` runs it; a later run with the same pins does nothing).
`langgraph_command` finds the CLI: ``$LOOPD_BENCH_LANGGRAPH`` (a path to a ``langgraph`` executable), else one next
to this interpreter, else that virtualenv's.

python -m benchmarks._langgraph ensure     (prints the ``langgraph`` path)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import httpx

from benchmarks._children import run_main, spawn

__all__ = [
    "LANGGRAPH_ENV",
    "REQUIREMENTS",
    "LangGraphServer",
    "dev_command_line",
    "ensure_venv",
    "langgraph_command",
    "peer_versions",
    "running_graph",
    "venv_dir",
]

LANGGRAPH_ENV: Final = "LOOPD_BENCH_LANGGRAPH"
START_TIMEOUT: Final = 120.0
STOP_TIMEOUT: Final = 20.0
INSTALL_TIMEOUT: Final = 900.0
REQUIREMENTS: Final = (
    "langgraph-cli[inmem]==0.4.40",
    "langgraph-api==0.16.7",
    "langgraph-runtime-inmem==0.36.7",
    "langgraph==1.2.24",
    "langchain-core==1.8.3",
)
"""The peer's pinned packages: the versions its figures were measured with (change them, and `ensure_venv` rebuilds)."""
VERSIONED: Final = ("langgraph-api", "langgraph-runtime-inmem", "langgraph", "langgraph-cli")
_STAMP: Final = ".loopd-requirements"
_ENV: Final = {"LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGSMITH_TRACING": "false", "LANGCHAIN_TRACING_V2": "false"}


def venv_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/loopd/bench-langgraph``: where `ensure_venv` puts the peer's virtualenv."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "loopd" / "bench-langgraph"


def _requirements_digest() -> str:
    return hashlib.sha256("\n".join(REQUIREMENTS).encode()).hexdigest()[:16]


def langgraph_command() -> Path | None:
    """The ``langgraph`` CLI to run: ``$LOOPD_BENCH_LANGGRAPH``, else one next to this interpreter, else the peer
    virtualenv's (`venv_dir`); None when none exists."""
    named = os.environ.get(LANGGRAPH_ENV)
    if named:
        return Path(named) if Path(named).exists() else None
    for candidate in (Path(sys.executable).parent / "langgraph", venv_dir() / "bin" / "langgraph"):
        if candidate.exists():
            return candidate
    return None


def ensure_venv(directory: Path | None = None, *, python: str = sys.executable) -> Path:
    """Create (or bring up to `REQUIREMENTS`) the peer's virtualenv at ``directory`` (default `venv_dir`) and return
    its ``langgraph``; nothing is installed when its stamp already names these pins."""
    where = directory or venv_dir()
    command = where / "bin" / "langgraph"
    stamp = where / _STAMP
    digest = _requirements_digest()
    if command.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return command
    if not (where / "bin" / "python").exists():
        where.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([python, "-m", "venv", str(where)], check=True, timeout=INSTALL_TIMEOUT)
    pip = [str(where / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *REQUIREMENTS], check=True, timeout=INSTALL_TIMEOUT)
    stamp.write_text(digest + "\n")
    return command


def peer_versions(command: Path) -> dict[str, str]:
    """The `VERSIONED` packages' versions in the virtualenv of ``command`` (empty when they cannot be read)."""
    python = command.parent / "python"
    script = (
        "import json, importlib.metadata as m\n"
        f"names = {list(VERSIONED)!r}\n"
        "out = {}\n"
        "for n in names:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))\n"
    )
    try:
        done = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=60, check=True)
        return {str(k): str(v) for k, v in json.loads(done.stdout).items()}
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}


@dataclass(frozen=True)
class LangGraphServer:
    """A running ``langgraph dev``: where it listens, its working directory, its pid."""

    host: str
    port: int
    directory: Path
    pid: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def dev_command_line(command: Path, port: int, *, jobs: int | None = None) -> list[str]:
    """``langgraph dev`` on loopback ``port``: no browser, no reloader, blocking calls allowed (the graphs' fake
    models are synchronous in places); ``jobs``: its ``--n-jobs-per-worker`` (None: its default)."""
    line = [str(command), "dev", "--no-browser", "--no-reload", "--allow-blocking"]
    line += ["--host", "127.0.0.1", "--port", str(port)]
    if jobs is not None:
        line += ["--n-jobs-per-worker", str(jobs)]
    return line


@contextlib.contextmanager
def running_graph(
    directory: Path, command: Path, graph_source: str, *, graph_id: str = "bench", jobs: int | None = None
) -> Iterator[LangGraphServer]:
    """``langgraph dev`` serving ``graph_source`` (a module defining ``graph``) as assistant ``graph_id`` from
    ``directory``; stopped (its whole process group) on exit."""
    (directory / "graph.py").write_text(graph_source)
    (directory / "langgraph.json").write_text(
        json.dumps({"dependencies": ["."], "graphs": {graph_id: "./graph.py:graph"}})
    )
    port = _free_port()
    log_path = directory / "langgraph.log"
    log = log_path.open("wb")
    child = spawn(
        dev_command_line(command, port, jobs=jobs),
        cwd=directory,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=dict(os.environ, **_ENV),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if child.poll() is not None:
                raise RuntimeError(f"langgraph dev exited: {log_path.read_text(errors='replace')[-1500:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/ok", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"langgraph dev did not answer within {START_TIMEOUT:g} s")
            time.sleep(0.5)
        yield LangGraphServer("127.0.0.1", port, directory, child.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)  # its own session: the CLI and the server it started
        try:
            child.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait(STOP_TIMEOUT)
        log.close()


def main(argv: Sequence[str] | None = None) -> None:
    """``ensure``: create or update the peer's virtualenv and print its ``langgraph``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["ensure", "where"], help="ensure: install if needed; where: just print")
    parser.add_argument("--dir", type=Path, default=None, help=f"the virtualenv (default {venv_dir()})")
    args = parser.parse_args(argv)
    if args.action == "where":
        print(langgraph_command() or "not installed")
        return
    named = os.environ.get(LANGGRAPH_ENV)
    if named and args.dir is None:  # the user's own install: nothing to do but check it
        if not Path(named).exists():
            raise SystemExit(f"{LANGGRAPH_ENV}={named} does not exist: unset it, or name a langgraph executable")
        print(named)
        return
    try:
        print(ensure_venv(args.dir))
    except (OSError, subprocess.SubprocessError) as exc:
        raise SystemExit(
            f"could not install LangGraph's Agent Server for the benchmarks ({exc}): check the network, or set "
            f"{LANGGRAPH_ENV} to a langgraph executable"
        ) from None


if __name__ == "__main__":
    run_main(main)
