"""A scripted stand-in for `claude -p --output-format stream-json --input-format stream-json
--permission-prompt-tool stdio [--resume ID]` (the real CLI is not on the machine).

It reads its prompt (a stream-json ``user`` line) from stdin and answers by the prompt's words:
``tool`` → a Bash tool_use, a ``can_use_tool`` control_request, and the outcome the answer allows;
``hang`` → writes its pid to ``hang.pid`` in its cwd, then sleeps; ``fail`` → an error result;
``weird`` → a session id that is not a plain token; ``showenv`` → names its secret-looking variables;
otherwise → text naming its session and whether it was resumed.
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
    for flag in ("-p", "--output-format", "--input-format", "--permission-prompt-tool", "--verbose"):
        assert flag in args, f"missing {flag}"
    resume = args[args.index("--resume") + 1] if "--resume" in args else None
    session = resume or f"claude-{uuid.uuid4().hex[:8]}"
    first = json.loads(sys.stdin.readline())
    assert first["type"] == "user"
    prompt = first["message"]["content"]
    if "showenv" in prompt:  # which secrets-looking variables it can see
        prompt = "env: " + ",".join(sorted(k for k in os.environ if "SECRET" in k or "API_KEY" in k))
    if "weird" in prompt:
        session = "--dangerous id"  # a session id that must never reach a command line
    say({"type": "system", "subtype": "init", "session_id": session, "tools": ["Bash"], "model": "fake"})
    if "hang" in prompt:
        with open("hang.pid", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(120)
    if "fail" in prompt:
        say({"type": "result", "subtype": "error_during_execution", "is_error": True, "session_id": session})
        return
    usage = {"input_tokens": 12, "output_tokens": 5, "cache_read_input_tokens": 3}
    if "tool" in prompt:
        call = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}
        say(
            {
                "type": "assistant",
                "session_id": session,
                "message": {"content": [{"type": "text", "text": "Let me look. "}, call]},
            }
        )
        say(
            {
                "type": "control_request",
                "request_id": "req-1",
                "request": {
                    "subtype": "can_use_tool",
                    "tool_name": "Bash",
                    "input": {"command": "ls"},
                    "tool_use_id": "toolu_1",
                },
            }
        )
        reply = json.loads(sys.stdin.readline())
        assert reply["type"] == "control_response" and reply["response"]["request_id"] == "req-1"
        answer = reply["response"]["response"]
        if answer["behavior"] == "allow":
            block = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}
            final = "Bash said a.txt"
        else:
            block = {"type": "tool_result", "tool_use_id": "toolu_1", "content": answer["message"], "is_error": True}
            final = f"Bash was denied: {answer['message']}"
        say({"type": "user", "session_id": session, "message": {"content": [block]}})
        say({"type": "assistant", "session_id": session, "message": {"content": [{"type": "text", "text": final}]}})
        say(
            {
                "type": "result",
                "subtype": "success",
                "is_error": False,
                "result": final,
                "session_id": session,
                "usage": usage,
                "total_cost_usd": 0.0042,
            }
        )
        return
    text = f"session {session} resumed={resume is not None}: {prompt}"
    say({"type": "assistant", "session_id": session, "message": {"content": [{"type": "text", "text": text}]}})
    say(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": text,
            "session_id": session,
            "usage": usage,
            "total_cost_usd": 0.0042,
        }
    )


if __name__ == "__main__":
    main()
