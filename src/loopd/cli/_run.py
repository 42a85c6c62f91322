"""`loopd run`: the harness's terminal transport — one prompt, or a REPL, on the standard rig.

Exit codes: 0 the turn (or the REPL) ended normally; 1 the turn failed or the session broke; 2 bad input (an
unknown session id, an unreadable policy file, a model that cannot be configured); 130 interrupted (Ctrl-C);
143 terminated (SIGTERM). Every exit path shuts the session down and closes the rig (journal, model).
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import signal
import sys
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, TextIO

import typer
from rich.console import Console

from loopd._paths import ensure_private_dir
from loopd.cli._errors import CliError, cli_console, model_config, run_async
from loopd.cli._run_conversation import EXIT_FAILED, EXIT_INTERRUPTED, Conversation, open_gates
from loopd.cli._run_input import LineInput
from loopd.cli._run_mcp import mcp_servers_for
from loopd.cli._run_view import RunView
from loopd.cli._sandbox_option import sandbox_for, sandbox_option
from loopd.harness import ForkPointError, ForkWorkspaceError, HarnessError, Session, SessionNotFoundError
from loopd.harness.actors import Rig
from loopd.harness.core.workspace import ForkWorkspace
from loopd.harness.foreign import ENGINE_KEYS, ForeignEngine, ForeignKind, standard_engine
from loopd.harness.gate import DEFAULT_POLICY, FileRuleStore, GatePolicyError, load_policy
from loopd.harness.journal import last_settled_seq
from loopd.harness.models import ModelConfig, PriceTableError
from loopd.harness.snapshots import SNAPSHOT_TRIGGERS, workspace_is_empty
from loopd.harness.standard import (
    JOURNAL_FILE,
    MAIN_LOOP,
    STANDARD_MODES,
    HarnessSettings,
    default_data_dir,
    open_standard_rig,
)
from loopd.harness.tools import ASK_TIMEOUT_DEFAULT

EXIT_USAGE: Final = 2
EXIT_TERMINATED: Final = 143
MCP_LOG: Final = "mcp-servers.log"
"""Where the stdio MCP servers of `loopd run` write their stderr (in the data directory)."""
SHUTDOWN_TIMEOUT: Final = 15.0
"""Seconds the session gets to stop on exit before it is dropped (its journal stays consistent either way)."""


@dataclass(frozen=True)
class RunOptions:
    workspace: Path
    data_dir: Path
    prompt: str | None = None
    model: str | None = None
    base_url: str | None = None
    policy: Path | None = None
    resume: str | None = None
    fork: str | None = None
    """``--fork ID[@SEQ]``: a new session with session ID's history up to journal seq SEQ (default: its last settled
    point); ID itself is not touched."""
    sandbox: str | None = None
    """``--sandbox``: auto | bubblewrap | none (None: ``$LOOPD_SANDBOX``, else auto)."""
    snapshots: str = "turn_done"
    """``--snapshots``: when the workspace is snapshotted (turn_done | step_done | idle | off); /undo and /diff."""
    mcp_config: Path | None = None
    """``--mcp-config``: a file of MCP servers in the ``mcpServers`` format."""
    trust_workspace_mcp: bool = False
    """``--trust-workspace-mcp``: load the workspace's ``.mcp.json`` without asking (it runs its commands)."""
    engine: str | None = None
    """``--engine claude|codex``: the main loop hands its turns to that coding-agent CLI (a foreign loop)."""
    engine_command: str | None = None
    """``--engine-command``: the engine's command line (default: ``claude`` / ``codex`` on PATH)."""
    fork_workspace: Path | None = None
    """``--fork-workspace DIR`` (with --fork): put the parent's workspace snapshot at the fork point into DIR (new
    or empty) and work there."""
    restore_workspace: bool = False
    """``--restore-workspace`` (with --fork): put this workspace back to the parent's snapshot at the fork point,
    overwriting what it holds now."""
    mode: str | None = None
    """``--mode plan|build``: the main loop's mode (a new session starts in it; a resumed or forked one switches)."""


def run_command(
    prompt: str | None = typer.Argument(None, help="Answer this one prompt, then exit. Without it: a REPL."),
    workspace: Path | None = typer.Option(
        None,
        "--workspace",
        "-w",
        exists=True,
        file_okay=False,
        resolve_path=True,
        help="The directory the tools work in (default: the current directory).",
    ),
    data_dir: Path | None = typer.Option(
        None,
        "--data-dir",
        help="Where the session journal lives (default: $LOOPD_DATA_DIR/harness, or ~/.local/share/loopd/harness).",
    ),
    model: str | None = typer.Option(
        None, "--model", help="Model id or fallback chain A,B, each [openai:|anthropic:]ID (default: $LOOPD_MODEL)."
    ),
    base_url: str | None = typer.Option(
        None, "--base-url", help="An OpenAI-compatible endpoint (default: $OPENAI_BASE_URL)."
    ),
    policy: Path | None = typer.Option(
        None, "--policy", help="Gate policy file (YAML/JSON): tool access and the unattended answer."
    ),
    resume: str | None = typer.Option(
        None, "--resume", metavar="SESSION_ID", help="Continue a session from the journal."
    ),
    fork: str | None = typer.Option(
        None,
        "--fork",
        metavar="SESSION_ID[@SEQ]",
        help="Start a new session from another one's history up to journal seq SEQ (default: its last finished "
        "turn); the original is left as it is.",
    ),
    sandbox: str | None = sandbox_option(),
    snapshots: str = typer.Option(
        "turn_done",
        "--snapshots",
        help="When to snapshot the workspace (for /undo and /diff): turn_done, step_done, idle or off.",
    ),
    mcp_config: Path | None = typer.Option(
        None, "--mcp-config", help='MCP servers to load: a JSON file {"mcpServers": {NAME: {command|url, ...}}}.'
    ),
    trust_workspace_mcp: bool = typer.Option(
        False,
        "--trust-workspace-mcp",
        help="Load the workspace's .mcp.json without asking (it starts the commands it names).",
    ),
    engine: str | None = typer.Option(
        None,
        "--engine",
        metavar="claude|codex",
        help="Hand each turn to that coding-agent CLI (a foreign loop: its session resumes, its permission "
        "requests come to the gate) instead of a model.",
    ),
    engine_command: str | None = typer.Option(
        None, "--engine-command", metavar="COMMAND", help="The engine's command line (default: claude / codex)."
    ),
    fork_workspace: Path | None = typer.Option(
        None,
        "--fork-workspace",
        metavar="DIR",
        file_okay=False,
        resolve_path=True,
        help="With --fork: restore the original's workspace snapshot at the fork point into DIR (new or empty) "
        "and work there.",
    ),
    restore_workspace: bool = typer.Option(
        False,
        "--restore-workspace",
        help="With --fork: put this workspace back to the original's snapshot at the fork point (overwrites the "
        "files it holds now).",
    ),
    mode: str | None = typer.Option(
        None, "--mode", metavar="plan|build", help="The main loop's mode: plan (read-only tools) or build (all)."
    ),
) -> None:
    """Talk to the harness in the terminal: stream answers, show tool calls, ask before tools act.

    Permission questions take a (approve once), l (always: stored in <workspace>/.loopd/gate-rules.json) or
    d (deny). Without a terminal on stdin they get the policy file's `unattended` answer (default: deny).
    """
    options = RunOptions(
        workspace=(workspace or Path.cwd()).resolve(),
        data_dir=data_dir.expanduser().resolve() if data_dir else _default_run_data_dir(),
        prompt=prompt,
        model=model,
        base_url=base_url,
        policy=policy,
        resume=resume,
        fork=fork,
        sandbox=sandbox,
        snapshots=snapshots,
        mcp_config=mcp_config,
        trust_workspace_mcp=trust_workspace_mcp,
        engine=engine,
        engine_command=engine_command,
        fork_workspace=fork_workspace,
        restore_workspace=restore_workspace,
        mode=mode,
    )
    code = run_async(run_harness(options))
    if code:
        raise typer.Exit(code)


async def run_harness(
    options: RunOptions,
    *,
    console: Console | None = None,
    out: TextIO | None = None,
    terminal: LineInput | None = None,
) -> int:
    """Run `loopd run` with ``options``; returns the exit code.

    ``console`` (stderr), ``out`` (stdout) and ``terminal`` (stdin) default to the process's own.
    """
    view = RunView(console=console or cli_console(), out=out or sys.stdout, resume_options=_resume_options(options))
    if options.prompt is not None and not options.prompt.strip():
        view.error("the prompt is empty")
        return EXIT_USAGE
    if options.fork is not None:
        if options.resume:
            view.error("--fork and --resume exclude each other: --fork starts a new session, --resume continues one")
            return EXIT_USAGE
        try:
            parse_fork(options.fork)
        except CliError as exc:
            view.error(exc.line())
            return exc.exit_code
    if options.snapshots not in SNAPSHOT_TRIGGERS:
        view.error(f"--snapshots {options.snapshots!r}: use one of {', '.join(SNAPSHOT_TRIGGERS)}")
        return EXIT_USAGE
    try:
        options = await _fork_workspace_options(options)
        _check_mode(options)
    except CliError as exc:
        view.error(exc.line())
        return exc.exit_code
    try:
        foreign = _foreign_engine(options)
        policy = DEFAULT_POLICY if options.policy is None else load_policy(options.policy)
        config = ModelConfig.prices_only() if foreign is not None else model_config(options.model, options.base_url)
        confinement = sandbox_for(options.sandbox)
    except GatePolicyError as exc:
        view.error(str(exc))
        return EXIT_USAGE
    except CliError as exc:
        view.error(exc.line())
        return exc.exit_code
    line_input = terminal or LineInput.for_stdin()
    try:
        # A foreign engine's CLI loads its own MCP servers: the workspace's .mcp.json is not ours to start then.
        mcp_servers = (
            ()
            if foreign is not None
            else await mcp_servers_for(
                options.workspace,
                options.mcp_config,
                trust_workspace=options.trust_workspace_mcp,
                view=view,
                terminal=line_input,
            )
        )
    except CliError as exc:
        view.error(exc.line())
        return exc.exit_code
    view.model_url = config.base_url
    settings = HarnessSettings(
        workspace=options.workspace,
        data_dir=options.data_dir,
        model=config,
        policy=policy,
        sandbox=confinement,
        snapshots=options.snapshots,  # type: ignore[arg-type]  # one of SNAPSHOT_TRIGGERS (checked above)
        ask_user_timeout=ASK_TIMEOUT_DEFAULT,  # the model may ask: the next line typed answers
        mcp_servers=mcp_servers,
        mcp_report=view.warning,
        foreign=foreign,
        mode=options.mode,
    )
    conversation = Conversation(
        view=view,
        terminal=line_input,
        policy=policy,
        rules_file=FileRuleStore.for_workspace(options.workspace).path,
    )
    main = asyncio.current_task()
    if main is None:
        raise RuntimeError("run_harness must run in a task")
    conversation.bind_main_task(main)
    with _signal_handlers(conversation), view.holding_log_lines():
        try:
            return await _converse(settings, options, conversation, view)
        except asyncio.CancelledError:
            if conversation.quit_code is None:
                raise
            main.uncancel()  # our own cancellation (Ctrl-C / SIGTERM): it ends here as an exit code
            return conversation.quit_code
        finally:
            view.close()


async def _converse(settings: HarnessSettings, options: RunOptions, conversation: Conversation, view: RunView) -> int:
    journal = settings.data_dir / JOURNAL_FILE
    async with AsyncExitStack() as stack:
        try:
            ensure_private_dir(settings.data_dir)  # transcripts hold file contents: 0700, like `loopd up`
            if settings.mcp_servers:  # the stdio servers' stderr goes to a log, not between the answer's lines
                errlog = stack.enter_context(open(settings.data_dir / MCP_LOG, "a", encoding="utf-8"))  # noqa: SIM115, ASYNC230
                settings = replace(settings, mcp_errlog=errlog)
            rig = await stack.enter_async_context(open_standard_rig(settings))
        except (HarnessError, PriceTableError, OSError) as exc:
            view.error(f"cannot open the harness: {exc}")
            return EXIT_USAGE
        try:
            session = await _open_session(rig, options)
        except SessionNotFoundError as exc:
            view.error(f"no session {exc.session_id!r} in {journal} (check the id and --data-dir)")
            return EXIT_USAGE
        except (ForkPointError, ForkWorkspaceError) as exc:
            view.error(f"--fork {options.fork}: {exc}")
            return EXIT_USAGE
        except HarnessError as exc:
            view.error(f"cannot open the session: {exc}")
            return EXIT_USAGE
        stack.push_async_callback(_close_session, session, conversation, view)
        conversation.attach(session)
        shown = settings.foreign.name if settings.foreign is not None else settings.model.model
        view.session_opened(session.id, workspace=settings.workspace, model=shown, journal=journal)
        if settings.sandbox is not None and settings.foreign is None:
            view.note(settings.sandbox.describe())
        if settings.model.is_demo and settings.foreign is None:
            view.demo_note()
        if options.fork:
            info = await rig.journal.session(session.id)
            if info is not None and info.parent_id is not None:
                view.note(f"forked from session {info.parent_id} at seq {info.parent_seq} (that session is untouched)")
            _note_fork_workspace(session, options, view)
        elif session.state.workspace.directory and Path(session.state.workspace.directory) != settings.workspace:
            view.warning(
                f"this session's workspace is {session.state.workspace.directory} (restored there when it was "
                f"forked), not {settings.workspace}: add --workspace {shlex.quote(session.state.workspace.directory)}"
            )
        if options.mode is not None and (options.resume or options.fork):
            await session.set_loop_mode(options.mode, loop=MAIN_LOOP)  # a new session starts in it already
        if options.resume or options.fork:
            loop = session.state.loops.get(MAIN_LOOP)
            view.recap(
                turns=loop.turns if loop else 0,
                last_reply=loop.last_reply if loop else None,
                usage=session.usage,
                questions=len(open_gates(session.state)),
            )
        try:
            if options.resume:
                await conversation.resume_open_turns()  # before the REPL reads a line or the prompt runs
            if options.prompt is not None:
                return await conversation.one_shot(options.prompt)
            return await conversation.repl()
        except HarnessError as exc:
            view.error(str(exc))
            return EXIT_FAILED


async def _close_session(session: Session, conversation: Conversation, view: RunView) -> None:
    conversation.closing()
    view.stop_spinner()
    drain = 0.0 if conversation.quit_code is not None else None
    try:
        async with asyncio.timeout(SHUTDOWN_TIMEOUT):
            await session.shutdown(drain_timeout=drain, reason="loopd run exited")
    except TimeoutError:
        session.abort()
        view.warning(f"the session did not stop within {SHUTDOWN_TIMEOUT:g}s; it was dropped (restore it later)")
    except HarnessError as exc:
        view.warning(f"closing the session: {exc}")
    left_open = len(open_gates(session.state))
    if left_open:
        view.questions_left_open(session.id, left_open)
    stats = session.statistics()
    view.session_closed(session.id, turns=stats.turns, usage=stats.usage, unmetered_chars=conversation.unmetered_chars)


def parse_fork(value: str) -> tuple[str, int | None]:
    """``--fork ID`` or ``ID@SEQ`` → (ID, SEQ or None: the last settled point); `CliError` (usage) otherwise."""
    session_id, at, seq = value.rpartition("@")
    if not at:
        session_id, seq = value, ""
    elif not seq.isdigit() or int(seq) < 1:
        raise CliError(
            f"--fork {value!r}: SEQ must be a journal seq (1, 2, …)", "e.g. --fork SESSION_ID@12", exit_code=EXIT_USAGE
        )
    if not session_id.strip():
        raise CliError(
            f"--fork {value!r}: no session id", "e.g. --fork SESSION_ID or SESSION_ID@12", exit_code=EXIT_USAGE
        )
    return session_id, int(seq) if seq else None


async def _open_session(rig: Rig, options: RunOptions) -> Session:
    """The session `loopd run` talks to: restored (--resume), forked (--fork) or new."""
    if options.resume:
        return await rig.restore_session(options.resume)
    if options.fork:
        parent, seq = parse_fork(options.fork)
        if seq is None:  # the parent's last settled point: right after its last finished turn
            seq = last_settled_seq(await rig.journal.read(parent))
        workspace: ForkWorkspace = (
            "new" if options.fork_workspace is not None else "overwrite" if options.restore_workspace else "keep"
        )
        return await rig.fork_session(parent, seq, workspace=workspace)
    return await rig.start_session()


async def _fork_workspace_options(options: RunOptions) -> RunOptions:
    """Check ``--fork-workspace`` / ``--restore-workspace`` (`CliError`, usage); with ``--fork-workspace DIR`` the
    options work in DIR, created when missing (it must be empty: the fork never overwrites files there)."""
    wanted = options.fork_workspace is not None or options.restore_workspace
    if not wanted:
        return options
    flag = "--fork-workspace" if options.fork_workspace is not None else "--restore-workspace"
    if options.fork is None:
        raise CliError(f"{flag} needs --fork SESSION_ID[@SEQ]", exit_code=EXIT_USAGE)
    if options.fork_workspace is not None and options.restore_workspace:
        raise CliError(
            "--fork-workspace and --restore-workspace exclude each other",
            "--fork-workspace DIR restores into a new directory, --restore-workspace over this one",
            exit_code=EXIT_USAGE,
        )
    if options.snapshots == "off":
        raise CliError(f"{flag} needs workspace snapshots: drop --snapshots off", exit_code=EXIT_USAGE)
    if options.fork_workspace is None:
        return options
    target = options.fork_workspace.expanduser().resolve()
    if not await asyncio.to_thread(workspace_is_empty, target):
        raise CliError(
            f"--fork-workspace {target}: the directory is not empty",
            "name a new directory (or use --restore-workspace to overwrite the current workspace)",
            exit_code=EXIT_USAGE,
        )
    try:
        # Private, like the snapshot store it is filled from (it may hold copies of files only its owner could read).
        await asyncio.to_thread(target.mkdir, mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"--fork-workspace {target}: cannot create it: {exc}", exit_code=EXIT_USAGE) from exc
    return replace(options, workspace=target, fork_workspace=target)


def _check_mode(options: RunOptions) -> None:
    """``--mode``: one of the standard modes, and not with a foreign engine (its CLI has its own)."""
    if options.mode is None:
        return
    names = [m.name for m in STANDARD_MODES]
    if options.mode not in names:
        raise CliError(f"--mode {options.mode!r}: use one of {', '.join(names)}", exit_code=EXIT_USAGE)
    if options.engine is not None:
        raise CliError("--mode does not apply to --engine (its CLI decides what tools may do)", exit_code=EXIT_USAGE)


def _note_fork_workspace(session: Session, options: RunOptions, view: RunView) -> None:
    """Say what the fork's workspace is: restored from a snapshot (where), or as it is now (and how to restore)."""
    history = session.state.workspace
    if options.fork_workspace is not None or options.restore_workspace:
        current = history.current
        ref = current.ref[:12] if current is not None else "?"
        view.note(f"the workspace {options.workspace} is as it was at the fork point (snapshot {ref})")
    elif history.checkpoints:
        view.note(
            "the workspace is as it is now, not as it was at the fork point: --fork-workspace DIR restores that "
            "snapshot into a new directory, --restore-workspace over this one"
        )


def _resume_options(options: RunOptions) -> str:
    """The options `loopd run --resume` needs besides the id to find the session again (and its engine)."""
    extra = ""
    if options.fork_workspace is not None:  # the fork works in its own directory
        extra += f" --workspace {shlex.quote(str(options.fork_workspace.expanduser().resolve()))}"
    if options.engine is not None:
        extra += f" --engine {shlex.quote(options.engine)}"
    if options.engine_command is not None:
        extra += f" --engine-command {shlex.quote(options.engine_command)}"
    if options.data_dir == _default_run_data_dir():
        return extra
    return f" --data-dir {shlex.quote(str(options.data_dir))}" + extra


def _foreign_engine(options: RunOptions) -> ForeignEngine | None:
    """The ``--engine`` of the options (`CliError` for an unknown one or a flag that does not apply)."""
    if options.engine is None:
        if options.engine_command is not None:
            raise CliError("--engine-command needs --engine claude|codex", exit_code=EXIT_USAGE)
        return None
    if options.engine not in ENGINE_KEYS:
        raise CliError(f"--engine {options.engine!r}: use claude or codex", exit_code=EXIT_USAGE)
    if options.model is not None or options.mcp_config is not None:
        raise CliError(
            "--model and --mcp-config do not apply to --engine",
            "configure the CLI's own model and MCP servers (e.g. in --engine-command)",
            exit_code=EXIT_USAGE,
        )
    command = tuple(shlex.split(options.engine_command)) if options.engine_command else ()
    kind: ForeignKind = "claude" if options.engine == "claude" else "codex"
    return standard_engine(kind, command, options.workspace)  # inherits its provider's variables only


def _default_run_data_dir() -> Path:
    return (default_data_dir() / "harness").expanduser().resolve()


@contextlib.contextmanager
def _signal_handlers(conversation: Conversation) -> Iterator[None]:
    """Ctrl-C and SIGTERM go to the conversation while the block runs (only possible in the main thread)."""
    loop = asyncio.get_running_loop()
    handlers = {
        signal.SIGINT: conversation.on_sigint,
        signal.SIGTERM: lambda: conversation.quit(EXIT_TERMINATED),
    }
    installed: list[signal.Signals] = []
    for signum, handler in handlers.items():
        try:
            loop.add_signal_handler(signum, handler)
        except (ValueError, RuntimeError, NotImplementedError):
            continue
        installed.append(signum)
    try:
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


__all__ = ["EXIT_INTERRUPTED", "EXIT_TERMINATED", "EXIT_USAGE", "RunOptions", "run_command", "run_harness"]
