"""The code of docs/operators.md and of the README's "Writing an operator", run against a real loop-server.

A python block of docs/operators.md is preceded by a directive saying how it runs::

    <!-- operators-example: key=K class=C question="Q" expect="E" [reply=accepted] -->   C(rt) watches operator:K;
                                       asking Q gets an answer containing E (reply: the user's answer to a question)
    <!-- operators-example: program key=K question="Q" expect="E" -->                    main(data_dir) runs the
                                       operator (with the classes of the blocks above) until the answer came
    <!-- operators-example: top-level -->           top-level await, with DATA_DIR, SERVER_URL, ECHO_TOKEN, KUBECONFIG
    <!-- operators-example: definitions -->         classes used by the blocks below it (a program runs them)
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loopd.runtime import open_runtime, text_of
from loopd.server._composition import RunningServer
from tests.support.waiting import eventually

from .conftest import User

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "operators.md"
ECHO = ROOT / "examples" / "operators" / "echo.py"
_DIRECTIVE = re.compile(r"<!--\s*operators-example:\s*(.*?)\s*-->")


@dataclass(frozen=True)
class Example:
    line: int
    code: str
    options: dict[str, str]
    mode: str

    @property
    def id(self) -> str:
        return f"operators.md:{self.line}:{self.options.get('class', self.mode)}"


def python_blocks(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, code, directive) of every ```python block of ``path``."""
    lines = path.read_text().splitlines()
    found: list[tuple[int, str, str | None]] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```python":
            i += 1
            continue
        start, body = i, []
        i += 1
        while lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        match = _DIRECTIVE.search(lines[j]) if j >= 0 else None
        found.append((start + 1, "\n".join(body) + "\n", match.group(1) if match else None))
        i += 1
    return found


def examples() -> list[Example]:
    found = []
    for line, code, directive in python_blocks(GUIDE):
        words = shlex.split(directive or "")
        mode = words[0] if words and "=" not in words[0] else "class"
        options = dict(word.split("=", 1) for word in words if "=" in word)
        found.append(Example(line, code, options, mode))
    return found


def test_every_python_block_of_the_guide_says_how_it_runs() -> None:
    blocks = python_blocks(GUIDE)
    assert len(blocks) >= 6
    assert [line for line, _, directive in blocks if directive is None] == []


def test_the_readme_shows_the_echo_example_as_it_is() -> None:
    readme = python_blocks(ROOT / "README.md")
    assert any(code == ECHO.read_text() for _, code, _ in readme), "README's echo.py differs from the file"


async def _answer_questions(user: User, asked: dict[str, Any], value: str) -> None:
    """Answer the Task's pending questions as the user who asked."""
    conversation, task = asked["conversation_id"], asked["task_id"]

    async def question() -> str | None:
        page = (await user.http.get(f"/v1/conversations/{conversation}/messages")).json()["data"]
        pending = [m for m in page if m["purpose"] == "human_request" and m["task_id"] == task]
        return pending[0]["id"] if pending else None

    message_id = await eventually(question, timeout=30, what="the operator's question")
    reply = {"reply_to_message_id": message_id, "outcome": "success", "value": value}
    answered = await user.http.post(f"/v1/conversations/{conversation}/tasks/{task}/replies", json=reply)
    assert answered.status_code == 200, answered.text


async def _answered(user: User, asked: dict[str, Any]) -> dict[str, Any]:
    async def completed() -> dict[str, Any] | None:
        found = await user.message(asked["conversation_id"], asked["response"]["id"])
        return found if found["status"] != "streaming" else None

    return await eventually(completed, timeout=45, what="the answer")


@pytest.mark.parametrize("example", examples(), ids=lambda e: e.id)
async def test_the_guides_example_runs(example: Example, server: RunningServer, user: User, tmp_path: Path) -> None:
    namespace: dict[str, Any] = {"__name__": "operators_guide"}
    for earlier in examples():  # a program uses the classes defined above it
        if earlier.line < example.line and earlier.mode in ("class", "definitions"):
            # dont_inherit: the guide's code runs as written, without this file's `from __future__` imports
            exec(compile(earlier.code, f"{GUIDE}:{earlier.line}", "exec", dont_inherit=True), namespace)
    if example.mode == "definitions":
        exec(compile(example.code, f"{GUIDE}:{example.line}", "exec", dont_inherit=True), namespace)
        return
    if example.mode == "top-level":
        made = await user.http.post("/v1/tokens", json={"actor": "operator:echo"})
        namespace.update(
            DATA_DIR=str(server.data_dir),
            SERVER_URL=server.url,
            ECHO_TOKEN=made.json()["token"],
            KUBECONFIG=str(tmp_path / "unused.kubeconfig"),  # opened only by rt.run() with watches
        )
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        running = eval(compile(example.code, f"{GUIDE}:{example.line}", "exec", flags=flags), namespace)
        if inspect.isawaitable(running):
            await running
        return
    exec(compile(example.code, f"{GUIDE}:{example.line}", "exec"), namespace)
    key = example.options["key"]
    if example.mode == "program":
        runner = asyncio.create_task(namespace["main"](str(server.data_dir)))
        try:
            await eventually(lambda: _connected(user, key), timeout=30, what=f"operator:{key} to register")
            await _check(example, user, key)
        finally:
            runner.cancel()
            with pytest.raises(asyncio.CancelledError):
                await runner
        return
    async with open_runtime(data_dir=server.data_dir) as rt:
        await rt.register(key)
        rt.task.watch(key, namespace[example.options["class"]](rt), workers=2)
        runner = asyncio.create_task(rt.run())
        try:
            await _check(example, user, key)
        finally:
            rt.shutdown()
            await asyncio.wait_for(runner, 30)


async def _connected(user: User, key: str) -> bool:
    return bool((await user.http.get(f"/v1/actors/operator/{key}")).json()["connected"])


async def _check(example: Example, user: User, key: str) -> None:
    asked = await user.ask(example.options["question"], key=key)
    if "reply" in example.options:
        await _answer_questions(user, asked, example.options["reply"])
    answer = await _answered(user, asked)
    assert answer["status"] == "completed", answer
    assert example.options["expect"] in text_of(answer["content"]), answer["content"]
