// @vitest-environment node
// followStream against a real SSE server on loopback that drops connections mid-stream and checks Last-Event-ID.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { backoffDelay, followStream, parseFrame } from "./stream";
import type { StreamStatus } from "./stream";
import type { StreamFrame } from "./types";

const LOG = Array.from({ length: 30 }, (_, index) => {
  const cursor = index + 1;
  const event =
    cursor === 1
      ? { op: "start", seq: 1, model: { version: "1.1", biz: "chat", meta: {}, blocks: [] } }
      : cursor === 30
        ? { op: "end", seq: 30 }
        : { op: "append", seq: cursor, mask: "block.content", block: { id: "a", type: "text", content: `t${cursor} ` } };
  return { cursor, data: { message_id: "m1", seq: cursor, event } };
});

let server: Server;
let base = "";
const seenCursors: (string | undefined)[] = [];
let dropEvery = 7;
let mode: "normal" | "errorFrame" | "silent" = "normal";
let errorSent = false;

function sse(res: ServerResponse, after: number, limit: number) {
  res.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-cache" });
  res.write(": hello\n\n");
  const items = LOG.filter((item) => item.cursor > after).slice(0, limit);
  // Frames in odd pieces, to exercise the parser across chunks.
  const text = items.map((item) => `id: ${item.cursor}\ndata: ${JSON.stringify(item.data)}\n\n`).join("");
  const pieces = text.match(/[\s\S]{1,37}/g) ?? [];
  let index = 0;
  const timer = setInterval(() => {
    if (index < pieces.length) {
      res.write(pieces[index]);
      index += 1;
      return;
    }
    clearInterval(timer);
    if (items.length === limit && items[items.length - 1]?.cursor !== 30) res.destroy(); // a network drop
    else res.end();
  }, 1);
}

beforeAll(async () => {
  server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url ?? "/", "http://x");
    const last = req.headers["last-event-id"] as string | undefined;
    if (url.pathname === "/stream") {
      seenCursors.push(last);
      const after = last === undefined ? 0 : Number(last);
      if (after > 30) {
        res.writeHead(400, { "Content-Type": "application/json" });
        res.end(JSON.stringify({ error: { type: "cursor_ahead", message: "cursor past the end" } }));
        return;
      }
      if (mode === "errorFrame" && !errorSent && after >= 10) {
        errorSent = true;
        res.writeHead(200, { "Content-Type": "text/event-stream" });
        res.end(`event: error\ndata: ${JSON.stringify({ error: { type: "service_unavailable", message: "db gone" }, resume_after: after })}\n\n`);
        return;
      }
      if (mode === "silent" && seenCursors.length === 1) {
        res.writeHead(200, { "Content-Type": "text/event-stream" });
        res.write(": one heartbeat, then nothing\n\n");
        return; // never ends: the client's idle timeout must drop it
      }
      sse(res, after, dropEvery);
      return;
    }
    if (url.pathname === "/gone") {
      res.writeHead(404, { "Content-Type": "application/json" }).end('{"error":{"type":"not_found","message":"no such conversation"}}');
      return;
    }
    res.writeHead(500).end();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

const fast = { initialMs: 5, maxMs: 20 };

function reset(next: typeof mode = "normal", drop = 7) {
  seenCursors.length = 0;
  mode = next;
  dropEvery = drop;
  errorSent = false;
}

describe("followStream", () => {
  it("resumes after every drop with Last-Event-ID: no lost and no repeated frame", async () => {
    reset();
    const frames: StreamFrame[] = [];
    const statuses: StreamStatus[] = [];
    const controller = new AbortController();
    const last = await followStream({
      url: `${base}/stream`,
      cursor: null,
      signal: controller.signal,
      onFrame: (frame) => frames.push(frame),
      onStatus: (status) => statuses.push(status),
      untilMessageId: "m1",
      backoff: fast,
    });
    expect(last).toBe(30);
    expect(frames.map((f) => f.cursor)).toEqual(LOG.map((item) => item.cursor));
    expect(seenCursors).toEqual([undefined, "7", "14", "21", "28"]);
    expect(statuses).toContain("reconnecting");
    expect(statuses.at(-1)).toBe("ended");
  });

  it("starts from the given cursor", async () => {
    reset("normal", 100);
    const frames: StreamFrame[] = [];
    await followStream({
      url: `${base}/stream`,
      cursor: 25,
      signal: new AbortController().signal,
      onFrame: (frame) => frames.push(frame),
      untilMessageId: "m1",
      backoff: fast,
    });
    expect(frames.map((f) => f.cursor)).toEqual([26, 27, 28, 29, 30]);
    expect(seenCursors).toEqual(["25"]);
  });

  it("an error frame from the server resumes from its resume_after", async () => {
    reset("errorFrame", 10);
    const frames: StreamFrame[] = [];
    await followStream({
      url: `${base}/stream`,
      cursor: null,
      signal: new AbortController().signal,
      onFrame: (frame) => frames.push(frame),
      untilMessageId: "m1",
      backoff: fast,
    });
    expect(frames.map((f) => f.cursor)).toEqual(LOG.map((item) => item.cursor));
    expect(seenCursors.slice(0, 3)).toEqual([undefined, "10", "10"]);
  });

  it("a silent connection is dropped and resumed", async () => {
    reset("silent", 100);
    const frames: StreamFrame[] = [];
    await followStream({
      url: `${base}/stream`,
      cursor: null,
      signal: new AbortController().signal,
      onFrame: (frame) => frames.push(frame),
      untilMessageId: "m1",
      backoff: fast,
      idleTimeoutMs: 200,
    });
    expect(frames).toHaveLength(30);
    expect(seenCursors).toEqual([undefined, undefined]);
  });

  it("a refusal that cannot succeed fails without retrying", async () => {
    const statuses: StreamStatus[] = [];
    const errors: unknown[] = [];
    await followStream({
      url: `${base}/gone`,
      cursor: 3,
      signal: new AbortController().signal,
      onFrame: () => undefined,
      onStatus: (status, error) => {
        statuses.push(status);
        if (error) errors.push(error);
      },
      backoff: fast,
    });
    expect(statuses).toEqual(["connecting", "failed"]);
    expect(errors[0]).toMatchObject({ status: 404, type: "not_found" });
  });

  it("a cursor the server does not know asks the caller for a new one", async () => {
    reset("normal", 100);
    const frames: StreamFrame[] = [];
    let asked = 0;
    await followStream({
      url: `${base}/stream`,
      cursor: 99,
      signal: new AbortController().signal,
      onFrame: (frame) => frames.push(frame),
      onCursorAhead: async () => {
        asked += 1;
        return 28;
      },
      untilMessageId: "m1",
      backoff: fast,
    });
    expect(asked).toBe(1);
    expect(frames.map((f) => f.cursor)).toEqual([29, 30]);
  });

  it("aborting stops following and delivers nothing more", async () => {
    reset("normal", 3);
    const frames: StreamFrame[] = [];
    const controller = new AbortController();
    await followStream({
      url: `${base}/stream`,
      cursor: null,
      signal: controller.signal,
      onFrame: (frame) => {
        frames.push(frame);
        if (frames.length === 5) controller.abort();
      },
      backoff: fast,
    });
    expect(frames.length).toBeGreaterThanOrEqual(5);
    expect(frames.length).toBeLessThanOrEqual(6);
  });
});

describe("backoffDelay and parseFrame", () => {
  it("grows and caps the delay", () => {
    expect([0, 1, 2, 3, 10].map((n) => backoffDelay(n))).toEqual([1500, 3000, 6000, 8000, 8000]);
  });

  it("reads only data frames with a numeric id", () => {
    expect(parseFrame(null, "{}")).toBeNull();
    expect(parseFrame("5", "not json")).toBeNull();
    expect(parseFrame("5", '{"message_id":"m","seq":2,"event":{"op":"end","seq":2}}')).toEqual({
      cursor: 5,
      message_id: "m",
      seq: 2,
      event: { op: "end", seq: 2 },
    });
  });
});
