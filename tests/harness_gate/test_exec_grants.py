"""What an ``exec`` prefix grant (``git diff *``) may cover: confined arguments only, however the rule got stored."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopd.harness.gate import (
    AccessConfig,
    Rule,
    RuleEffect,
    Verdict,
    escape_pattern,
    evaluate,
    exec_grant_covers,
)
from loopd.harness.gate._commands import ARGUMENTS
from loopd.harness.tools._protocol import PreparedCall, Requirement

PREFIX_GRANTS = ["ls *", "pwd *", "git status *", "git log *", "git diff *", "git show *"]
"""Every prefix grant "Approve always" has ever offered (and older versions stored)."""


def bash(command: str) -> PreparedCall:
    requirement = Requirement(kind="exec", scope="/ws", match=escape_pattern(command), description=command)
    return PreparedCall(call_id="c1", tool="bash", arguments={"command": command}, requirements=(requirement,))


def verdict(command: str, *, stored: list[str] = PREFIX_GRANTS, configured: list[str] = ()) -> Verdict:  # type: ignore[assignment]
    rules = [Rule(kind="exec", pattern=p, effect=RuleEffect.ALLOW) for p in stored]
    access = AccessConfig(rules=tuple(Rule(kind="exec", pattern=p, effect=RuleEffect.ALLOW) for p in configured))
    return evaluate([bash(command)], access=access, stored=rules).verdict("c1")


ESCAPES = [
    # From the report: reads outside, writes anywhere.
    "git diff --no-index ../outside/secret /dev/null",
    "git log --output=../x",
    "git log --output=x",
    "git log --output ../x",
    "git show --output=/tmp/x HEAD",
    # --no-index needs no '..' to compare files git does not track; an implicit no-index needs a path outside.
    "git diff --no-index a b",
    "git diff ../outside/secret /dev/null",
    "git diff HEAD -- /etc/passwd",
    # Options that run programs or read files named in them.
    "git diff --ext-diff",
    "git diff --textconv HEAD",
    "git diff -O/etc/passwd",
    "git diff -O ../order",
    "git log --exec=sh",
    "git diff --git-dir=../other/.git",
    "git diff --work-tree=/",
    "git log -c core.pager=sh",
    "git log -C ..",
    "git status --upload-pack=sh",
    # Quoting, braces and globs do not hide an option or a path from the check.
    'git diff "--no-index" a b',
    "git diff '--output'=x",
    "git diff --out\\put=x",
    "git diff {--output=x,HEAD}",
    "git diff {..,src}/secret",
    "git diff *",
    "git diff [-]-output=x",
    "git log --format=%h --output=x",
    "git diff --stat=../x",
    # ls and pwd: names outside the workspace.
    "ls /etc",
    "ls ../",
    "ls ..",
    "ls src/../..",
    "ls ~/.ssh",
    "ls ~root",
    "ls a=~/x",
    "ls .*",
    "ls -d .?",
    "ls [.].",
    "ls {..,x}",
    "ls -la /",
    "ls --ignore=/x",
    "ls -I pattern /",
    "pwd /",
]

ALLOWED = [
    "git status",
    "ls",
    "git diff HEAD",
    "git diff --stat HEAD~1..HEAD",
    "git diff --cached -- src/a.py",
    "git diff --no-ext-diff --no-textconv main...topic",
    "git diff -U5 --word-diff=color",
    "git log --oneline -n 5",
    "git log -5 --format=%h%x09%s --author=alice",
    "git log --graph --decorate --all origin/main..HEAD",
    "git show HEAD:src/a.py",
    "git show stash@{0}",
    "git status -sb",
    "git status --porcelain=v2 -uno",
    "ls -la src",
    "ls *.py",
    "ls src/*/",
    "ls -- -odd-name",
    "pwd -P",
]


@pytest.mark.parametrize("command", ESCAPES)
def test_prefix_grants_do_not_cover_escapes(command: str) -> None:
    assert verdict(command) is Verdict.GATED


@pytest.mark.parametrize("command", ESCAPES)
def test_configured_prefix_rules_are_just_as_narrow(command: str) -> None:
    assert verdict(command, stored=[], configured=PREFIX_GRANTS) is Verdict.GATED


@pytest.mark.parametrize("command", ALLOWED)
def test_prefix_grants_still_cover_ordinary_use(command: str) -> None:
    assert verdict(command) is Verdict.ALLOW


def test_global_git_options_and_other_subcommands_are_never_covered() -> None:
    for command in (
        "git -c core.fsmonitor=sh status",
        "git -C .. status",
        "git --git-dir=/x status",
        "git --no-pager diff",
        "git config core.fsmonitor sh",
        "git status; sh",
        "git status $(sh)",
    ):
        assert verdict(command) is Verdict.GATED, command


@pytest.mark.parametrize("pattern", ["*", "git *", "g*", "git diff*", "* --stat", "ls*"])
def test_a_wildcard_never_stands_for_the_program_or_git_subcommand(pattern: str) -> None:
    for command in ("git diff HEAD", "git diff --stat", "git config core.pager sh", "ls src", "lsof"):
        assert not exec_grant_covers(pattern, command), (pattern, command)


def test_exact_rules_stay_exact() -> None:
    command = "git diff --no-index ../outside/secret /dev/null"
    assert verdict(command, stored=[escape_pattern(command)]) is Verdict.ALLOW
    assert verdict(command + " x", stored=[escape_pattern(command)]) is Verdict.GATED


def test_deny_rules_still_touch_everything_they_overlap() -> None:
    rules = [
        Rule(kind="exec", pattern="git diff *", effect=RuleEffect.DENY),
        Rule(kind="exec", pattern=escape_pattern("git diff --no-index a b"), effect=RuleEffect.ALLOW),
    ]
    decision = evaluate([bash("git diff --no-index a b")], access=AccessConfig(), stored=rules)
    assert decision.verdict("c1") is Verdict.DENY


def test_no_git_allow_list_names_an_option_that_leaves_the_workspace_or_runs_programs() -> None:
    dangerous = {
        "--no-index", "--output", "-o", "-O", "--ext-diff", "--textconv", "-c", "-C", "--exec", "--upload-pack",
        "--receive-pack", "--git-dir", "--work-tree", "--namespace", "--open-files-in-pager", "--paginate",
        "--orderfile", "--show-signature", "--submodule", "--config-env", "--remerge-diff", "-L",
    }  # fmt: skip
    for key, arguments in ARGUMENTS.items():
        if key[0] == "git":
            assert not (arguments.flags | arguments.valued) & dangerous, key
            assert not {"c", "C", "O", "o", "L"} & arguments.bundled, key


# -- properties -------------------------------------------------------------------------------------------------

SAFE_WORD = st.sampled_from(["HEAD", "src/a.py", "-s", "--stat", "--oneline", "-n", "5", "main..topic", "x y"])
COMPONENT = st.sampled_from(["..", ".", "a", "src", "~", "~root", "*", ".*", "", "{a,..}", "-", "=", "b=c"])
WORD = st.lists(COMPONENT, min_size=1, max_size=4).map("/".join)
QUOTE = st.sampled_from(["{}", "'{}'", '"{}"', "{}''", '""{}'])


def _leaves_workspace(word: str) -> bool:
    texts = [word, word.partition("=")[2]]
    return any(t.startswith(("/", "~")) or ".." in t.split("/") for t in texts)


@settings(derandomize=True, deadline=None, max_examples=400)
@given(
    grant=st.sampled_from([*PREFIX_GRANTS, "make *", "npm run test *"]),
    words=st.lists(st.one_of(SAFE_WORD, WORD), min_size=1, max_size=4),
    quotes=st.lists(QUOTE, min_size=4, max_size=4),
)
def test_a_covered_command_never_has_an_argument_leaving_the_workspace(
    grant: str, words: list[str], quotes: list[str]
) -> None:
    head = grant.removesuffix("*")
    command = head + " ".join(q.format(shlex.quote(w) if " " in w else w) for q, w in zip(quotes, words, strict=False))
    if exec_grant_covers(grant, command):
        arguments = shlex.split(command)[len(shlex.split(head)) :]
        assert not any(_leaves_workspace(a) for a in arguments), command


DANGEROUS_OPTION = st.sampled_from(
    ["--no-index", "--output=x", "--output", "-O/etc/passwd", "--ext-diff", "--textconv", "-c", "-C", "--exec=sh",
     "--upload-pack=sh", "--git-dir=.", "--work-tree=.", "-Ox"]
)  # fmt: skip


@settings(derandomize=True, deadline=None, max_examples=300)
@given(
    grant=st.sampled_from([*PREFIX_GRANTS, "git *", "git diff --stat *"]),
    before=st.lists(SAFE_WORD, max_size=3),
    option=DANGEROUS_OPTION,
    quote=QUOTE,
    after=st.lists(SAFE_WORD, max_size=3),
)
def test_no_prefix_grant_covers_a_dangerous_option(
    grant: str, before: list[str], option: str, quote: str, after: list[str]
) -> None:
    head = grant.removesuffix("*")
    words = [*before, quote.format(option), *after]
    command = head + " ".join(shlex.quote(w) if " " in w else w for w in words)
    assert not exec_grant_covers(grant, command), command
