// @vitest-environment node
import { describe, expect, it } from "vitest";
import { SseParser } from "./sse";

describe("SseParser", () => {
  it("parses ids, events, multi-line data and skips comments", () => {
    const parser = new SseParser();
    const out = parser.push(': ping\n\nid: 7\ndata: {"a":1}\n\nevent: ack\ndata: x\ndata: y\n\n');
    expect(out).toEqual([
      { id: "7", event: "message", data: '{"a":1}' },
      { id: null, event: "ack", data: "x\ny" },
    ]);
  });

  it("handles chunks split anywhere, including inside \\r\\n", () => {
    const text = 'id: 1\r\ndata: {"x":"h\u00e9llo"}\r\n\r\nid: 2\rdata: two\r\r';
    for (let cut = 0; cut <= text.length; cut += 1) {
      const parser = new SseParser();
      const out = [...parser.push(text.slice(0, cut)), ...parser.push(text.slice(cut))];
      expect(out.map((m) => [m.id, m.data])).toEqual([
        ["1", '{"x":"h\u00e9llo"}'],
        ["2", "two"],
      ]);
    }
  });

  it("keeps an incomplete message until its blank line", () => {
    const parser = new SseParser();
    expect(parser.push("id: 3\ndata: partial")).toEqual([]);
    expect(parser.push("\n\n")).toEqual([{ id: "3", event: "message", data: "partial" }]);
  });
});
