// Follow a conversation's SSE stream with resume: every reconnect sends the last cursor seen (Last-Event-ID), so
// no event is lost or repeated; drops and EOFs reconnect with capped exponential backoff; a silent connection (no
// byte, not even a heartbeat, for `idleTimeoutMs`) is treated as dropped. Aborting `signal` ends everything.
// Must not do: apply events (the caller's `onFrame` does), or retry refusals that cannot succeed (403, 404, ...).
import type { JsonObject } from "../agentue";
import { ApiError, errorOf } from "./http";
import { SseParser } from "./sse";
import type { StreamFrame } from "./types";

export type StreamStatus = "connecting" | "open" | "reconnecting" | "ended" | "failed";

export interface BackoffOptions {
  /** First wait before a reconnect (default 1,500 ms). */
  initialMs?: number;
  /** Longest wait (default 8,000 ms). */
  maxMs?: number;
  /** Growth per failed attempt (default 2). */
  factor?: number;
}

export interface FollowOptions {
  /** The stream's URL (GET), e.g. `/v1/conversations/{id}/stream`. */
  url: string;
  /** Resume after this conversation cursor (null: from the server's current end). */
  cursor: number | null;
  signal: AbortSignal;
  onFrame: (frame: StreamFrame) => void;
  /** A batch of frames that arrived in one chunk has been delivered (a good moment to render). */
  onChunk?: () => void;
  onStatus?: (status: StreamStatus, error?: ApiError) => void;
  /** The server refused the cursor as ahead of its log: return the cursor to resume from (after a snapshot reload). */
  onCursorAhead?: () => Promise<number | null>;
  /** Close once this message's `end` has been delivered (otherwise follow until aborted). */
  untilMessageId?: string;
  backoff?: BackoffOptions;
  /** A connection silent this long is dropped and resumed (default 45 s: three server heartbeats). */
  idleTimeoutMs?: number;
  fetch?: typeof fetch;
  /** For tests: how to wait (default setTimeout, cut short by `signal`). */
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
}

/** The delay before reconnect attempt `attempt` (0-based): initial × factor^attempt, capped. Pure. */
export function backoffDelay(attempt: number, options: BackoffOptions = {}): number {
  const initial = options.initialMs ?? 1500;
  const max = options.maxMs ?? 8000;
  const factor = options.factor ?? 2;
  return Math.min(max, initial * factor ** Math.max(0, attempt));
}

/** Wait `ms`, cut short by `signal` or by the browser coming back online (then reconnecting at once pays off). */
function defaultSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) {
      resolve();
      return;
    }
    const timer = setTimeout(done, ms);
    const online = typeof window !== "undefined" && typeof window.addEventListener === "function" ? window : null;
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      online?.removeEventListener("online", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
    online?.addEventListener("online", done, { once: true });
  });
}

/** Parse one SSE data frame of a conversation stream (null when it is not one). */
export function parseFrame(id: string | null, data: string): StreamFrame | null {
  if (id === null || !/^\d+$/.test(id)) return null;
  let body: unknown;
  try {
    body = JSON.parse(data);
  } catch {
    return null;
  }
  if (typeof body !== "object" || body === null) return null;
  const { message_id, seq, event, message } = body as Record<string, unknown>;
  if (typeof message_id !== "string" || typeof seq !== "number" || typeof event !== "object" || event === null) return null;
  const frame: StreamFrame = { cursor: Number(id), message_id, seq, event: event as JsonObject };
  if (typeof message === "object" && message !== null) frame.message = message as StreamFrame["message"];
  return frame;
}

type Outcome = { kind: "dropped"; error?: ApiError; progressed: boolean } | { kind: "ended" } | { kind: "fatal"; error: ApiError };

/**
 * Follow the stream until `signal` aborts, `untilMessageId` ends, or the server refuses for good.
 * Resolves with the last cursor delivered. Never rejects for network trouble (it reconnects instead).
 */
export async function followStream(options: FollowOptions): Promise<number | null> {
  const sleep = options.sleep ?? defaultSleep;
  let cursor = options.cursor;
  let attempt = 0;
  options.onStatus?.("connecting");
  while (!options.signal.aborted) {
    const outcome = await connectOnce(options, cursor, (next) => {
      cursor = next;
    });
    if (options.signal.aborted) break;
    if (outcome.kind === "ended") {
      options.onStatus?.("ended");
      return cursor;
    }
    if (outcome.kind === "fatal") {
      if (outcome.error.type === "cursor_ahead" && options.onCursorAhead !== undefined) {
        try {
          cursor = await options.onCursorAhead();
          continue;
        } catch {
          // fall through: report and retry later
        }
      } else {
        options.onStatus?.("failed", outcome.error);
        return cursor;
      }
    }
    if (outcome.kind === "dropped" && outcome.progressed) attempt = 0;
    options.onStatus?.("reconnecting", outcome.kind === "dropped" ? outcome.error : undefined);
    await sleep(backoffDelay(attempt, options.backoff), options.signal);
    attempt += 1;
  }
  return cursor;
}

async function connectOnce(options: FollowOptions, cursor: number | null, advance: (cursor: number) => void): Promise<Outcome> {
  const controller = new AbortController();
  const onAbort = () => controller.abort();
  options.signal.addEventListener("abort", onAbort, { once: true });
  const idleMs = options.idleTimeoutMs ?? 45_000;
  let idle: ReturnType<typeof setTimeout> | undefined;
  let idleFired = false;
  const touch = () => {
    clearTimeout(idle);
    idle = setTimeout(() => {
      idleFired = true;
      controller.abort();
    }, idleMs);
  };
  let progressed = false;
  try {
    const headers: Record<string, string> = { Accept: "text/event-stream" };
    if (cursor !== null) headers["Last-Event-ID"] = String(cursor);
    touch();
    let response: Response;
    try {
      response = await (options.fetch ?? fetch)(options.url, {
        method: "GET",
        headers,
        credentials: "same-origin",
        cache: "no-store",
        signal: controller.signal,
      });
    } catch (error) {
      const why = idleFired ? "no answer in time" : (error as Error).message || "network error";
      return { kind: "dropped", error: new ApiError(0, idleFired ? "timeout" : "network", why), progressed };
    }
    if (!response.ok) {
      const error = await errorOf(response);
      return error.retryable ? { kind: "dropped", error, progressed } : { kind: "fatal", error };
    }
    if (response.body === null) return { kind: "dropped", progressed };
    options.onStatus?.("open");
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    const parser = new SseParser();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return { kind: "dropped", progressed };
        touch();
        for (const message of parser.push(decoder.decode(value, { stream: true }))) {
          if (message.event === "error") {
            // The server lost its database under the stream: resume from where it says.
            const body = safeJson(message.data);
            const after = body !== null && typeof body["resume_after"] === "number" ? body["resume_after"] : null;
            if (after !== null && (cursor === null || after > cursor)) advance(after);
            const envelope = body?.["error"] as { type?: string; message?: string } | undefined;
            return {
              kind: "dropped",
              error: new ApiError(503, "service_unavailable", envelope?.message ?? "the stream failed"),
              progressed,
            };
          }
          if (message.event !== "message") continue; // the chat request's ack, or a future event kind
          const frame = parseFrame(message.id, message.data);
          if (frame === null) continue;
          if (cursor !== null && frame.cursor <= cursor) continue; // already delivered
          cursor = frame.cursor;
          advance(frame.cursor);
          progressed = true;
          options.onFrame(frame);
          if (options.untilMessageId === frame.message_id && frame.event["op"] === "end") return { kind: "ended" };
        }
        options.onChunk?.();
      }
    } catch (error) {
      const why = idleFired ? "the stream went silent" : (error as Error).message || "the connection dropped";
      return { kind: "dropped", error: new ApiError(0, idleFired ? "timeout" : "network", why), progressed };
    } finally {
      reader.cancel().catch(() => undefined);
    }
  } finally {
    clearTimeout(idle);
    options.signal.removeEventListener("abort", onAbort);
    controller.abort();
  }
}

function safeJson(text: string): Record<string, unknown> | null {
  try {
    const value: unknown = JSON.parse(text);
    return typeof value === "object" && value !== null ? (value as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}
