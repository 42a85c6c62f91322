/**
 * The server shapes and the small JSON client the detail panel, the cards and the ledger use.
 *
 * `Api` is an interface so components take it as a prop (tests pass an in-memory one); `httpApi` is the real one
 * (same-origin fetch with the browser's cookie, a timeout on every call, the error envelope turned into `HttpError`).
 * Must not do: hold state, retry, or read anything but the routes named here.
 */

/** A stored message, as the server sends it (`MessageBody` in src/loopd/server/chat/_wire.py). */
export interface MessageBody {
  readonly id: string;
  readonly conversation_id: string;
  readonly task_id: string | null;
  readonly kind: "user" | "operator" | "harness";
  readonly key: string;
  readonly reply_to_message_id: string | null;
  readonly purpose: "input" | "response" | "human_request" | "human_reply" | "output";
  readonly status: "streaming" | "completed" | "failed" | "cancelled" | "expired";
  readonly revision: number;
  readonly content: {
    readonly version?: string;
    readonly biz?: string;
    readonly meta?: Record<string, unknown> | null;
    readonly blocks?: readonly Record<string, unknown>[];
  };
  readonly created_at: string;
  readonly updated_at: string;
}

/** A conversation (`ConversationBody`). */
export interface ConversationBody {
  readonly id: string;
  readonly name: string;
  readonly actor_kind: "user" | "operator" | "harness";
  readonly actor_key: string;
  readonly task_id: string | null;
  readonly created_at: string;
  readonly updated_at: string;
}

/** `GET /v1/conversations/{id}/snapshot`. */
export interface SnapshotBody {
  readonly conversation: ConversationBody;
  readonly messages: readonly MessageBody[];
  readonly cursor: number;
}

/** An HTTP failure: the envelope's `type` and `message`, or `network` / `timeout` when no answer came. */
export class HttpError extends Error {
  readonly status: number;
  readonly type: string;
  constructor(status: number, type: string, message: string) {
    super(message);
    this.name = "HttpError";
    this.status = status;
    this.type = type;
  }
}

/** What the W2 components read and write; every method rejects with `HttpError`. */
export interface Api {
  get<T>(path: string, signal?: AbortSignal): Promise<T>;
  post<T>(path: string, body: unknown, signal?: AbortSignal): Promise<T>;
}

export const DEFAULT_TIMEOUT_MS = 15_000;

async function errorOf(response: Response): Promise<HttpError> {
  let type = "http_error";
  let message = `${response.status} ${response.statusText}`.trim();
  try {
    const body: unknown = await response.json();
    const error = (body as { error?: { type?: unknown; message?: unknown } } | null)?.error;
    if (error && typeof error.type === "string") type = error.type;
    if (error && typeof error.message === "string" && error.message) message = error.message;
  } catch {
    // not JSON: keep the status line
  }
  return new HttpError(response.status, type, message);
}

/** A JSON request to this origin; aborted after `timeoutMs` or when `signal` aborts. */
export async function requestJson<T>(
  method: "GET" | "POST",
  path: string,
  body?: unknown,
  signal?: AbortSignal,
  timeoutMs: number = DEFAULT_TIMEOUT_MS,
): Promise<T> {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new HttpError(0, "timeout", "the server did not answer in time")), timeoutMs);
  const onAbort = () => controller.abort(signal?.reason);
  if (signal?.aborted) controller.abort(signal.reason);
  else signal?.addEventListener("abort", onAbort, { once: true });
  try {
    const init: RequestInit = { method, credentials: "same-origin", signal: controller.signal, headers: { Accept: "application/json" } };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers = { Accept: "application/json", "Content-Type": "application/json" };
    }
    let response: Response;
    try {
      response = await fetch(path, init);
    } catch (exc) {
      if (controller.signal.reason instanceof HttpError) throw controller.signal.reason;
      if (signal?.aborted) throw exc;
      throw new HttpError(0, "network", "the server could not be reached");
    }
    if (!response.ok) throw await errorOf(response);
    return (await response.json()) as T;
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener("abort", onAbort);
  }
}

/** The real client: same-origin fetch (the `loopd-human` cookie rides along; the browser adds `Origin`). */
export const httpApi: Api = {
  get: (path, signal) => requestJson("GET", path, undefined, signal),
  post: (path, body, signal) => requestJson("POST", path, body, signal),
};

/** True when `error` is an abort the caller asked for (not a failure to show). */
export function isAbort(error: unknown, signal?: AbortSignal): boolean {
  return signal?.aborted === true || (error instanceof DOMException && error.name === "AbortError");
}

/** A readable one-line message for any error a call raised. */
export function errorText(error: unknown): string {
  if (error instanceof HttpError) {
    if (error.type === "network") return "Could not reach the server. Check the connection and try again.";
    if (error.type === "timeout") return "The server did not answer in time. Try again.";
    return error.message || `Request failed (${error.status}).`;
  }
  return error instanceof Error ? error.message : String(error);
}
