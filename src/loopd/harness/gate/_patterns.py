"""The grant pattern language shared by requirements, stored rules and policy files. Pure.

A pattern is text in which ``*`` matches any run of characters (possibly empty, ``/`` and spaces included) and
``\\`` makes the next character literal. Nothing else is special: ``?``, ``[``, ``;`` and friends are plain text.

A requirement's ``match`` is written in the same language. Usually it is literal (an escaped path or command);
a tree operation such as ``grep`` says ``src/*`` ("everything under src"). Two questions are asked of a rule:

- ``covers(rule, match)``: is everything the requirement may touch inside the rule? (used for allows)
- ``overlaps(rule, match)``: could the requirement touch anything the rule names? (used for denies)

So an allow must contain the whole requirement, while a deny only has to touch it: allow narrowly, deny broadly.
"""

from __future__ import annotations

from typing import Final

WILDCARD: Final = "*"
ESCAPE: Final = "\\"

# A token is a one-character literal, or None for the wildcard.
_Token = str | None


def escape(text: str) -> str:
    """The pattern that matches exactly ``text``."""
    return text.replace(ESCAPE, ESCAPE + ESCAPE).replace(WILDCARD, ESCAPE + WILDCARD)


def tokens(pattern: str) -> tuple[_Token, ...]:
    """Split a pattern into literal characters and wildcards (``None``). A trailing lone ``\\`` is literal."""
    out: list[_Token] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == ESCAPE and i + 1 < len(pattern):
            out.append(pattern[i + 1])
            i += 2
            continue
        out.append(None if char == WILDCARD else char)
        i += 1
    return tuple(out)


def is_literal(pattern: str) -> bool:
    """True when the pattern has no wildcard (it names exactly one string)."""
    return None not in tokens(pattern)


def unescape(pattern: str) -> str:
    """The text of a literal pattern (wildcards, if any, are rendered as ``*``)."""
    return "".join(WILDCARD if token is None else token for token in tokens(pattern))


def covers(rule: str, match: str, *, wildcard_excludes: frozenset[str] = frozenset()) -> bool:
    """Whether every string the ``match`` pattern names is also named by ``rule``.

    Sound, not complete: a wildcard in ``match`` is treated as an opaque symbol that only a wildcard of ``rule``
    can absorb. ``wildcard_excludes`` are characters a rule's wildcard may not absorb (for commands: shell
    metacharacters, so ``git status *`` never covers ``git status; rm -rf ~``); a wildcard in ``match`` is then
    never absorbed either, because it could stand for one of those characters.
    """
    r = tokens(rule)
    m = tokens(match)
    if None not in r:
        return r == m

    def absorbable(token: _Token) -> bool:
        if token is None:
            return not wildcard_excludes
        return token not in wildcard_excludes

    # below[j]: does r[i+1:] cover m[j:]? Filled from the end of the rule backwards.
    below = [False] * len(m) + [True]
    for i in range(len(r) - 1, -1, -1):
        row = [False] * (len(m) + 1)
        if r[i] is None:
            row[len(m)] = below[len(m)]
            for j in range(len(m) - 1, -1, -1):
                row[j] = below[j] or (absorbable(m[j]) and row[j + 1])
        else:
            for j in range(len(m) - 1, -1, -1):
                row[j] = m[j] is not None and m[j] == r[i] and below[j + 1]
        below = row
    return below[0]


def overlaps(a: str, b: str) -> bool:
    """Whether some string is named by both patterns (exact for this language)."""
    x = tokens(a)
    y = tokens(b)
    if None not in x:
        return covers(b, a)
    if None not in y:
        return covers(a, b)
    # below[j]: can x[i+1:] and y[j:] name a common string? Filled from the ends backwards.
    below = _tail_all_wildcards(y)
    for i in range(len(x) - 1, -1, -1):
        row = [False] * (len(y) + 1)
        row[len(y)] = x[i] is None and below[len(y)]
        for j in range(len(y) - 1, -1, -1):
            if x[i] is None:
                # x's wildcard is empty, or it swallows one literal of y.
                row[j] = below[j] or (y[j] is not None and row[j + 1])
            if not row[j] and y[j] is None:
                # y's wildcard is empty, or it swallows one literal of x.
                row[j] = row[j + 1] or (x[i] is not None and below[j])
            if not row[j] and x[i] is not None and y[j] is not None:
                row[j] = x[i] == y[j] and below[j + 1]
        below = row
    return below[0]


def _tail_all_wildcards(y: tuple[_Token, ...]) -> list[bool]:
    """For an exhausted left side: y[j:] can name the empty string only if it is all wildcards."""
    out = [False] * (len(y) + 1)
    out[len(y)] = True
    for j in range(len(y) - 1, -1, -1):
        out[j] = y[j] is None and out[j + 1]
    return out
