"""The grant pattern language: escape, covers (for allows) and overlaps (for denies)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopd.harness.gate._evaluate import SHELL_METACHARACTERS
from loopd.harness.gate._patterns import covers, escape, is_literal, overlaps, tokens, unescape

ALPHABET = st.sampled_from(list("ab/;*\\ "))
TEXT = st.text(ALPHABET, max_size=8)
PATTERN = st.text(st.sampled_from(list("ab/;* ")), max_size=6)


def to_regex(pattern: str, excludes: frozenset[str] = frozenset()) -> re.Pattern[str]:
    star = f"[^{re.escape(''.join(sorted(excludes)))}]*" if excludes else ".*"
    return re.compile("".join(star if t is None else re.escape(t) for t in tokens(pattern)), re.DOTALL)


def test_escape_and_literals() -> None:
    assert escape(r"a*b\c") == r"a\*b\\c"
    assert is_literal(escape("a*b"))
    assert not is_literal("a*")
    assert unescape(escape(r"x*y\z")) == r"x*y\z"
    assert tokens("a\\") == ("a", "\\")


@pytest.mark.parametrize(
    ("rule", "match", "expected"),
    [
        ("src/*", "src/a.py", True),
        ("src/*", "src/pkg/a.py", True),
        ("src/*", "src", False),
        ("src/*", "src/*", True),
        ("src/a.py", "src/*", False),
        ("*", "*", True),
        ("*.py", "src/*", False),
        (r"a\*", "a*", False),
        (r"a\*", r"a\*", True),
    ],
)
def test_covers(rule: str, match: str, expected: bool) -> None:
    assert covers(rule, match) is expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("secret/*", "*", True),
        ("secret/*", "src/*", False),
        ("secret/*", "secret/x/*", True),
        ("*.env", "src/*", True),
        ("a*c", "*b*", True),
        ("a*c", "b*", False),
        ("*x", "*y", False),
        ("src/a.py", "src/a.py", True),
    ],
)
def test_overlaps(a: str, b: str, expected: bool) -> None:
    assert overlaps(a, b) is expected
    assert overlaps(b, a) is expected


def test_exec_wildcards_stop_at_metacharacters() -> None:
    assert covers("git status *", "git status -s", wildcard_excludes=SHELL_METACHARACTERS)
    for tail in ("; rm -rf ~", "&& x", "| sh", "$(id)", "`id`", "> f", "\nrm"):
        assert not covers("git status *", "git status " + tail, wildcard_excludes=SHELL_METACHARACTERS), tail


def test_long_commands_are_fine() -> None:
    command = "echo " + "x" * 50_000
    assert covers("echo *", escape(command))
    assert overlaps(escape(command), escape(command))
    assert not overlaps(escape(command), escape(command + "y"))


@settings(derandomize=True, deadline=None, max_examples=300)
@given(pattern=PATTERN, text=TEXT)
def test_covers_a_literal_agrees_with_a_regex(pattern: str, text: str) -> None:
    literal = escape(text)
    assert covers(pattern, literal) is bool(to_regex(pattern).fullmatch(text))
    excludes = frozenset(";")
    assert covers(pattern, literal, wildcard_excludes=excludes) is bool(to_regex(pattern, excludes).fullmatch(text))


@settings(derandomize=True, deadline=None, max_examples=300)
@given(a=PATTERN, b=PATTERN, witness=TEXT)
def test_overlaps_is_symmetric_and_sound(a: str, b: str, witness: str) -> None:
    assert overlaps(a, b) is overlaps(b, a)
    if to_regex(a).fullmatch(witness) and to_regex(b).fullmatch(witness):
        assert overlaps(a, b)


@settings(derandomize=True, deadline=None, max_examples=300)
@given(rule=PATTERN, match=PATTERN, expansion=TEXT)
def test_covers_is_sound_for_wildcard_matches(rule: str, match: str, expansion: str) -> None:
    if covers(rule, match):
        # Any expansion of the match's wildcards is named by the rule.
        concrete = "".join(expansion if t is None else t for t in tokens(match))
        assert to_regex(rule).fullmatch(concrete)
        assert overlaps(rule, match)
