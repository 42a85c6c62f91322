"""The bash tool: run a command in the workspace, in its own process group, with a scrubbed environment.

- ``bash -c <command>`` started with `asyncio.create_subprocess_exec` (no extra shell), cwd = workspace root,
  stdin closed, stdout and stderr merged.
- The environment is built from an allow-list (`INHERITED_ENV`), never copied: API keys, tokens and every other
  variable of the harness process stay out. ``HOME`` is the workspace root; callers may add variables.
- Timeout: SIGTERM to the process group, a short grace, then SIGKILL. When the command finishes, anything it
  left running in its group is killed too, so no background process outlives the call (a process that
  started its own session escapes this; the gate is the control for what may run at all).
- Output: head and tail kept up to a byte limit, with a marker for what was left out; the exit code is
  appended. A non-zero exit or a timeout marks the result as an error.
- Cancellation kills the process group and propagates.

- Sandbox: the command line goes through a `Sandbox` (see `_sandbox`). Under bubblewrap the command can write
  only the workspace (``.git`` and ``.loopd`` read-only) and a private /tmp, sees no other process, no home, no
  data directory (``hidden``) and no network; a timeout's SIGTERM goes to the command's group inside the sandbox,
  and when the command ends the sandbox ends with everything it started, even processes that left the group.
  Unconfined, bash is held only by its working directory, its environment and the gate, which sees every part
  of the command (see `_requirements.split_command`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from pydantic import Field

from loopd._infra.tasks import cancel_and_wait
from loopd.harness._errors import ToolArgumentsError
from loopd.harness.core import EffectKind, Idempotency
from loopd.harness.tools._base import BuiltinTool, Plan, ToolArgs
from loopd.harness.tools._processes import abandon_pipes, signal_group, stop_group, wait_exited
from loopd.harness.tools._protocol import ToolContext, ToolResult
from loopd.harness.tools._requirements import exec_requirements
from loopd.harness.tools._sandbox import UNCONFINED, Sandbox
from loopd.harness.tools._workspace import Workspace

INHERITED_ENV: Final = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
"""The only variables copied from the harness process (when set)."""
DEFAULT_TIMEOUT: Final = 120.0
MAX_TIMEOUT: Final = 600.0
DEFAULT_OUTPUT_LIMIT: Final = 30_000
KILL_GRACE: Final = 1.0
DRAIN_TIMEOUT: Final = 2.0
_READ_CHUNK: Final = 65_536


def scrubbed_environment(home: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a command sees: allow-listed variables, HOME = workspace, then ``extra``."""
    env = {
        key: value for key in INHERITED_ENV if (value := os.environ.get(key)) is not None and not value.startswith("()")
    }
    env.setdefault("PATH", os.defpath)
    env.setdefault("LANG", "C.UTF-8")
    env["HOME"] = home
    env["TERM"] = "dumb"
    env.update(extra or {})
    return env


class OutputCapture:
    """Keeps the first and last ``limit // 2`` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self._half = max(limit // 2, 1)
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if len(self._head) < self._half:
            take = self._half - len(self._head)
            self._head += chunk[:take]
            chunk = chunk[take:]
        if chunk:
            self._tail += chunk
            if len(self._tail) > self._half:
                del self._tail[: len(self._tail) - self._half]

    def text(self) -> str:
        omitted = self.total - len(self._head) - len(self._tail)
        head = self._head.decode("utf-8", errors="replace")
        tail = self._tail.decode("utf-8", errors="replace")
        if omitted <= 0:
            return head + tail
        return f"{head}\n[… {omitted} bytes of output omitted …]\n{tail}"

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(_READ_CHUNK):
            self.feed(chunk)


class BashArgs(ToolArgs):
    command: str = Field(min_length=1, max_length=100_000, description="The bash command to run.")
    timeout: float = Field(
        default=DEFAULT_TIMEOUT, gt=0, le=MAX_TIMEOUT, description="Seconds before the command is killed."
    )


class BashTool(BuiltinTool[BashArgs]):
    name = "bash"
    description = (
        "Run a bash command in the workspace root (non-interactive; stdin is closed). Returns combined stdout "
        "and stderr (long output is cut in the middle) and the exit code. Background processes are killed "
        "when the command ends."
    )
    args_model = BashArgs
    effect_kind = EffectKind.UNKNOWN
    idempotency_kind = Idempotency.NONE

    def __init__(
        self,
        workspace: Workspace,
        *,
        env: Mapping[str, str] | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        kill_grace: float = KILL_GRACE,
        drain_timeout: float = DRAIN_TIMEOUT,
        sandbox: Sandbox = UNCONFINED,
        hidden: Sequence[Path] = (),
    ) -> None:
        """``hidden``: directories the command must not see even when they lie inside the workspace."""
        super().__init__(workspace)
        self._sandbox = sandbox
        self._hidden = tuple(hidden)
        self._extra_env = dict(env or {})
        self._output_limit = output_limit
        self._kill_grace = kill_grace
        self._drain_timeout = drain_timeout
        self._bash = shutil.which("bash") or "/bin/bash"

    def _plan(self, args: BashArgs) -> Plan[BashArgs]:
        if not args.command.strip():
            raise ToolArgumentsError("command must not be blank")
        if "\x00" in args.command:
            raise ToolArgumentsError("command contains a NUL byte")
        requirements = exec_requirements(self._scope, args.command)
        first = args.command.strip().splitlines()[0]
        return Plan(args, requirements, f"bash: {first[:200]}")

    @property
    def sandbox(self) -> Sandbox:
        return self._sandbox

    async def _run(self, args: BashArgs, ctx: ToolContext) -> ToolResult:
        root = str(self.workspace.root)
        argv = self._sandbox.wrap([self._bash, "-c", args.command], workspace=self.workspace.root, hidden=self._hidden)
        spawn = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *argv,
                cwd=root,
                env=scrubbed_environment(root, self._extra_env),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        )
        try:
            process = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            # Cancelled while the process was starting: it may run already, with children of its own in its group
            # (asyncio would kill only the leader). End the whole group, then pass the cancellation on.
            await _stop_spawned(spawn)
            raise
        if process.stdout is None:  # pragma: no cover - stdout=PIPE always sets it
            raise RuntimeError("bash started without a stdout pipe")
        capture = OutputCapture(self._output_limit)
        reader = asyncio.create_task(capture.drain(process.stdout), name="bash-output")  # ended below, always
        timed_out = False
        stream_left_open = False
        try:
            try:
                async with asyncio.timeout(args.timeout):
                    await wait_exited(process)
            except TimeoutError:
                timed_out = True
                inner = self._sandbox.command_groups(process.pid)
                await stop_group(process, grace=self._kill_grace, term_groups=inner)
            # Whatever the command left running in its group would keep the pipe open: stop it.
            signal_group(process, signal.SIGKILL)
            try:
                async with asyncio.timeout(self._drain_timeout):
                    await asyncio.shield(reader)
            except TimeoutError:
                stream_left_open = True
                abandon_pipes(process)
        finally:
            if process.returncode is None:
                signal_group(process, signal.SIGKILL)
            if not reader.done():
                await cancel_and_wait(reader)  # the pipe was abandoned or we are cancelled: stop reading it
            if process.returncode is None:
                await stop_group(process)

        output = capture.text()
        code = process.returncode
        if timed_out:
            footer = f"[timed out after {args.timeout:g}s; the command's process group was killed]"
        elif code is not None and code < 0:
            footer = f"[killed by signal {-code}]"
        else:
            footer = f"[exit code: {code}]"
        if stream_left_open:
            footer += "\n[output may be incomplete: a process outside the group kept the stream open]"
        separator = "" if not output or output.endswith("\n") else "\n"
        return ToolResult(output=f"{output}{separator}{footer}", is_error=timed_out or code != 0)


async def _stop_spawned(spawn: asyncio.Future[asyncio.subprocess.Process]) -> None:
    """Kill and reap the process group of a spawn whose caller was cancelled (nothing when it failed to start)."""
    try:
        process = await spawn
    except Exception:  # it never started: nothing runs
        return
    signal_group(process, signal.SIGKILL)
    await stop_group(process)
