"""Echo: the smallest loopd operator — it answers every Task with the text it was asked.

    python examples/operators/echo.py --server URL --data-dir DIR  # or --token (loopd token create operator:echo)
    loopd chat --to operator:echo "hi"                             # prints: hi

It uses only ``loopd.runtime``: the Task API over HTTP, and Tasks through the Kubernetes API (the embedded one of
the data directory, or --kubeconfig).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from loopd.runtime import Result, Runtime, Task, open_runtime


class Echo:
    """Reconciles Tasks addressed to ``operator:echo``; safe to run again for the same Task (idempotent)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    async def reconcile(self, task: Task) -> Result | None:
        context = await self.rt.task.get(task.id)  # before the question commits: TaskNotReady, requeued shortly
        if context.response.status == "streaming":  # not answered yet
            await self.rt.chat.answer(task.id, context.input.text)
        await self.rt.chat.complete(task.id)  # idempotent; the Task is deleted
        return None


async def main() -> None:
    parser = argparse.ArgumentParser(description="The echo operator: answers every question with itself.")
    parser.add_argument("--server", help="loop-server URL (default: the one recorded in --data-dir)")
    parser.add_argument("--token", help="an operator:echo token (default: the admin token of --data-dir)")
    parser.add_argument("--data-dir", help="data directory of the `loopd up` to serve")
    parser.add_argument("--kubeconfig", help="Kubernetes API for Tasks (default: the data directory's embedded one)")
    args = parser.parse_args()
    async with open_runtime(args.server, token=args.token, data_dir=args.data_dir, kubeconfig=args.kubeconfig) as rt:
        await rt.register("echo", display_name="Echo", description="Answers with the question.")
        rt.task.watch("echo", Echo(rt), workers=4)
        await rt.run()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
