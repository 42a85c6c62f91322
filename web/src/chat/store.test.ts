// @vitest-environment node
import { describe, expect, it } from "vitest";
import type { MessageBody, SnapshotBody, StreamFrame } from "../api";
import { applyFrames, emptyView, fromBody, isNewer, mergeMessages, mergeSnapshot, messagesOf } from "./store";

const CID = "c1";

function body(id: string, revision: number, content: string, extra: Partial<MessageBody> = {}): MessageBody {
  return {
    id,
    conversation_id: CID,
    task_id: "t1",
    kind: "operator",
    key: "router",
    reply_to_message_id: null,
    purpose: "response",
    status: "streaming",
    created_at: "2026-01-01T00:00:00Z",
    updated_at: "2026-01-01T00:00:00Z",
    revision,
    content: { version: "1.1", biz: "chat", meta: {}, blocks: [{ id: "answer", type: "text", content }] },
    ...extra,
  };
}

function snapshot(cursor: number, ...messages: MessageBody[]): SnapshotBody {
  return {
    conversation: { id: CID, name: "", actor_kind: "user", actor_key: "me", task_id: null, created_at: "", updated_at: "" },
    messages,
    cursor,
  };
}

const header = (id: string, status: "streaming" | "completed" = "streaming") => ({
  id,
  conversation_id: CID,
  task_id: "t1",
  kind: "operator" as const,
  key: "router",
  reply_to_message_id: null,
  purpose: "response" as const,
  status,
  created_at: "2026-01-01T00:00:00Z",
});

function append(cursor: number, id: string, seq: number, text: string): StreamFrame {
  return { cursor, message_id: id, seq, event: { op: "append", seq, mask: "block.content", block: { id: "answer", type: "text", content: text } } };
}

function textOf(view: ReturnType<typeof emptyView>, id: string): unknown {
  const block = view.byId.get(id)?.content?.blocks[0] as { content?: string } | undefined;
  return block?.content;
}

describe("revision merge", () => {
  it("merges by id and the higher revision wins", () => {
    let view = mergeMessages(emptyView(CID), [fromBody(body("m2", 3, "new"), null), fromBody(body("m1", 1, "a"), null)]);
    expect(view.order).toEqual(["m1", "m2"]);
    view = mergeMessages(view, [fromBody(body("m2", 2, "older"), null)]);
    expect(textOf(view, "m2")).toBe("new");
    view = mergeMessages(view, [fromBody(body("m2", 4, "newer"), null)]);
    expect(textOf(view, "m2")).toBe("newer");
    expect(view.order).toEqual(["m1", "m2"]);
  });

  it("an equal revision keeps what the page has (and the same view object)", () => {
    const view = mergeMessages(emptyView(CID), [fromBody(body("m1", 2, "a"), null)]);
    expect(mergeMessages(view, [fromBody(body("m1", 2, "b"), null)])).toBe(view);
  });

  it("a known cursor beats the revision: a snapshot read before later frames does not roll them back", () => {
    let view = mergeSnapshot(emptyView(CID), snapshot(10, body("m1", 2, "Hel")));
    view = applyFrames(view, [append(11, "m1", 5, "lo")]);
    expect(textOf(view, "m1")).toBe("Hello");
    // a slow re-read that is current through cursor 10 only, though it has a higher revision
    view = mergeSnapshot(view, snapshot(10, body("m1", 3, "Hel")));
    expect(textOf(view, "m1")).toBe("Hello");
    // a newer one wins
    view = mergeSnapshot(view, snapshot(12, body("m1", 4, "Hello!", { status: "completed" })));
    expect(textOf(view, "m1")).toBe("Hello!");
    expect(view.byId.get("m1")?.status).toBe("completed");
    expect(view.cursor).toBe(12);
  });

  it("isNewer compares cursors only when both are known", () => {
    expect(isNewer(fromBody(body("m", 1, ""), 5), fromBody(body("m", 9, ""), 4))).toBe(true);
    expect(isNewer(fromBody(body("m", 1, ""), null), fromBody(body("m", 9, ""), 4))).toBe(false);
    expect(isNewer(fromBody(body("m", 10, ""), null), fromBody(body("m", 9, ""), 4))).toBe(true);
  });

  it("ignores messages of another conversation", () => {
    const other = fromBody({ ...body("x", 1, ""), conversation_id: "c2" }, null);
    const view = emptyView(CID);
    expect(mergeMessages(view, [other])).toBe(view);
  });
});

describe("stream frames", () => {
  const start = (cursor: number, id: string): StreamFrame => ({
    cursor,
    message_id: id,
    seq: 1,
    event: { op: "start", seq: 1, model: { version: "1.1", biz: "chat", meta: {}, blocks: [] } },
    message: header(id),
  });
  const end = (cursor: number, id: string, seq: number): StreamFrame => ({
    cursor,
    message_id: id,
    seq,
    event: { op: "end", seq },
    message: header(id, "completed"),
  });

  it("creates a message from its start and grows it; a resumed delivery adds nothing twice", () => {
    const frames = [start(1, "m1"), append(2, "m1", 2, "Hello"), append(3, "m1", 3, " world"), end(4, "m1", 4)];
    let view = applyFrames(emptyView(CID), frames.slice(0, 3));
    expect(textOf(view, "m1")).toBe("Hello world");
    view = applyFrames(view, frames.slice(1)); // redelivered after a reconnect from an older cursor
    expect(textOf(view, "m1")).toBe("Hello world");
    expect(view.byId.get("m1")?.status).toBe("completed");
    expect(view.cursor).toBe(4);
    expect(applyFrames(view, frames)).toBe(view);
  });

  it("skips frames a snapshot already covers", () => {
    let view = mergeSnapshot(emptyView(CID), snapshot(3, body("m1", 3, "Hello world")));
    view = applyFrames(view, [append(2, "m1", 2, "Hello"), append(3, "m1", 3, " world"), append(4, "m1", 4, "!")]);
    expect(textOf(view, "m1")).toBe("Hello world!");
  });

  it("a change to an unknown message marks the view stale", () => {
    const view = applyFrames(emptyView(CID), [append(5, "ghost", 2, "x")]);
    expect(view.stale).toBe(true);
    expect(view.order).toEqual([]);
    expect(mergeSnapshot(view, snapshot(5)).stale).toBe(false);
  });

  it("an error op marks a streaming message failed", () => {
    let view = applyFrames(emptyView(CID), [start(1, "m1")]);
    view = applyFrames(view, [
      { cursor: 2, message_id: "m1", seq: 2, event: { op: "error", seq: 2, mask: "meta.error", meta: { error: { code: "x", message: "boom" } } } },
    ]);
    expect(view.byId.get("m1")?.status).toBe("failed");
  });

  it("keeps unchanged messages identical (memoized rendering)", () => {
    let view = applyFrames(emptyView(CID), [start(1, "m1"), start(2, "m2"), append(3, "m2", 2, "x")]);
    const m1 = view.byId.get("m1");
    view = applyFrames(view, [append(4, "m2", 3, "y")]);
    expect(view.byId.get("m1")).toBe(m1);
    expect(messagesOf(view).map((m) => m.id)).toEqual(["m1", "m2"]);
  });
});

describe("ordering", () => {
  it("keeps id order whatever order messages arrive in", () => {
    const ids = ["m5", "m1", "m9", "m3"];
    let view = emptyView(CID);
    for (const id of ids) view = mergeMessages(view, [fromBody(body(id, 1, id), null)]);
    expect(view.order).toEqual(["m1", "m3", "m5", "m9"]);
    view = mergeMessages(view, [fromBody(body("m2", 1, ""), null), fromBody(body("m7", 1, ""), null)]);
    expect(view.order).toEqual(["m1", "m2", "m3", "m5", "m7", "m9"]);
  });

  it("a snapshot of 1,000 messages merges in one pass", () => {
    const bodies = Array.from({ length: 1000 }, (_, n) => body(`m${String(n).padStart(4, "0")}`, 1, `text ${n}`));
    const view = mergeSnapshot(emptyView(CID), snapshot(2000, ...bodies));
    expect(view.order).toHaveLength(1000);
    expect(view.order[999]).toBe("m0999");
  });
});
