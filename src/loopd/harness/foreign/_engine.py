"""A foreign loop's engine: an external coding-agent CLI run as a subprocess, once per turn.

`ForeignEngine` is what a `LoopDefinition` takes as its ``model`` to become a foreign loop. The loop actor calls
`run_foreign_turn` for each turn: it starts the CLI in its own process group, gives it the turn's prompt, reads its
JSON lines through the pure parsers of `_protocols`, hands every neutral event to the caller, answers claude's
permission requests with the caller's decision, and returns the `Finished` line. Whatever way it ends (an answer, a
failure, a timeout, a cancellation by an interrupt or a shutdown), the process group is gone before it returns:
SIGTERM, ``kill_grace`` seconds, then SIGKILL, each wait bounded.

Command lines (``command`` is the executable and any flags of the caller's, e.g. ``("claude", "--model", "x")``):

* claude: ``command -p --output-format stream-json --verbose --input-format stream-json
  --permission-prompt-tool stdio [--resume ID]``; the prompt is a stream-json ``user`` line on stdin, stdin stays
  open for the permission answers and is closed once the ``result`` line arrives.
* codex: ``command exec --json [resume ID] -``; the prompt is written to stdin (``-``), which is then closed.

The prompt never appears on the command line (no option injection from user text, nothing in the process list), and a
session id that is not a plain token is refused (`ForeignEngineError`) rather than put there.

``model`` names the model the CLI runs, for pricing a turn whose CLI reports tokens but no USD (codex): the loop
actor prices it with the rig's price table. `standard_engine` finds it in the command's own flags (``-m`` /
``--model``, codex's ``-c model=…``), else, for codex, in its ``config.toml`` (`configured_model`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import signal
import sys
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from loopd._infra.tasks import finish_shielded
from loopd.harness._errors import HarnessError, ModelPermanentError
from loopd.harness.foreign._protocols import (
    Finished,
    ForeignEvent,
    ForeignProtocolError,
    PermissionRequest,
    claude_permission_reply,
    claude_user_line,
    parse_claude_line,
    parse_codex_line,
)
from loopd.harness.models import ModelChunk, ModelRequest

ForeignKind = Literal["claude", "codex"]
PermissionDecider = Callable[[PermissionRequest], Awaitable[tuple[bool, str]]]
"""Answers one permission request: (allowed, the reason given to the CLI when denied)."""

_LINE_LIMIT = 8 * 1024 * 1024  # one JSON line (a large tool result) may be long
_STDERR_KEEP = 4096
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # how the CLIs name sessions (uuids, thread ids)


def plain_session_id(session_id: str) -> bool:
    """Whether a session id a CLI reported may go on a later command line (a plain token: letters, digits, ._:-)."""
    return _SESSION_ID.fullmatch(session_id) is not None


SAFE_ENVIRONMENT: tuple[str, ...] = (
    "HOME", "USER", "LOGNAME", "PATH", "SHELL", "TERM", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ",
    "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME",
)  # fmt: skip
"""What a foreign CLI inherits from this process's environment without being told (see `ForeignEngine`)."""


def foreign_environment(engine: ForeignEngine) -> dict[str, str]:
    """The environment of ``engine``'s CLI: the safe variables, the ``inherit`` ones, then ``engine.env``."""
    names = (*SAFE_ENVIRONMENT, *engine.inherit)
    base = {name: value for name in names if (value := os.environ.get(name)) is not None}
    return {**base, **engine.env}


class ForeignEngineError(HarnessError):
    """The foreign CLI could not be started, or it ended without finishing its turn."""


@dataclass(frozen=True, slots=True)
class ForeignEngine:
    """An external coding-agent CLI as a loop's engine (give it as `LoopDefinition.model`).

    ``kind``: which protocol it speaks; ``command``: the executable and the caller's own flags (default: the
    ``claude`` / ``codex`` on PATH); ``cwd``: where it runs (the workspace); ``kill_grace``: seconds between SIGTERM
    and SIGKILL when a turn is stopped. The turn's time limit is the loop's ``model_timeout``.

    The CLI does not inherit this process's environment (its API keys, tokens, database DSNs): it gets
    `SAFE_ENVIRONMENT` (HOME is kept, so a CLI finds its login and its stored sessions), the variables named in
    ``inherit`` (e.g. ``("ANTHROPIC_API_KEY",)``), then ``env``.

    ``model``: the model the CLI runs (None: unknown), which prices a turn whose CLI reports no cost (see the module
    docstring); it does not choose the model: the CLI's own flags and configuration do.
    """

    kind: ForeignKind
    command: tuple[str, ...] = ()
    cwd: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    inherit: tuple[str, ...] = ()
    kill_grace: float = 2.0
    model: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("claude", "codex"):
            raise ValueError(f"unknown foreign engine kind {self.kind!r} (claude or codex)")
        if self.kill_grace <= 0:
            raise ValueError("kill_grace must be positive")

    @property
    def name(self) -> str:
        """The engine's name where a model name is expected (fingerprints, traces)."""
        return f"foreign:{self.kind}"

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Not a chat model: a foreign engine runs whole turns in the loop actor (compaction cannot use it)."""
        raise ModelPermanentError(f"{self.name} runs whole turns of a foreign loop; it is not a chat model")

    def argv(self, resume: str | None) -> list[str]:
        """The command line of one turn (resuming the foreign session ``resume`` when given); the prompt goes to
        stdin (`stdin_text`)."""
        if resume is not None and not plain_session_id(resume):
            raise ForeignEngineError(f"refusing to resume {self.kind} session {resume[:80]!r}: not a plain id")
        if self.kind == "claude":
            base = list(self.command or ("claude",))
            args = ["-p", "--output-format", "stream-json", "--verbose", "--input-format", "stream-json"]
            args += ["--permission-prompt-tool", "stdio"]
            return base + args + (["--resume", resume] if resume else [])
        base = list(self.command or ("codex",))
        return base + ["exec", "--json"] + (["resume", resume] if resume else []) + ["-"]

    def stdin_text(self, prompt: str) -> str:
        """What the turn writes to the CLI's stdin first: claude's stream-json user line, or codex's plain prompt."""
        return claude_user_line(prompt) if self.kind == "claude" else prompt


ENGINE_KEYS: dict[ForeignKind, tuple[str, ...]] = {
    "claude": ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "CLAUDE_CONFIG_DIR"),
    "codex": ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CODEX_HOME"),
}
"""What each engine's CLI inherits besides the safe environment when loopd builds it (`loopd run --engine`,
``loopd harness serve --engine``, a ``kind: foreign`` harness target): its own provider's key and settings only."""


def standard_engine(kind: ForeignKind, command: tuple[str, ...] = (), cwd: Path | None = None) -> ForeignEngine:
    """The engine loopd's commands and configuration build for ``kind`` (inheriting `ENGINE_KEYS` ``[kind]``), its
    ``model`` the one `configured_model` finds."""
    if kind not in ENGINE_KEYS:
        raise ValueError(f"unknown foreign engine kind {kind!r} (claude or codex)")
    engine = ForeignEngine(kind=kind, command=command, cwd=cwd, inherit=ENGINE_KEYS[kind])
    return replace(engine, model=configured_model(engine))


_MODEL_FLAGS = ("-m", "--model")
_CONFIG_FLAGS = ("-c", "--config")
_PROFILE_FLAGS = ("-p", "--profile")
_MAX_CONFIG_BYTES = 1_048_576


def _flag_values(command: tuple[str, ...], names: tuple[str, ...]) -> list[str]:
    """The values given to the flags ``names`` in ``command`` (``-m X``, ``--model X``, ``--model=X``)."""
    values: list[str] = []
    for position, word in enumerate(command[1:], start=1):
        if word in names and position + 1 < len(command):
            values.append(command[position + 1])
        elif word.startswith("--") and "=" in word and word.split("=", 1)[0] in names:
            values.append(word.split("=", 1)[1])
    return values


def _toml_string(text: str) -> str | None:
    """A ``-c key=value`` value as codex reads it (TOML, falling back to the literal string)."""
    try:
        value = tomllib.loads(f"v = {text}").get("v")
    except tomllib.TOMLDecodeError:
        return text.strip() or None
    return value if isinstance(value, str) and value else None


def configured_model(engine: ForeignEngine) -> str | None:
    """The model ``engine``'s CLI runs, as far as loopd can tell: the last ``-m`` / ``--model`` of its command;
    for codex, else a ``-c model=…`` override, else ``model`` in its ``config.toml`` (``$CODEX_HOME``, as the CLI
    will see it, else ``~/.codex``), from the profile the command or the file selects when that profile names
    one. None when nothing says (the turn's cost is then what the CLI reports)."""
    named = _flag_values(engine.command, _MODEL_FLAGS)
    if named:
        return named[-1] or None
    if engine.kind != "codex":
        return None
    overrides = [option.partition("=") for option in _flag_values(engine.command, _CONFIG_FLAGS)]
    models = [value for key, _, value in overrides if key.strip() == "model"]
    if models:
        return _toml_string(models[-1])
    environment = foreign_environment(engine)
    home = environment.get("CODEX_HOME")
    if not home and "HOME" in environment:
        home = str(Path(environment["HOME"]) / ".codex")
    if not home:
        return None
    path = Path(home).expanduser() / "config.toml"
    try:
        with path.open("rb") as file:
            config = tomllib.loads(file.read(_MAX_CONFIG_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # no file, or one the CLI would refuse too
    profiles = _flag_values(engine.command, _PROFILE_FLAGS)
    profile = profiles[-1] if profiles else config.get("profile")
    chosen = (config.get("profiles") or {}).get(profile) if isinstance(profile, str) else None
    if isinstance(chosen, dict) and isinstance(chosen.get("model"), str) and chosen["model"]:
        return str(chosen["model"])
    model = config.get("model")
    return model if isinstance(model, str) and model else None


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes Linux SIGKILL the child when the thread that started it dies (``prctl(2)``
    ``PR_SET_PDEATHSIG``), so a CLI never outlives a hard-crashed harness (SIGKILL, OOM) and goes on acting in the
    workspace unwatched; None off Linux. The C library is looked up here, in the parent: the child only calls it.
    A parent that died before the call (the child was re-parented) ends the child at once."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return die_with_parent


async def _terminate(process: asyncio.subprocess.Process, grace: float) -> None:
    """End the process group of ``process`` (SIGTERM, then SIGKILL after ``grace``); every wait is bounded."""
    if process.returncode is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await process.wait()
            return


async def _drain(stream: asyncio.StreamReader, keep: bytearray) -> None:
    """Read ``stream`` to its end, keeping its last bytes (stderr: for the error message only)."""
    while chunk := await stream.read(65536):
        keep.extend(chunk)
        del keep[:-_STDERR_KEEP]


async def run_foreign_turn(
    engine: ForeignEngine,
    prompt: str,
    *,
    resume: str | None,
    on_event: Callable[[ForeignEvent], None],
    permit: PermissionDecider,
) -> Finished:
    """Run one turn of ``engine`` and return its `Finished` line (see the module docstring).

    Raises `ForeignEngineError` (not startable, or ended without a ``result`` / ``turn.*`` line) and
    `ForeignProtocolError` (a line that is not a JSON object). The caller bounds the time (``asyncio.timeout``).
    """
    parse = parse_claude_line if engine.kind == "claude" else parse_codex_line
    argv = engine.argv(resume)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=engine.cwd,
            env=foreign_environment(engine),
            start_new_session=True,  # its own process group: a stop ends the CLI's children too
            preexec_fn=parent_death_signal(),  # and a hard crash of this process ends the CLI
            limit=_LINE_LIMIT,
        )
    except OSError as exc:
        raise ForeignEngineError(f"cannot start {argv[0]!r} ({exc}): install it or set ForeignEngine.command") from exc
    stderr = bytearray()
    try:
        assert process.stdout is not None and process.stderr is not None
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(_drain(process.stderr, stderr))
            finished = await _read_turn(engine, process, prompt, parse, on_event, permit)
            if process.stdin is not None and not process.stdin.is_closing():
                process.stdin.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(engine.kill_grace):
                    await process.wait()
            await _terminate(process, engine.kill_grace)  # a CLI that lingers after its answer
        if finished is None:
            tail = stderr.decode(errors="replace").strip()[-500:]
            raise ForeignEngineError(
                f"{engine.kind} exited (code {process.returncode}) before finishing its turn"
                + (f": {tail}" if tail else "")
            )
        return finished
    finally:
        # Shielded: a turn cancelled now (an interrupt, a shutdown) still reaps its CLI (bounded by the grace + 5 s).
        await finish_shielded(_terminate(process, engine.kill_grace))


async def _read_turn(
    engine: ForeignEngine,
    process: asyncio.subprocess.Process,
    prompt: str,
    parse: Callable[[str], list[ForeignEvent]],
    on_event: Callable[[ForeignEvent], None],
    permit: PermissionDecider,
) -> Finished | None:
    assert process.stdout is not None
    stdin = process.stdin
    assert stdin is not None
    stdin.write(engine.stdin_text(prompt).encode())
    with contextlib.suppress(ConnectionError):  # a CLI that is gone already: its exit code and stderr say why
        async with asyncio.timeout(30.0):
            await stdin.drain()
    if engine.kind == "codex":
        stdin.close()  # codex reads its prompt to the end of stdin; it asks nothing back
    while True:
        try:
            line = await process.stdout.readline()
        except ValueError as exc:  # one line longer than the reader's limit
            raise ForeignProtocolError(f"{engine.kind} wrote a line over {_LINE_LIMIT} bytes") from exc
        if not line:
            break
        for event in parse(line.decode(errors="replace")):
            if isinstance(event, PermissionRequest):
                allowed, reason = await permit(event)
                on_event(event)
                if not stdin.is_closing():
                    stdin.write(claude_permission_reply(event, allow=allowed, message=reason).encode())
                    with contextlib.suppress(ConnectionError):
                        async with asyncio.timeout(30.0):
                            await stdin.drain()
                continue
            on_event(event)
            if isinstance(event, Finished):
                return event
    return None
