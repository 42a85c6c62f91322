// The routes the page calls, typed. Must not do: keep state (the app does) or retry (callers decide).
import type { JsonObject } from "../agentue";
import { apiJson } from "./http";
import type {
  ActorList,
  ChatAccepted,
  ConversationBody,
  ConversationList,
  MeBody,
  MessageBody,
  SnapshotBody,
} from "./types";

const enc = encodeURIComponent;

/** Who the server thinks this browser is (`GET /v1/me`). */
export function getMe(signal?: AbortSignal): Promise<MeBody> {
  return apiJson<MeBody>("/v1/me", { signal });
}

/** Live responders, operators first (`GET /v1/actors`). */
export function listActors(signal?: AbortSignal): Promise<ActorList> {
  return apiJson<ActorList>("/v1/actors", { signal });
}

/** One page of the caller's conversations, newest first. */
export function listConversations(after?: string, signal?: AbortSignal): Promise<ConversationList> {
  const query = after === undefined ? "" : `?after=${enc(after)}`;
  return apiJson<ConversationList>(`/v1/conversations${query}`, { signal });
}

/** One conversation (`GET /v1/conversations/{id}`): its name, and the title and summary once written. */
export function getConversation(id: string, signal?: AbortSignal): Promise<ConversationBody> {
  return apiJson<ConversationBody>(`/v1/conversations/${enc(id)}`, { signal });
}

/** A new conversation owned by the caller. */
export function createConversation(name = ""): Promise<ConversationBody> {
  return apiJson<ConversationBody>("/v1/conversations", { json: { name } });
}

/** Rename a conversation (`PATCH /v1/conversations/{id}` with `{name}`). */
export function renameConversation(id: string, name: string): Promise<ConversationBody> {
  return apiJson<ConversationBody>(`/v1/conversations/${enc(id)}`, { method: "PATCH", json: { name } });
}

/** Set the mode the conversation's built-in harness calls start in from its next question (null: the harness's own). */
export function setConversationMode(id: string, mode: string | null): Promise<ConversationBody> {
  return apiJson<ConversationBody>(`/v1/conversations/${enc(id)}/mode`, { method: "PUT", json: { mode } });
}

/** Every message with its content and the cursor to resume the stream after. */
export function getSnapshot(conversationId: string, signal?: AbortSignal): Promise<SnapshotBody> {
  return apiJson<SnapshotBody>(`/v1/conversations/${enc(conversationId)}/snapshot`, { signal, timeoutMs: 30_000 });
}

/** The work conversation of a Task, or null when it has none (yet). */
export async function workConversation(taskId: string, signal?: AbortSignal): Promise<ConversationBody | null> {
  const list = await apiJson<ConversationList>(`/v1/conversations?task_id=${enc(taskId)}`, { signal });
  return list.data[0] ?? null;
}

/** The text model the composer sends: one user text block. */
export function textModel(text: string): JsonObject {
  return { version: "1.0", biz: "chat", meta: {}, blocks: [{ id: "question", type: "text", role: "user", content: text }] };
}

/** Ask `target` (`operator:router`, `harness:assistant`) a question; the answer streams in the conversation stream. */
export function sendMessage(conversationId: string, target: string, text: string): Promise<ChatAccepted> {
  const colon = target.indexOf(":");
  const kind = target.slice(0, colon);
  const key = target.slice(colon + 1);
  return apiJson<ChatAccepted>(`/v1/conversations/${enc(conversationId)}/messages`, {
    json: { target: { kind, key }, content: textModel(text) },
    timeoutMs: 30_000,
  });
}

/** The URL of a conversation's live stream. */
export function streamUrl(conversationId: string): string {
  return `/v1/conversations/${enc(conversationId)}/stream`;
}


/** How a fork asks again: `retry` an answer, or `edit` one of your questions and resend it. */
export type ForkMode = "retry" | "edit";

/** The answer to a fork: the new conversation, the question asked in it, and where it was forked from. */
export interface ForkAccepted extends ChatAccepted {
  conversation: ConversationBody;
  forked_from: { conversation_id: string; message_id: string; mode: ForkMode };
}

/** "Retry from here" (`messageId` an answer) or "Edit and resend" (`messageId` your question, `text` its new
 * wording): a new conversation with the history before it and the question asked again; the original stays. */
export function forkConversation(conversationId: string, messageId: string, mode: ForkMode, text?: string): Promise<ForkAccepted> {
  const json = mode === "edit" ? { mode, text: text ?? "" } : { mode };
  return apiJson<ForkAccepted>(`/v1/conversations/${enc(conversationId)}/messages/${enc(messageId)}/fork`, {
    json,
    timeoutMs: 30_000,
  });
}
