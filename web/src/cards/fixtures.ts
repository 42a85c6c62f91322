// Server-shaped messages for the card tests (shapes of question_block and the engine's gate ask block).
import type { MessageBody } from "../detail/http";

let revision = 0;

export function questionMessage(block: Record<string, unknown>, over: Partial<MessageBody> = {}): MessageBody {
  revision += 1;
  return {
    id: "q1",
    conversation_id: "c1",
    task_id: "t1",
    kind: "operator",
    key: "router",
    reply_to_message_id: null,
    purpose: "human_request",
    status: "streaming",
    revision,
    content: {
      version: "1.1",
      biz: "loopd.human",
      meta: {},
      blocks: [
        {
          id: "question",
          title: "Pick a colour",
          prompt: "Which colour should the chart use?",
          status: "pending",
          effect_key: "ask/1",
          timeout_seconds: 600,
          due_at: "2026-12-01T20:00:00Z",
          ...block,
        },
      ],
    },
    created_at: "2026-12-01T19:00:00Z",
    updated_at: "2026-12-01T19:00:00Z",
    ...over,
  };
}

export const CHOICES = [
  { value: "red", label: "Red" },
  { value: "blue", label: "Blue", description: "The calm one" },
];

export function gateMessage(block: Record<string, unknown> = {}): MessageBody {
  revision += 1;
  return {
    id: "h1",
    conversation_id: "w1",
    task_id: "t1",
    kind: "harness",
    key: "assistant",
    reply_to_message_id: null,
    purpose: "output",
    status: "streaming",
    revision,
    content: {
      version: "1.1",
      biz: "chat",
      meta: { title: "work/0", effect_key: "work/0" },
      blocks: [
        { id: "answer", type: "text", content: "Working…" },
        {
          id: "gate/g-1",
          type: "ask",
          call_id: "call-1",
          title: "Permission needed",
          prompt: "The harness asks for permission:\n- run `rm -rf build`",
          choices: [
            { value: "approve", label: "Approve" },
            { value: "always", label: "Always allow" },
            { value: "deny", label: "Deny" },
          ],
          status: "pending",
          ...block,
        },
      ],
    },
    created_at: "2026-12-01T19:00:00Z",
    updated_at: "2026-12-01T19:00:01Z",
  };
}
