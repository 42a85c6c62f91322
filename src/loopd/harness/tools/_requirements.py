"""What built-in tools ask the gate for: requirement kinds, matches and grant candidates.

Kinds: ``fs.read`` (read a file, list a directory, search a tree), ``fs.write`` (create or change a file),
``exec`` (run a shell command). The scope is the workspace root. Matches are in the gate's pattern language
(`loopd.harness.gate._patterns`): an escaped relative path (``src/a.py``), a directory listing (``src/``), a
whole tree (``src/*``, or ``*`` for the workspace), or an escaped command.

A tree search (glob, grep) needs the whole tree, so any deny rule reaching into it denies the search; search a
narrower path instead. Listing a directory (``src/``) reads names only and is not touched by ``src/secret/*``.

Candidates are what "Approve always" would store — *all* shown candidates are stored, so a tool offers only
candidates that are safe to keep together: reads offer the file and its directory's tree, writes only the
exact file, commands the exact command, plus ``<program> *`` for a few read-only programs (`READ_ONLY_PREFIXES`)
when that grant covers the command itself. The gate gives such a grant a narrow meaning: its wildcard stands
for confined arguments only (no option off an allow-list, no path leaving the workspace; see
`loopd.harness.gate.exec_grant_covers`), so ``git diff *`` never covers ``git diff --no-index ../x /dev/null``
and ``git diff --output=../x`` gets no "always" offer beyond the exact command.

A command is split at unquoted control operators (``;``, ``&&``, ``||``, ``|``, ``&``, newlines) and every
part becomes its own requirement, so ``git status && rm -rf x`` needs both parts approved and a stored deny on
either denies it. Text with unbalanced quotes stays one part. Patterns in allow rules never absorb shell
metacharacters, so a prefix grant cannot be stretched into a second command; this is best effort (``bash -c``,
``eval`` or ``env`` can hide a program) and the gate's prompt shows the full command.
"""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath
from typing import Final

from loopd.harness.gate import escape_pattern as escape
from loopd.harness.gate import exec_grant_covers
from loopd.harness.tools._protocol import GrantCandidate, Requirement

FS_READ: Final = "fs.read"
FS_WRITE: Final = "fs.write"
EXEC: Final = "exec"

# Programs (and git subcommands) whose "<prefix> *" grant is offered; anything else gets exact grants only.
# File readers (cat, head, grep…) are left out on purpose: `cat *` would also read ~/.ssh.
READ_ONLY_PREFIXES: Final = frozenset(
    {("ls",), ("pwd",), ("git", "status"), ("git", "log"), ("git", "diff"), ("git", "show")}
)
_METACHARACTERS: Final = frozenset(";&|<>()$`\n\r")


def _tree(relative: str) -> str:
    """The match for everything under a directory ("*" for the workspace root)."""
    return "*" if relative == "." else escape(relative) + "/*"


def _listing(relative: str) -> str:
    return "./" if relative == "." else escape(relative) + "/"


def read_file_requirement(scope: str, relative: str) -> Requirement:
    candidates = [GrantCandidate(kind=FS_READ, pattern=escape(relative), description=f"read {relative}")]
    parent = PurePosixPath(relative).parent.as_posix()
    if parent != ".":
        candidates.append(
            GrantCandidate(kind=FS_READ, pattern=_tree(parent), description=f"read anything under {parent}/")
        )
    return Requirement(
        kind=FS_READ,
        scope=scope,
        match=escape(relative),
        description=f"read {relative}",
        candidates=tuple(candidates),
    )


def write_file_requirement(scope: str, relative: str) -> Requirement:
    return Requirement(
        kind=FS_WRITE,
        scope=scope,
        match=escape(relative),
        description=f"write {relative}",
        candidates=(GrantCandidate(kind=FS_WRITE, pattern=escape(relative), description=f"write {relative}"),),
    )


def list_dir_requirement(scope: str, relative: str) -> Requirement:
    shown = "the workspace root" if relative == "." else f"{relative}/"
    candidates = [GrantCandidate(kind=FS_READ, pattern=_listing(relative), description=f"list {shown}")]
    if relative != ".":
        candidates.append(
            GrantCandidate(kind=FS_READ, pattern=_tree(relative), description=f"read anything under {relative}/")
        )
    return Requirement(
        kind=FS_READ, scope=scope, match=_listing(relative), description=f"list {shown}", candidates=tuple(candidates)
    )


def read_tree_requirement(scope: str, relative: str, *, verb: str) -> Requirement:
    shown = "the whole workspace" if relative == "." else f"everything under {relative}/"
    return Requirement(
        kind=FS_READ,
        scope=scope,
        match=_tree(relative),
        description=f"{verb} {shown}",
        candidates=(GrantCandidate(kind=FS_READ, pattern=_tree(relative), description=f"read {shown}"),),
    )


def split_command(command: str) -> tuple[str, ...]:
    """Split at unquoted control operators. Unbalanced quotes: the whole command is one part."""
    parts: list[str] = []
    buf: list[str] = []
    quote: str | None = None
    i = 0
    n = len(command)

    def flush() -> None:
        part = "".join(buf).strip()
        if part:
            parts.append(part)
        buf.clear()

    while i < n:
        c = command[i]
        if quote == "'":
            buf.append(c)
            if c == "'":
                quote = None
        elif quote == '"':
            buf.append(c)
            if c == "\\" and i + 1 < n:
                buf.append(command[i + 1])
                i += 1
            elif c == '"':
                quote = None
        elif c == "\\" and i + 1 < n:
            if command[i + 1] == "\n":  # line continuation
                buf.append(" ")
            else:
                buf.append(c + command[i + 1])
            i += 1
        elif c in "'\"":
            quote = c
            buf.append(c)
        elif c in ";\n\r":
            flush()
        elif c in "&|":
            prev = command[i - 1] if i > 0 else ""
            nxt = command[i + 1] if i + 1 < n else ""
            if c == "&" and (nxt == ">" or prev in "<>"):
                buf.append(c)  # a redirection such as &>file or 2>&1, not a separator
            else:
                flush()
                if nxt == c or (c == "|" and nxt == "&"):
                    i += 1
        else:
            buf.append(c)
        i += 1
    if quote is not None:
        whole = command.strip()
        return (whole,) if whole else ()
    flush()
    return tuple(parts)


def _read_only_prefix(part: str) -> tuple[str, ...] | None:
    if any(c in _METACHARACTERS for c in part):
        return None
    try:
        words = shlex.split(part)
    except ValueError:
        return None
    for size in (2, 1):
        prefix = tuple(words[:size])
        if len(prefix) == size and prefix in READ_ONLY_PREFIXES:
            return prefix
    return None


def exec_requirements(scope: str, command: str) -> tuple[Requirement, ...]:
    requirements: list[Requirement] = []
    for part in split_command(command):
        candidates = [GrantCandidate(kind=EXEC, pattern=escape(part), description=f"run `{part}`")]
        prefix = _read_only_prefix(part)
        if prefix is not None:
            shown = " ".join(prefix)
            pattern = escape(shown) + " *"
            if exec_grant_covers(pattern, part):
                candidates.append(
                    GrantCandidate(
                        kind=EXEC,
                        pattern=pattern,
                        description=f"run `{shown} …` (display options, paths inside the workspace)",
                    )
                )
        requirements.append(
            Requirement(
                kind=EXEC, scope=scope, match=escape(part), description=f"run `{part}`", candidates=tuple(candidates)
            )
        )
    return tuple(requirements)
