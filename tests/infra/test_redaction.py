"""Secret redaction: what counts as a secret, and a secret a stream split across parts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopd._infra.redaction import (
    _ANY_BUILTIN,
    REDACTED,
    RedactionPatternError,
    Redactor,
    _may_hold_builtin,
    is_secret_name,
)

KEY = "sk-proj-0123456789abcdefghij"


def test_keys_tokens_and_configured_patterns_are_removed() -> None:
    redactor = Redactor([r"ACME-\d+"], literals=["hunter2-long-password", "short"])
    text = (
        f"key {KEY}, Authorization: Bearer abc.def-ghi_123, password=opensesame1, badge ACME-42, hunter2-long-password"
    )

    clean = redactor.text(text)

    for secret in (KEY, "abc.def-ghi_123", "opensesame1", "ACME-42", "hunter2-long-password"):
        assert secret not in clean
    assert clean.count(REDACTED) == 5
    assert Redactor(literals=["short"]).text("a short word") == "a short word"  # too short to be a secret


def test_a_value_under_a_secret_named_key_is_replaced_whole() -> None:
    clean = Redactor().value({"api_key": "plain", "max_tokens": 5, "messages": [{"content": f"use {KEY}"}]})

    assert clean == {"api_key": REDACTED, "max_tokens": 5, "messages": [{"content": f"use {REDACTED}"}]}
    assert [is_secret_name(n) for n in ("x-api-key", "client_secret", "max_completion_tokens", "prompt")] == [
        True,
        True,
        False,
        False,
    ]


def test_a_bad_pattern_is_a_typed_error() -> None:
    with pytest.raises(RedactionPatternError, match="not a regular expression"):
        Redactor(["(unclosed"])


@given(st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=6), st.text(max_size=20))
def test_a_secret_split_across_stream_parts_never_survives(cuts: list[int], prefix: str) -> None:
    text = f"{prefix} my key is {KEY} and nothing else"
    points = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]

    clean = Redactor().fragments(pieces)

    assert len(clean) == len(pieces)
    joined = "".join(clean)
    assert KEY not in joined and KEY[:12] not in joined
    assert joined.endswith(f"my key is {REDACTED} and nothing else")


_FRAGMENTS = st.sampled_from(
    [
        "sk-", "abcdefghijklmnop1234", "AKIA", "ABCDEFGHIJKLMNOP", "ghp_", "xoxb-", "glpat-", "Bearer ", "basic ",
        "api_key", "API-KEY", "secret", "token", "password", "passwd", "=", ": ", '"', "'", " ", "\n", "x",
        "-----BEGIN ", "RSA PRIVATE KEY-----", "-----END ", "hello", "0123456789", "ſecret", "\u212aEY", "baſic ",
        "Basic\t", "BEARER ", "gho_", "ghs_", "gh", "xoxs-", "xox", "api-key", "APIKEY", "Tokens", "pass", "word",
        "sk", "-", "_", "right", "key points ", "s3cr3t", "\t", "ap\u0130_", "\u0131", "PASSWORD", "“", "é",
    ]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(_FRAGMENTS, max_size=12).map("".join))
def test_text_that_no_rule_matches_skips_the_substitutions_and_nothing_else_changes(text: str) -> None:
    # A configured pattern that never matches sends every string through every substitution: the reference.
    assert Redactor().text(text) == Redactor(["(?!)"]).text(text)


@settings(max_examples=1000, deadline=None)
@given(st.lists(_FRAGMENTS, max_size=16).map("".join))
def test_the_quick_check_never_passes_text_a_rule_matches(text: str) -> None:
    # `_may_hold_builtin` decides from cues (a lower-cased copy of ASCII text) whether the rules need to run at all:
    # it may say yes for nothing, never no for a secret.
    if _ANY_BUILTIN.search(text) is not None:
        assert _may_hold_builtin(text)


_ONE_OF_EACH_RULE = [
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEabc\n-----END RSA PRIVATE KEY-----",
    "sk-" + "a1" * 10,
    "AKIA" + "B2" * 8,
    *(f"gh{kind}_" + "c3" * 10 for kind in "pousr"),
    *(f"xox{kind}-" + "d4" * 5 for kind in "abprs"),
    "glpat-" + "e5" * 10,
    "Bearer abcdefgh12",
    "BASIC   abcdefgh12==",
    "API_KEY=abcdef12",
    "x-Api-Key: 'abcdef12'",
    'apikey"="abcdef12"',
    "Secret = abcdefgh",
    "PASSWORD:abcdefgh",
    "my_token\t=  abcdef12",
    "db-passwd='abcdefg'",
    "auth_token-v2=abcdefgh12",
    "ap\u0130_KEY=abcdef12",  # İ: case-insensitively an i
    "\u017fecret: abcdefgh",  # ſ: an s
    "ba\u017fic abcdefgh12",
    "api_\u212aey=abcdef12",  # the Kelvin sign: a k
    "pa\u017f\u017fword = \u0131\u0131\u0131\u0131\u0131\u0131",
]


@pytest.mark.parametrize("secret", _ONE_OF_EACH_RULE)
def test_the_quick_check_lets_every_rule_see_its_secrets(secret: str) -> None:
    for text in (secret, f"some text {secret} and more", f"{secret.upper()} ", f"{secret.lower()} "):
        if _ANY_BUILTIN.search(text) is not None:  # (upper/lower-casing may turn it into no secret at all)
            assert _may_hold_builtin(text), text
    assert Redactor().text(f"some text {secret} and more") != f"some text {secret} and more"


def test_long_text_that_only_mentions_keys_and_tokens_is_not_scanned_by_the_rules() -> None:
    # Real prompts say "key", "token", "basic" all the time; the cues look for what a secret needs around them.
    text = "The key points: tokens are counted per request. A basic idea, though right. " * 500
    assert not _may_hold_builtin(text)
    assert Redactor().text(text) is text
    assert _may_hold_builtin(text + " api_key=abcdef123456")
    assert Redactor().text(text + " api_key=abcdef123456").endswith(f"api_key={REDACTED}")
    quoted = "Try “list files” to see the key tools. " * 500  # not ASCII: the same cues, after folding
    assert not _may_hold_builtin(quoted)
    assert Redactor().text(quoted + "ap\u0130_KEY=abcdef12").endswith(f"ap\u0130_KEY={REDACTED}")
