// A human reply names its outcome in the words of the question: a Confirm's own labels, not `accepted`/`declined`.
import { describe, expect, it } from "vitest";
import type { MessageBody } from "../api";
import { questionMessage } from "../cards/fixtures";
import { replyText } from "./reply";
import { fromBody } from "./store";

function reply(block: Record<string, unknown>): MessageBody {
  return {
    id: "r1",
    conversation_id: "c1",
    task_id: "t1",
    kind: "user",
    key: "me",
    reply_to_message_id: "q1",
    purpose: "human_reply",
    status: "completed",
    created_at: "2026-12-01T19:01:00Z",
    updated_at: "2026-12-01T19:01:00Z",
    revision: 1,
    content: { version: "1.1", biz: "loopd.human", meta: {}, blocks: [{ id: "reply", type: "human_reply", reply_to_message_id: "q1", ...block }] },
  };
}

const confirm = fromBody(
  questionMessage({ type: "confirm", title: "Continue the run?", confirm_label: "Continue", decline_label: "Finish here", status: "answered" }) as unknown as MessageBody,
  null,
);

describe("replyText", () => {
  it("names a Confirm's outcome with the question's own labels", () => {
    expect(replyText(fromBody(reply({ outcome: "success", value: "accepted" }), null), confirm)).toBe("You answered: Continue");
    expect(replyText(fromBody(reply({ outcome: "success", value: "declined" }), null), confirm)).toBe("You answered: Finish here");
  });

  it("shows an Ask's answer as given, and a dismissal", () => {
    const ask = fromBody(questionMessage({ type: "ask", choices: [{ value: "red", label: "Red" }] }) as unknown as MessageBody, null);
    expect(replyText(fromBody(reply({ outcome: "success", value: "accepted" }), null), ask)).toBe("You answered: accepted");
    expect(replyText(fromBody(reply({ outcome: "dismissed" }), null), confirm)).toBe("You dismissed the question.");
  });

  it("falls back to the stored value when the question is not loaded", () => {
    expect(replyText(fromBody(reply({ outcome: "success", value: "accepted" }), null), undefined)).toBe("You answered: accepted");
  });
});
