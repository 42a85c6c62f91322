"""The demo model's rule seam: extra `DemoRule`s (via `DemoOptions.rules`, or the standard rig's settings) answer
before the built-in rules, on the current request only; a rule that returns None leaves the request to the next."""

from __future__ import annotations

from pathlib import Path

from loopd.harness.models import DemoOptions, DemoRule, ModelConfig, ModelRequest
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


def test_a_tool_result_is_shown_whatever_the_rules() -> None:
    messages: tuple[dict[str, object], ...] = (
        {"role": "user", "content": "shout x"},
        {"role": "tool", "content": "out", "name": "list_dir"},
    )

    reply = demo_reply(incoming(*messages), DemoOptions(rules=(shout,)))

    assert "`list_dir` tool returned" in reply.text


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
