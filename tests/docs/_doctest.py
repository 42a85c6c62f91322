"""Shell examples in the docs, read as a test reads them: blocks, their directives, and `loopd` invocations.

A fenced ``sh``/``bash`` block in README.md or docs/*.md must be preceded by a directive comment saying how the
test executes it::

    <!-- cli-doctest: session=api -->      run it in bash, in order with the other blocks of session "api"
    <!-- cli-doctest: parse-only: why -->  every `loopd` command in it is parsed against the real CLI, not run

Blocks of one session run as one bash script (variables carry over), in a fresh HOME, with the project's
``.venv/bin`` first on PATH and stdin closed. A line that starts a server (`make run`, `loopd up`, `loopd harness
serve`) is started in the background on a free port; the block's URLs that name the documented default port are
rewritten to that port, and the script waits until the server answers ``/healthz`` before going on.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
import typer.core
import typer.main

from loopd.cli._app import app, command_tree

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
_FENCE = re.compile(r"^```(\w*)\s*$")
_DIRECTIVE = re.compile(r"<!--\s*cli-doctest:\s*(.*?)\s*-->")
_SHELL_LANGUAGES = frozenset({"sh", "bash", "shell", "console"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
LOOPD_PROGRAMS = frozenset({"loopd", ".venv/bin/loopd"})


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    text: str
    directive: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def session(self) -> str | None:
        if self.directive is None:
            return None
        match = re.fullmatch(r"session=([\w-]+)", self.directive)
        return match.group(1) if match else None

    @property
    def parse_only(self) -> bool:
        return self.directive is not None and self.directive.startswith("parse-only:")


def shell_blocks(paths: Sequence[Path] = DOC_FILES) -> list[Block]:
    """Every fenced shell block of the docs, with the directive comment right above it (blank lines allowed)."""
    found: list[Block] = []
    for path in paths:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            fence = _FENCE.match(lines[i])
            if fence is None:
                i += 1
                continue
            language = fence.group(1)
            start = i
            i += 1
            body: list[str] = []
            while i < len(lines) and not _FENCE.match(lines[i]):
                body.append(lines[i])
                i += 1
            i += 1  # the closing fence
            if language not in _SHELL_LANGUAGES:
                continue
            directive = None
            j = start - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            if j >= 0 and (match := _DIRECTIVE.search(lines[j])):
                directive = match.group(1)
            found.append(Block(path, start + 1, language, "\n".join(body) + "\n", directive))
    return found


def logical_lines(text: str) -> Iterator[str]:
    """Lines with backslash continuations joined; here-document bodies are left out."""
    pending = ""
    heredoc_end: str | None = None
    for raw in text.splitlines():
        if heredoc_end is not None:
            if raw.strip() == heredoc_end:
                heredoc_end = None
            continue
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = pending + raw
        pending = ""
        heredoc = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if heredoc:
            heredoc_end = heredoc.group(1)
        yield line
    if pending:
        yield pending


def _commands_of(line: str) -> Iterator[list[str]]:
    """The simple commands of one logical shell line, as words (comments dropped, `$(...)` looked into)."""
    for inner in re.findall(r"\$\(([^()]*)\)", line):
        yield from _commands_of(inner)
    line = re.sub(r"\$\(([^()]*)\)", "SUBST", line)
    for part in re.split(r"\s*(?:&&|\|\||[;|&])\s*", line):
        try:
            words = shlex.split(part, comments=True)
        except ValueError:
            continue
        while words and _ASSIGNMENT.match(words[0]):
            words = words[1:]
        if words and words[0] in ("sudo", "exec", "time", "nohup"):
            words = words[1:]
        if words:
            yield words


_REDIRECT_ALONE = re.compile(r"\d?(?:>>?|<)|&>")
_REDIRECT_ATTACHED = re.compile(r"\d?(?:>>?|<)\S+|&>\S+|\d>&\d")


def _without_redirections(words: list[str]) -> list[str]:
    """Drop the shell's redirections (``> file``, ``2>&1``, ``< /dev/null``): they are not the command's arguments."""
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif _REDIRECT_ALONE.fullmatch(word):
            skip = True
        elif not _REDIRECT_ATTACHED.fullmatch(word):
            kept.append(word)
    return kept


def loopd_invocations(text: str) -> list[list[str]]:
    """Every `loopd …` command in a shell text, as its arguments (without the program)."""
    found: list[list[str]] = []
    for line in logical_lines(text):
        for words in _commands_of(line):
            if words[0] in LOOPD_PROGRAMS:
                found.append(_without_redirections(words[1:]))
    return found


def loopd_in_prose(text: str) -> list[list[str]]:
    """`loopd …` commands quoted in running text (help texts, HTML pages): inside backticks or on <pre> lines."""
    found: list[list[str]] = []
    candidates = re.findall(r"`(loopd [^`]+)`", text)
    for pre in re.findall(r"<pre>(.*?)</pre>", text, re.S):
        candidates.extend(line for line in pre.splitlines() if line.strip().startswith("loopd "))
    for candidate in candidates:
        for words in _commands_of(candidate):
            if words[0] == "loopd" and "…" not in candidate and "..." not in candidate:
                found.append(words[1:])
    return found


class InvocationError(AssertionError):
    pass


def check_invocation(args: Sequence[str]) -> None:
    """Parse ``loopd <args>`` with the real command tree; `InvocationError` names what does not exist."""
    command: Any = typer.main.get_command(app)  # typer's own (vendored) click command classes
    name = "loopd"
    remaining = list(args)
    parent: Any = None
    while True:
        try:
            ctx = command.make_context(name, list(remaining), parent=parent, resilient_parsing=False)
        except typer.Exit:
            return  # --help / --version: fine
        except typer.BadParameter as exc:
            if _missing_path(exc):
                return  # the option exists; the docs create that path in a step this check does not run
            raise InvocationError(f"`loopd {' '.join(args)}`: {exc.format_message()}") from exc
        except typer.TyperException as exc:
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            raise InvocationError(f"`loopd {' '.join(args)}`: {message}") from exc
        if not isinstance(command, typer.core.TyperGroup):
            return
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            return
        try:
            sub_name, sub, sub_args = command.resolve_command(ctx, rest)
        except typer.TyperException as exc:
            raise InvocationError(f"`loopd {' '.join(args)}`: {exc}") from exc
        if sub is None or sub_name is None:
            raise InvocationError(f"`loopd {' '.join(args)}`: no command {rest[0]!r}")
        command, name, remaining, parent = sub, sub_name, sub_args, ctx


def _missing_path(exc: Any) -> bool:
    """Whether ``exc`` only says that a path a command wants to exist does not exist on this machine."""
    return getattr(exc, "param", None) is not None and exc.format_message().rstrip(".").endswith("does not exist")


def every_command() -> Iterator[tuple[list[str], Any]]:
    """Every command of the CLI tree with its path (``[]`` is the top)."""
    top: Any = command_tree()
    stack: list[tuple[list[str], Any]] = [([], top)]
    while stack:
        path, command = stack.pop()
        yield path, command
        if isinstance(command, typer.core.TyperGroup):
            for sub_name, sub in command.commands.items():
                stack.append(([*path, sub_name], sub))
