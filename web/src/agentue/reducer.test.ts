// @vitest-environment node
// The reducer's sequence rules, streams and immutability beyond the conformance files.
import { describe, expect, it } from "vitest";
import { AgentUERejectedError, emptyState, fold, reduce, reduceStreams } from ".";
import type { Streams } from ".";

const start = (seq: number, stream?: string) => ({
  op: "start",
  seq,
  ...(stream === undefined ? {} : { stream_id: stream }),
  model: { version: "1.1", biz: "chat", meta: {}, blocks: [] },
});
const text = (seq: number, content: string, stream?: string) => ({
  op: "append",
  seq,
  ...(stream === undefined ? {} : { stream_id: stream }),
  mask: "block.content",
  block: { id: "t", type: "text", content },
});
const end = (seq: number, stream?: string) => ({ op: "end", seq, ...(stream === undefined ? {} : { stream_id: stream }) });

describe("sequence rules", () => {
  it("ignores redelivered events (idempotent resume)", () => {
    const once = fold([start(1), text(2, "Hel"), text(3, "lo")]);
    const twice = fold([text(2, "Hel"), text(3, "lo"), text(4, "!")], once);
    expect(twice.model?.blocks).toEqual([{ id: "t", type: "text", content: "Hello!" }]);
  });

  it("a resumed start replaces the model; later events apply on top", () => {
    const resumed = fold([start(1), text(2, "A"), { ...start(2), model: { version: "1.1", biz: "chat", meta: {}, blocks: [{ id: "t", type: "text", content: "A" }] } }, text(3, "B")]);
    expect(resumed.model?.blocks).toEqual([{ id: "t", type: "text", content: "AB" }]);
  });

  it("refuses changes before start and after end, and keeps the state", () => {
    expect(() => reduce(emptyState(), text(1, "x"))).toThrow(AgentUERejectedError);
    const ended = fold([start(1), text(2, "x"), end(3)]);
    expect(ended.ended).toBe(true);
    expect(() => reduce(ended, text(4, "y"))).toThrowError(/ended/);
    expect(reduce(ended, { op: "ping", seq: 3 })).toBe(ended);
  });

  it("an end at the applied seq marks the stream ended", () => {
    const state = fold([start(1), text(2, "x"), end(2)]);
    expect(state.ended).toBe(true);
  });

  it("refuses a type mismatch and an unknown envelope field", () => {
    const state = fold([start(1), text(2, "x")]);
    expect(() => reduce(state, { op: "append", seq: 3, mask: "block.content", block: { id: "t", content: ["a"] } })).toThrowError(/type_mismatch/);
    expect(() => reduce(state, { ...text(3, "y"), extra: 1 })).toThrowError(/invalid_event/);
  });

  it("shares unchanged blocks between states (cheap memoization by identity)", () => {
    const a = fold([start(1), { op: "set", seq: 2, block: { id: "one", type: "text", content: "1" } }, text(3, "x")]);
    const b = reduce(a, text(4, "y"));
    expect(b.model?.blocks[0]).toBe(a.model?.blocks[0]);
    expect(b.model?.blocks[1]).not.toBe(a.model?.blocks[1]);
  });
});

describe("stream addressing", () => {
  it("keeps a model, seq and block ids per stream", () => {
    let streams: Streams = new Map();
    const events = [
      start(1, "a"),
      start(1, "b"),
      start(1),
      text(2, "A", "a"),
      text(2, "B", "b"),
      text(2, "unnamed"),
      end(3, "a"),
      text(3, "!", "b"),
      { ...start(3, "a"), model: { version: "1.1", biz: "chat", meta: {}, blocks: [{ id: "t", type: "text", content: "A" }] } },
      end(4, "b"),
    ];
    for (const event of events) streams = reduceStreams(streams, event);
    const content = (name: string) => (streams.get(name)?.model?.blocks[0] as { content?: string } | undefined)?.content;
    expect(content("a")).toBe("A");
    expect(content("b")).toBe("B!");
    expect(content("")).toBe("unnamed");
    expect(streams.get("a")?.ended).toBe(false);
    expect(streams.get("b")?.ended).toBe(true);
  });
});
