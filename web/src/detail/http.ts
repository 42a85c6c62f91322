/**
 * The server shapes and the small JSON client the detail panel, the cards and the ledger use.
 *
 * `Api` is an interface so components take it as a prop (tests pass an in-memory one); `httpApi` is the real one,
 * over W1's client (web/src/api). Must not do: hold state or retry.
 */

import { ApiError, apiJson } from "../api";

export type { ConversationBody, MessageBody, SnapshotBody } from "../api";
/** The page's `ApiError` (W1's client): `status` (0: no answer), `type` (the envelope's, or `network` / `timeout`). */
export { ApiError as HttpError } from "../api";

/** What the W2 components read and write; every method rejects with `HttpError` (= `ApiError`). */
export interface Api {
  get<T>(path: string, signal?: AbortSignal): Promise<T>;
  post<T>(path: string, body: unknown, signal?: AbortSignal): Promise<T>;
}

/** The real client: W1's `apiJson` (same-origin fetch with the cookie, 15 s timeout, the envelope as ApiError). */
export const httpApi: Api = {
  get: (path, signal) => apiJson(path, signal ? { signal } : {}),
  post: (path, body, signal) => apiJson(path, signal ? { json: body, signal } : { json: body }),
};

/** A readable one-line message for any error a call raised. */
export function errorText(error: unknown): string {
  if (error instanceof ApiError) {
    if (error.type === "network") return "Could not reach the server. Check the connection and try again.";
    if (error.type === "timeout") return "The server did not answer in time. Try again.";
    return error.message || `Request failed (${error.status}).`;
  }
  return error instanceof Error ? error.message : String(error);
}
