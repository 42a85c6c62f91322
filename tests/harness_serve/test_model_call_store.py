"""The served sessions' model-call records kept in a SQLite file (`loopd harness serve`'s data directory): read back
whole after the app that wrote them is gone, redacted before they were written, bounded per session (the oldest kept
record rewritten whole when its predecessor is dropped) and in sessions; indexes go on where they stopped."""

from __future__ import annotations

from pathlib import Path

from loopd._infra.clock import VirtualClock
from loopd._infra.redaction import Redactor
from loopd.harness.core import Message, Usage, user_message
from loopd.harness.models import ModelAttemptRecord, ModelCallRecord, ModelRequest
from loopd.harness.serve._model_calls import (
    MAX_RECORDS,
    MAX_SESSIONS,
    MODEL_CALLS_FILE,
    ServedModelCalls,
    SqliteModelCallStore,
)

SECRET = "sk-storetest0123456789abcdefghij"


def _call(messages: tuple[Message, ...], text: str = "ok") -> ModelCallRecord:
    attempt = ModelAttemptRecord(
        model="gpt-test", started_at=1.0, ended_at=2.0, text=text, usage=Usage(input_tokens=3, output_tokens=1)
    )
    return ModelCallRecord(ModelRequest(model="gpt-test", messages=messages, system="Be brief."), (attempt,))


def _served(path: Path) -> ServedModelCalls:
    return ServedModelCalls(VirtualClock(), Redactor(literals=[SECRET]), SqliteModelCallStore(path))


def _whole(item: dict[str, object], previous: list[object]) -> list[object]:
    request = item["request"]
    assert isinstance(request, dict)
    return previous[: request["extends"]] + list(request["messages"])


async def test_records_outlive_the_app_and_stay_whole_past_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "data" / MODEL_CALLS_FILE
    served = _served(path)
    log = served.log("s1")
    history: tuple[Message, ...] = ()
    total = MAX_RECORDS + 20
    for n in range(1, total + 1):
        history = (*history, user_message(f"turn {n} {SECRET if n == 1 else ''}"))
        log.record(_call(history, text=f"reply {n}"))
        if n % 50 == 0:
            await served.flush()  # several writes: the bound applies across them
    await served.aclose()
    assert path.stat().st_mode & 0o777 == 0o600
    assert SECRET.encode() not in path.read_bytes()  # redacted before it was written

    reopened = _served(path)  # another process on the same data directory
    page = await reopened.page("s1", 0, 100)
    first = total - MAX_RECORDS + 1
    assert [item["index"] for item in page["items"]] == list(range(first, first + 100)) and page["has_more"]
    messages: list[object] = []
    for item in page["items"]:
        messages = _whole(item, messages)
        assert len(messages) == item["index"]  # every message of that call, the dropped calls' ones included
    assert page["items"][0]["request"]["extends"] == 0
    assert page["items"][1]["request"]["extends"] == first
    assert page["items"][0]["attempts"][0]["text"] == f"reply {first}"
    assert isinstance(messages[0], dict) and messages[0]["content"] == "turn 1 [REDACTED]"

    reopened.log("s1").record(_call((user_message("after the restart"),)))
    tail = await reopened.page("s1", total - 1, 100)
    assert [item["index"] for item in tail["items"]] == [total, total + 1]
    assert [m["content"] for m in tail["items"][1]["request"]["messages"]] == ["after the restart"]
    await reopened.aclose()


async def test_sessions_are_bounded_the_least_recently_written_first(tmp_path: Path) -> None:
    served = _served(tmp_path / MODEL_CALLS_FILE)
    for n in range(MAX_SESSIONS + 1):
        served.log(f"s{n}").record(_call((user_message("hi"),)))
    await served.flush()
    assert (await served.page("s0", 0, 10))["items"] == []
    assert [item["index"] for item in (await served.page("s1", 0, 10))["items"]] == [1]
    await served.aclose()
