"""The demo model's rule seam: extra `DemoRule`s (via `DemoOptions.rules`, or the standard rig's settings) answer
before the built-in rules, on the current request only; a rule that returns None leaves the request to the next."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from loopd.harness.models import TOOL_RESULTS_HEADER, DemoOptions, DemoRule, ModelConfig, ModelRequest
from loopd.harness.models._scripted_server import IncomingRequest, demo_reply
from loopd.harness.standard import HarnessSettings, open_standard_rig
from loopd.harness.tools import Unconfined

from .helpers import ask, collect


def shout(text: str) -> str | None:
    return text.upper() if text.startswith("shout ") else None


def never(text: str) -> str | None:
    return None


def incoming(*messages: dict[str, object]) -> IncomingRequest:
    return IncomingRequest(model="demo", messages=messages)


def test_a_rule_answers_before_the_built_in_demo() -> None:
    rules: tuple[DemoRule, ...] = (never, shout)

    reply = demo_reply(incoming({"role": "user", "content": "shout list files"}), DemoOptions(rules=rules))

    assert (reply.text, reply.tool_calls) == ("SHOUT LIST FILES", ())


def test_a_request_no_rule_takes_gets_the_built_in_answer() -> None:
    reply = demo_reply(incoming({"role": "user", "content": "hello"}), DemoOptions(rules=(never, shout)))

    assert reply.text.startswith("You said: “hello”")


def test_a_rule_sees_the_current_request_only() -> None:
    prompt = "Conversation so far:\n[user alice] shout old\n\nCurrent request:\nshout new"

    reply = demo_reply(incoming({"role": "user", "content": prompt}), DemoOptions(rules=(shout,)))

    assert reply.text == "SHOUT NEW"


def test_a_tool_result_no_rule_takes_is_shown() -> None:
    messages: tuple[dict[str, object], ...] = (
        {"role": "user", "content": "shout x"},
        {"role": "tool", "content": "out", "name": "list_dir"},
    )

    reply = demo_reply(incoming(*messages), DemoOptions(rules=(never,)))

    assert "`list_dir` tool returned" in reply.text


def writer(text: str) -> str | Mapping[str, object] | None:
    """Writes notes.txt, then answers from what the tool said."""
    if not text.startswith("write notes"):
        return None
    if TOOL_RESULTS_HEADER in text:
        return "done: " + text.split(TOOL_RESULTS_HEADER + "\n", 1)[1]
    return {"tool": "write_file", "arguments": {"path": "notes.txt", "content": "hi"}, "text": "Writing."}


def test_a_rule_may_call_a_tool_the_request_offers() -> None:
    request = IncomingRequest(
        model="demo",
        messages=({"role": "user", "content": "write notes"},),
        tools=({"type": "function", "function": {"name": "write_file"}},),
    )

    reply = demo_reply(request, DemoOptions(rules=(writer,)))

    assert reply.text == "Writing."
    assert [(call.name, call.arguments) for call in reply.tool_calls] == [
        ("write_file", {"path": "notes.txt", "content": "hi"})
    ]


def test_a_tool_a_request_does_not_offer_is_not_called() -> None:
    reply = demo_reply(incoming({"role": "user", "content": "write notes"}), DemoOptions(rules=(writer,)))

    assert reply.tool_calls == ()
    assert "offers no such tool" in reply.text


def test_after_a_tool_result_the_rule_answers_from_the_results_of_this_turn() -> None:
    messages: tuple[dict[str, object], ...] = (
        {"role": "user", "content": "write notes please"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c0", "function": {"name": "list_dir"}}]},
        {"role": "tool", "tool_call_id": "c0", "content": "old result"},
        {"role": "user", "content": "write notes"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "write_file"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "wrote 2 bytes to notes.txt"},
    )

    reply = demo_reply(incoming(*messages), DemoOptions(rules=(writer,)))

    assert reply.text == "done: [write_file] wrote 2 bytes to notes.txt"


async def test_the_standard_rigs_settings_carry_rules_to_the_served_demo(tmp_path: Path) -> None:
    settings = HarnessSettings(
        workspace=tmp_path / "ws",
        data_dir=tmp_path / "data",
        model=ModelConfig(),
        sandbox=Unconfined(),
        demo_rules=(shout,),
    )
    async with open_standard_rig(settings) as rig:
        model = rig.loops[0].model
        request: ModelRequest = ask("shout through the rig")

        got = await collect(model.stream(request))

    assert got.text == "SHOUT THROUGH THE RIG"
