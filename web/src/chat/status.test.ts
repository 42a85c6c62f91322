// @vitest-environment node
import { describe, expect, it } from "vitest";
import type { MessageBody } from "../api";
import { FrameBatcher, type Scheduler } from "./batch";
import { badgeOf, waitingTasks } from "./status";
import { fromBody, mergeMessages, emptyView } from "./store";

function message(extra: Partial<MessageBody>, blocks: object[] = []) {
  return fromBody(
    {
      id: "m",
      conversation_id: "c",
      task_id: "t",
      kind: "operator",
      key: "router",
      reply_to_message_id: null,
      purpose: "response",
      status: "streaming",
      created_at: "",
      updated_at: "",
      revision: 1,
      content: { version: "1.1", biz: "chat", meta: {}, blocks: blocks as never },
      ...extra,
    },
    null,
  );
}

describe("badgeOf", () => {
  const none = new Set<string>();
  it("follows the message status and the connection", () => {
    expect(badgeOf(message({ status: "completed" }), "open", none)).toBe("completed");
    expect(badgeOf(message({ status: "failed" }), "open", none)).toBe("failed");
    expect(badgeOf(message({}), "open", none)).toBe("running");
    expect(badgeOf(message({}), "reconnecting", none)).toBe("reconnecting");
    expect(badgeOf(message({}), "connecting", none)).toBe("connecting");
    expect(badgeOf(message({ kind: "user", purpose: "input" }), "open", none)).toBeNull();
  });

  it("says waiting while the Task has an open question or a pending gate", () => {
    const question = message({ id: "q", purpose: "human_request" });
    const answer = message({ id: "a" });
    const view = mergeMessages(emptyView("c"), [question, answer]);
    expect(badgeOf(answer, "open", waitingTasks(view))).toBe("waiting");
    const gated = message({ id: "g", task_id: "t2", kind: "harness" }, [{ id: "gate/1", type: "ask", status: "pending" }]);
    expect(badgeOf(gated, "open", none)).toBe("waiting");
    const resolved = message({ id: "g", task_id: "t2" }, [{ id: "gate/1", type: "ask", status: "success" }]);
    expect(badgeOf(resolved, "open", none)).toBe("running");
  });
});

describe("FrameBatcher", () => {
  function manual() {
    const frames: (() => void)[] = [];
    const scheduler: Scheduler = {
      frame: (cb) => frames.push(cb) - 1,
      cancelFrame: () => undefined,
      timer: () => setTimeout(() => undefined, 0),
      cancelTimer: (h) => clearTimeout(h),
    };
    return { frames, scheduler };
  }

  it("hands over everything queued in one frame, in order, once", () => {
    const { frames, scheduler } = manual();
    const flushed: number[][] = [];
    const batcher = new FrameBatcher<number>((items) => flushed.push(items), 1000, scheduler);
    for (let i = 0; i < 50; i += 1) batcher.push(i);
    expect(frames).toHaveLength(1); // one schedule for 50 items
    frames[0]?.();
    expect(flushed).toEqual([Array.from({ length: 50 }, (_, i) => i)]);
    batcher.push(99);
    expect(frames).toHaveLength(2);
  });

  it("cancel drops the queue", () => {
    const { frames, scheduler } = manual();
    const flushed: number[][] = [];
    const batcher = new FrameBatcher<number>((items) => flushed.push(items), 1000, scheduler);
    batcher.push(1);
    batcher.cancel();
    frames[0]?.();
    expect(flushed).toEqual([]);
  });
});
