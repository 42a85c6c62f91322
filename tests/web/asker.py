"""A test operator (`operator:asker`, "Asker") that asks the user an Ask card before it answers: the web UI's
browser tests answer that card in the page. Same shape as examples/operators/echo.py, through ``loopd.runtime`` only.

    python tests/web/asker.py --data-dir DIR

Each Task: an Ask with three choices and free text ("Which brother?"), then the answer ``You picked <value>.``
(or ``You dismissed the question.``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from loopd.runtime import Result, Runtime, Task, open_runtime

CHOICES = (("liu-bei", "Liu Bei"), ("guan-yu", "Guan Yu"), ("zhang-fei", "Zhang Fei"))


class Asker:
    """Reconciles Tasks addressed to ``operator:asker``: asks once (idempotent by effect key), polls, answers."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def reconcile(self, task: Task) -> Result | None:
        context = await self.rt.task.get(task.id)
        if context.response.status != "streaming":
            await self.rt.chat.complete(task.id)
            return None
        question = await self.rt.human.ask(
            task.id,
            "which-brother",
            title="Which brother?",
            prompt=f"You asked: {context.input.text}\n\nWhich of the three brothers should I introduce?",
            timeout=300,
            choices=CHOICES,
            allow_other=True,
        )
        state = await question.get()
        if not state.terminal:
            return Result(requeue_after=0.5)
        if state.status == "success":
            await self.rt.chat.answer(task.id, f"You picked {state.value}.")
        else:
            await self.rt.chat.answer(task.id, f"You {state.status} the question.")
        await self.rt.chat.complete(task.id)
        return None


async def main() -> None:
    parser = argparse.ArgumentParser(description="The asker test operator.")
    parser.add_argument("--data-dir", required=True, help="data directory of the `loopd up` to serve")
    args = parser.parse_args()
    async with open_runtime(None, data_dir=args.data_dir) as rt:
        await rt.register("asker", display_name="Asker", description="Asks which brother, then answers.")
        rt.task.watch("asker", Asker(rt), workers=2)
        await rt.run()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
