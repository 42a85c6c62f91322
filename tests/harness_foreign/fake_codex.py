"""A scripted stand-in for `codex exec --json [resume ID] -` (prompt on stdin; the real CLI is not on the machine).

By the prompt's words: ``tool`` → a command_execution item; ``hang`` → writes its pid to ``hang.pid`` and
sleeps; ``fail`` → turn.failed; ``crash`` → exits (code 3) mid-turn; otherwise an agent_message naming its
thread and whether it was resumed. Its usage is 20 input tokens (8 of them cached when the prompt says ``cached``) and
7 output tokens, and no cost (codex reports none). Global options before ``exec`` (``-m MODEL``, ``-c KEY=VALUE``)
are accepted and ignored, as the real CLI takes them.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid


def say(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    args = sys.argv[1:]
    while args and args[0] in ("-m", "--model", "-c", "--config", "-p", "--profile"):
        args = args[2:]
    assert args[:2] == ["exec", "--json"], args
    rest = args[2:]
    resume = None
    if rest and rest[0] == "resume":
        resume, rest = rest[1], rest[2:]
    assert rest[-1] == "-", "the prompt comes on stdin"
    prompt = sys.stdin.read()
    thread = resume or f"codex-{uuid.uuid4().hex[:8]}"
    say({"type": "thread.started", "thread_id": thread})
    say({"type": "turn.started"})
    if "hang" in prompt:
        with open("hang.pid", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(120)
    if "crash" in prompt:
        sys.stderr.write("fake codex: out of cheese\n")
        sys.exit(3)
    if "fail" in prompt:
        say({"type": "turn.failed", "error": {"message": "quota exceeded"}})
        return
    if "tool" in prompt:
        item = {"id": "item_0", "type": "command_execution", "command": "ls", "status": "in_progress"}
        say({"type": "item.started", "item": item})
        say(
            {
                "type": "item.completed",
                "item": {**item, "status": "completed", "exit_code": 0, "aggregated_output": "a.txt\n"},
            }
        )
    text = f"thread {thread} resumed={resume is not None}: {prompt}"
    say({"type": "item.completed", "item": {"id": "item_1", "type": "agent_message", "text": text}})
    cached = 8 if "cached" in prompt else 0
    say({"type": "turn.completed", "usage": {"input_tokens": 20, "cached_input_tokens": cached, "output_tokens": 7}})


if __name__ == "__main__":
    main()
