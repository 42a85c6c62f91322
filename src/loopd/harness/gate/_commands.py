"""What the wildcard of an ``exec`` allow rule may stand for. Pure.

A rule such as ``git diff *`` (a *prefix grant*, stored by "Approve always" or written in a policy) does not
stand for any text after ``git diff``. It covers a command only when all of these hold:

1. The rule's text covers the command and its wildcard absorbs no shell metacharacter (`SHELL_METACHARACTERS`),
   so the grant cannot be stretched into a second command, a redirection or a substitution.
2. The words before the wildcard are whole words that name the program — for git the program *and* the
   subcommand (``git *`` covers nothing) — and the command starts with exactly those words.
3. Every later word is a *confined argument*:

   - an option (``-x``, ``--name``, ``--name=value``) only if the program's allow-list names it (`ARGUMENTS`);
     programs without a list accept no options through a wildcard. Options that read or write files outside
     the workspace or run programs (``--no-index``, ``--output``, ``-O``, ``--ext-diff``, ``--textconv``,
     ``-c``, ``-C``, ``--git-dir``, ``--exec``, ``--upload-pack`` …) are on no list;
   - not a path that can leave the workspace, in the word or in an option's ``=value``: absolute (``/…``),
     starting with ``~`` (also after ``=`` or ``:``), with a ``..`` component, a brace expansion
     (``{a,b}``, ``{1..3}``), or a glob component that could match ``.`` or ``..`` (``.*``, ``[.]*``);
   - for programs where an option can do harm (git), not starting with a glob character, which the shell
     could expand to a file named like an option.

Words are split like the shell splits them (quotes removed), so quoting an option does not hide it. The
check is applied when a rule is *matched*, not when it is stored: a ``git diff *`` stored by an older version
gets the same narrow meaning. Literal (wildcard-free) rules are exact and are not narrowed. Deny rules are not
narrowed either: a deny only has to touch a command.

The check reads text only. It cannot see the filesystem, so ``ls docs/`` lists the target of a symlink
``docs`` that already points outside; that is left to the OS sandbox bash runs in.
"""

from __future__ import annotations

import shlex
from typing import Final, NamedTuple

from loopd.harness.gate import _patterns

SHELL_METACHARACTERS: Final = frozenset(";&|<>()$`\n\r")
"""Characters an allow rule's wildcard never absorbs in an ``exec`` requirement."""

_GLOB_CHARACTERS: Final = frozenset("*?[")


class Arguments(NamedTuple):
    """The options a prefix grant's wildcard may absorb for one program (or git subcommand)."""

    flags: frozenset[str] = frozenset({"--"})
    """Exact option words."""
    valued: frozenset[str] = frozenset()
    """Options written ``--name=value``; the value must be a confined path too."""
    numeric: frozenset[str] = frozenset()
    """Short options followed by digits (``-U`` for ``-U5``; ``-`` for ``-5``)."""
    bundled: frozenset[str] = frozenset()
    """Short option letters that may be combined in one word (``-la``)."""
    leading_globs: bool = False
    """Whether a word may start with a glob character (only where no option can do harm)."""
    double_dash_ends_options: bool = True
    """Whether the program reads every word after ``--`` as an operand (a path), never as an option."""


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_GIT_DIFF_FLAGS: Final = _words(
    """
    -- -p -u --patch -s --no-patch --raw --patch-with-raw --patch-with-stat --stat --numstat --shortstat
    --compact-summary --summary --name-only --name-status --dirstat --cumulative --check --full-index --binary
    --no-renames --find-renames -M --find-copies --find-copies-harder --irreversible-delete -D --text -a
    --ignore-cr-at-eol --ignore-space-at-eol --ignore-space-change -b --ignore-all-space -w --ignore-blank-lines
    --minimal --patience --histogram --color --no-color --color-words --word-diff --color-moved --no-color-moved
    --no-ext-diff --no-textconv --quiet --exit-code --abbrev --no-abbrev -R --relative --no-relative --no-prefix
    --default-prefix --function-context -W --indent-heuristic --no-indent-heuristic --ignore-submodules -z
    """
)
_GIT_DIFF_VALUED: Final = _words(
    """
    --stat --dirstat --unified --color --word-diff --word-diff-regex --color-words --diff-algorithm --abbrev
    --relative --find-renames --find-copies --ignore-submodules --color-moved --inter-hunk-context
    --src-prefix --dst-prefix --line-prefix --diff-filter --stat-width --stat-name-width --stat-count
    """
)
_GIT_LOG_FLAGS: Final = _words(
    """
    --oneline --graph --decorate --no-decorate --pretty --abbrev-commit --no-abbrev-commit --relative-date
    --all --branches --tags --remotes --reverse --first-parent --merges --no-merges --follow -n -i
    --regexp-ignore-case --all-match --invert-grep -E -F --fixed-strings --extended-regexp --source --no-walk
    --topo-order --date-order --author-date-order --simplify-by-decoration --boundary --left-right --cherry-pick
    --cherry --full-history --ancestry-path --notes --no-notes --mailmap --no-mailmap --use-mailmap -m --cc
    --children --parents --log-size --expand-tabs --no-expand-tabs
    """
)
_GIT_LOG_VALUED: Final = _words(
    """
    --decorate --pretty --format --date --max-count --skip --since --until --after --before --author --committer
    --grep --diff-merges --expand-tabs
    """
)

ARGUMENTS: Final[dict[tuple[str, ...], Arguments]] = {
    ("ls",): Arguments(
        flags=_words(
            """
            -- --all --almost-all --author --classify --color --directory --dired --escape --file-type --full-time
            --group-directories-first --hide-control-chars --human-readable --inode --literal --no-group
            --numeric-uid-gid --recursive --reverse --show-control-chars --si --size --zero
            """
        ),
        valued=_words(
            "--block-size --color --format --hide --ignore --indicator-style --quoting-style --sort --time "
            "--time-style --width --tabsize"
        ),
        bundled=frozenset("1aAbBcCdfFghiklLmnNopqQrRsStuUvxXZ"),
        leading_globs=True,
    ),
    ("pwd",): Arguments(flags=_words("-- -L -P")),
    ("git", "status"): Arguments(
        flags=_words(
            """
            -- -s --short -b --branch --show-stash --porcelain --long -v --verbose -u -uno -unormal -uall
            --untracked-files --ignored --ignore-submodules -z --column --no-column --ahead-behind
            --no-ahead-behind --renames --no-renames --find-renames
            """
        ),
        valued=_words("--porcelain --untracked-files --ignored --ignore-submodules --column --find-renames"),
        bundled=frozenset("sbvz"),
    ),
    ("git", "diff"): Arguments(
        flags=_GIT_DIFF_FLAGS | _words("--cached --staged --merge-base"),
        valued=_GIT_DIFF_VALUED,
        numeric=_words("-U -M"),
    ),
    ("git", "log"): Arguments(
        flags=_GIT_DIFF_FLAGS | _GIT_LOG_FLAGS,
        valued=_GIT_DIFF_VALUED | _GIT_LOG_VALUED,
        numeric=_words("- -n -U -M"),
    ),
    ("git", "show"): Arguments(
        flags=_GIT_DIFF_FLAGS | _GIT_LOG_FLAGS,
        valued=_GIT_DIFF_VALUED | _GIT_LOG_VALUED,
        numeric=_words("- -n -U -M"),
    ),
}
"""Options a prefix grant may absorb, per program (or git subcommand). Every option here only changes what is
shown; none names a file to read or write or a program to run."""

_NO_OPTIONS: Final = Arguments(flags=frozenset(), double_dash_ends_options=False)
_SUBCOMMAND_PROGRAMS: Final = frozenset({"git"})


def covers_command(pattern: str, match: str) -> bool:
    """Whether an ``exec`` allow rule's ``pattern`` covers the requirement ``match`` (both in the pattern
    language). Literal patterns are exact; a wildcard stands for confined arguments only (module docstring),
    possibly none: ``git status *`` covers ``git status``."""
    if _patterns.is_literal(pattern):
        return _patterns.covers(pattern, match)
    if not any(
        _patterns.covers(pattern, text, wildcard_excludes=SHELL_METACHARACTERS) for text in (match, match + " ")
    ):
        return False
    if not _patterns.is_literal(match):
        return False
    return _confined(pattern, _patterns.unescape(match))


def grant_covers(pattern: str, command: str) -> bool:
    """Whether an ``exec`` allow rule with ``pattern`` covers the command text ``command``."""
    return covers_command(pattern, _patterns.escape(command))


def _confined(pattern: str, command: str) -> bool:
    head_tokens: list[str] = []
    for token in _patterns.tokens(pattern):
        if token is None:
            break
        head_tokens.append(token)
    head_text = "".join(head_tokens)
    head = _split(head_text)
    words = _split(command)
    if head is None or words is None:
        return False
    if head and not head_text[-1:].isspace():
        head = head[:-1]  # the wildcard continues the last word: that word is an argument like the rest
    if not head or words[: len(head)] != head:
        return False
    program = head[0]
    if program in _SUBCOMMAND_PROGRAMS:
        if len(head) < 2 or head[1].startswith("-"):
            return False  # the wildcard would absorb the subcommand or global options
        key: tuple[str, ...] = (program, head[1])
    else:
        key = (program,)
    spec = ARGUMENTS.get(key, _NO_OPTIONS)
    operands = False
    for word in words[len(head) :]:
        if not confined_argument(word, spec, operand=operands):
            return False
        operands = operands or (word == "--" and spec.double_dash_ends_options)
    return True


def confined_argument(word: str, spec: Arguments = _NO_OPTIONS, *, operand: bool = False) -> bool:
    """Whether a prefix grant's wildcard may absorb ``word`` (shell quoting already removed); an ``operand``
    (after ``--``) is a path whatever it starts with."""
    if word.startswith("-") and word != "-" and not operand:
        name, equals, value = word.partition("=")
        if word in spec.flags:
            return True
        if equals and name in spec.valued:
            return _confined_path(value, leading_globs=False)
        return _short_option_allowed(word, spec)
    if not spec.leading_globs and word[:1] in _GLOB_CHARACTERS:
        return False
    _, equals, value = word.partition("=")
    return _confined_path(word, leading_globs=spec.leading_globs) and (
        not equals or _confined_path(value, leading_globs=spec.leading_globs)
    )


def _short_option_allowed(word: str, spec: Arguments) -> bool:
    if word.startswith("--"):
        return False
    for prefix in spec.numeric:
        digits = word[len(prefix) :]
        if word.startswith(prefix) and digits.isascii() and digits.isdigit():
            return True
    letters = word[1:]
    return bool(letters) and all(letter in spec.bundled for letter in letters)


def _confined_path(text: str, *, leading_globs: bool) -> bool:
    """False for text that could name something outside the workspace once the shell has expanded it."""
    if text.startswith(("/", "~")) or "=~" in text or ":~" in text:
        return False
    if "{" in text and ("," in text or ".." in text):
        return False  # brace expansion can assemble "..", "/" or an option
    if not leading_globs and text[:1] in _GLOB_CHARACTERS:
        return False
    for component in text.split("/"):
        if component == "..":
            return False
        if component.startswith((".", "[")) and any(c in _GLOB_CHARACTERS for c in component):
            return False  # ".*" or "[.]." can match ".."
    return True


def _split(text: str) -> list[str] | None:
    try:
        return shlex.split(text)
    except ValueError:
        return None
