// JSON over HTTP to the same origin, with the server's error envelope turned into a typed ApiError.
// Must not do: retry (callers decide), or talk to any other host.

/** The envelope types the server answers with, plus `network` (no answer) and `timeout`, `aborted`, `bad_response`. */
export type ApiErrorType =
  | "invalid_request"
  | "cursor_ahead"
  | "unauthorized"
  | "forbidden"
  | "not_found"
  | "conflict"
  | "payload_too_large"
  | "unsupported_media_type"
  | "too_many_requests"
  | "service_unavailable"
  | "internal_error"
  | "network"
  | "timeout"
  | "aborted"
  | "bad_response";

/** A failed API call: `status` is the HTTP status (0 when there was no answer), `type` the envelope's type. */
export class ApiError extends Error {
  readonly status: number;
  readonly type: ApiErrorType;
  constructor(status: number, type: ApiErrorType, message: string) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.type = type;
  }

  /** True when trying again later may succeed (no answer, 5xx, 429). */
  get retryable(): boolean {
    return this.type === "network" || this.type === "timeout" || this.status === 429 || this.status >= 500;
  }
}

const TYPE_OF_STATUS: Record<number, ApiErrorType> = {
  400: "invalid_request",
  401: "unauthorized",
  403: "forbidden",
  404: "not_found",
  405: "invalid_request",
  409: "conflict",
  413: "payload_too_large",
  415: "unsupported_media_type",
  429: "too_many_requests",
  503: "service_unavailable",
};

/** The ApiError of a non-2xx response: the envelope `{"error": {"type", "message"}}` when present. */
export async function errorOf(response: Response): Promise<ApiError> {
  let text = "";
  try {
    text = await response.text();
  } catch {
    // the body could not be read: fall back to the status
  }
  try {
    const body: unknown = JSON.parse(text);
    if (typeof body === "object" && body !== null && "error" in body) {
      const error = (body as { error: unknown }).error;
      if (typeof error === "object" && error !== null) {
        const { type, message } = error as { type?: unknown; message?: unknown };
        if (typeof type === "string" && typeof message === "string") {
          return new ApiError(response.status, type as ApiErrorType, message);
        }
      }
    }
  } catch {
    // not JSON: fall back to the status
  }
  const type = TYPE_OF_STATUS[response.status] ?? (response.status >= 500 ? "internal_error" : "bad_response");
  return new ApiError(response.status, type, `${response.status} ${response.statusText || "error"}`.trim());
}

export interface RequestOptions {
  method?: string;
  /** A JSON body (sent with Content-Type: application/json). */
  json?: unknown;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** Milliseconds before the call is abandoned with ApiError `timeout` (default 15 s). */
  timeoutMs?: number;
  fetch?: typeof fetch;
}

/** A fetch that follows the caller's signal and a timeout; network failures become ApiError. */
export async function request(path: string, options: RequestOptions = {}): Promise<Response> {
  const controller = new AbortController();
  const timeoutMs = options.timeoutMs ?? 15_000;
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    controller.abort();
  }, timeoutMs);
  const onAbort = () => controller.abort();
  options.signal?.addEventListener("abort", onAbort, { once: true });
  if (options.signal?.aborted) controller.abort();
  const headers: Record<string, string> = { Accept: "application/json", ...options.headers };
  const init: RequestInit = {
    method: options.method ?? (options.json === undefined ? "GET" : "POST"),
    headers,
    credentials: "same-origin",
    signal: controller.signal,
  };
  if (options.json !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(options.json);
  }
  try {
    return await (options.fetch ?? fetch)(path, init);
  } catch (error) {
    if (timedOut) throw new ApiError(0, "timeout", `no answer from ${path} within ${timeoutMs} ms`);
    if (options.signal?.aborted) throw new ApiError(0, "aborted", "the request was cancelled");
    throw new ApiError(0, "network", `cannot reach the server (${(error as Error).message || "network error"})`);
  } finally {
    clearTimeout(timer);
    options.signal?.removeEventListener("abort", onAbort);
  }
}

/** Call a JSON route and return its parsed body; any non-2xx answer throws the envelope's ApiError. */
export async function apiJson<T>(path: string, options: RequestOptions = {}): Promise<T> {
  const response = await request(path, options);
  if (!response.ok) throw await errorOf(response);
  try {
    return (await response.json()) as T;
  } catch {
    throw new ApiError(response.status, "bad_response", `the answer of ${path} is not JSON`);
  }
}
