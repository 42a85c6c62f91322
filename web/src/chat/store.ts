// A conversation's messages as the page holds them, and how server data merges in. Pure.
//
// Messages merge by id and the newer one wins: when both sides know the conversation cursor their content is
// current through (`asOf`: a snapshot's cursor, or the cursor of the last stream frame applied), the higher cursor
// wins; otherwise the higher revision wins. Stream frames apply through the AgentUE reducer; a frame at or below
// the conversation's cursor, or below a message's `asOf`, was already applied and is skipped (no duplicates after
// a resume). A frame that cannot be applied marks the view `stale` (the caller reloads the snapshot).
// Must not do: I/O, or mutate a view (every change returns a new one; unchanged messages keep their identity).
import { type JsonObject, type Model, reduce, AgentUERejectedError } from "../agentue";
import type { MessageBody, MessageHeader, SnapshotBody, StreamFrame } from "../api";

/** One message as the page renders it. */
export interface ChatMessage extends MessageHeader {
  revision: number;
  /** The AgentUE model (null only before a stream's start arrives). */
  content: Model | null;
  updated_at: string | null;
  /** The last stream seq applied to `content` (null when it came from a snapshot or a body). */
  seq: number | null;
  /** The conversation cursor `content` is current through (null: unknown, e.g. a body from a reply). */
  asOf: number | null;
}

/** A conversation's messages in id order (UUIDv7 ids: creation order). */
export interface ConversationView {
  readonly conversationId: string;
  readonly byId: ReadonlyMap<string, ChatMessage>;
  readonly order: readonly string[];
  /** The conversation cursor everything here is current through: resume the stream after it. */
  readonly cursor: number;
  /** True when a frame could not be applied: reload the snapshot. */
  readonly stale: boolean;
}

/** An empty view of a conversation (cursor 0). */
export function emptyView(conversationId: string): ConversationView {
  return { conversationId, byId: new Map(), order: [], cursor: 0, stale: false };
}

/** A message of the page from a server body (`asOf`: the cursor the body is current through, when known). */
export function fromBody(body: MessageBody, asOf: number | null): ChatMessage {
  return {
    id: body.id,
    conversation_id: body.conversation_id,
    task_id: body.task_id,
    kind: body.kind,
    key: body.key,
    reply_to_message_id: body.reply_to_message_id,
    purpose: body.purpose,
    status: body.status,
    created_at: body.created_at,
    updated_at: body.updated_at,
    revision: body.revision,
    content: body.content as unknown as Model,
    seq: null,
    asOf,
  };
}

/** True when `incoming` is newer than `local` (see the module comment). */
export function isNewer(incoming: ChatMessage, local: ChatMessage | undefined): boolean {
  if (local === undefined) return true;
  if (incoming.asOf !== null && local.asOf !== null && incoming.asOf !== local.asOf) return incoming.asOf > local.asOf;
  return incoming.revision > local.revision;
}

function withNewIds(order: readonly string[], added: string[]): string[] {
  const last = order[order.length - 1];
  let sorted = true;
  for (let index = 0; index < added.length; index += 1) {
    const previous = index === 0 ? last : added[index - 1];
    if (previous !== undefined && previous > (added[index] as string)) {
      sorted = false;
      break;
    }
  }
  // New ids usually come after the known ones, in order (a snapshot, a stream): append; else sort once.
  return sorted ? [...order, ...added] : [...order, ...added].sort();
}

/** Merge messages into the view by id; the newer of each pair wins. Returns the same view when nothing changed. */
export function mergeMessages(view: ConversationView, incoming: Iterable<ChatMessage>): ConversationView {
  let byId: Map<string, ChatMessage> | null = null;
  const added: string[] = [];
  for (const message of incoming) {
    if (message.conversation_id !== view.conversationId) continue;
    const local = (byId ?? view.byId).get(message.id);
    if (!isNewer(message, local)) continue;
    byId ??= new Map(view.byId);
    byId.set(message.id, message);
    if (local === undefined) added.push(message.id);
  }
  if (byId === null) return view;
  return { ...view, byId, order: added.length === 0 ? view.order : withNewIds(view.order, added) };
}

/** Merge a snapshot: its messages (current through its cursor) and its cursor, when ahead of the view's. */
export function mergeSnapshot(view: ConversationView, snapshot: SnapshotBody): ConversationView {
  const merged = mergeMessages(
    view,
    snapshot.messages.map((body) => fromBody(body, snapshot.cursor)),
  );
  const cursor = Math.max(view.cursor, snapshot.cursor);
  if (merged === view && cursor === view.cursor && !view.stale) return view;
  return { ...merged, cursor, stale: false };
}

function fromHeader(header: MessageHeader): ChatMessage {
  return { ...header, revision: 1, content: null, updated_at: null, seq: null, asOf: null };
}

/** Apply stream frames (in order). Returns the same view when every frame was a duplicate. */
export function applyFrames(view: ConversationView, frames: readonly StreamFrame[]): ConversationView {
  let byId: Map<string, ChatMessage> | null = null;
  const added: string[] = [];
  let cursor = view.cursor;
  let stale = view.stale;
  for (const frame of frames) {
    if (frame.cursor <= cursor) continue; // already applied (a resumed stream, or a snapshot ahead of it)
    cursor = frame.cursor;
    const map = byId ?? view.byId;
    let message = map.get(frame.message_id);
    if (message !== undefined && message.asOf !== null && message.asOf >= frame.cursor) continue;
    const header = frame.message;
    const known = message !== undefined;
    if (message === undefined) {
      if (header === undefined || header.conversation_id !== view.conversationId) {
        stale = true; // a change to a message this view never saw: reload
        continue;
      }
      message = fromHeader(header);
    }
    const state = { stream: "", model: message.content, seq: message.seq, ended: false };
    let next: ChatMessage;
    try {
      const after = reduce(state, frame.event);
      next = { ...message, content: after.model, seq: after.seq, asOf: frame.cursor };
    } catch (error) {
      if (!(error instanceof AgentUERejectedError)) throw error;
      stale = true;
      continue;
    }
    if (header !== undefined) next = { ...next, status: header.status, task_id: header.task_id, purpose: header.purpose };
    if (frame.event["op"] === "error" && next.status === "streaming") next = { ...next, status: "failed" };
    byId ??= new Map(view.byId);
    byId.set(next.id, next);
    if (!known) added.push(next.id);
  }
  if (byId === null && added.length === 0 && cursor === view.cursor && stale === view.stale) return view;
  return { ...view, byId: byId ?? view.byId, order: added.length === 0 ? view.order : withNewIds(view.order, added), cursor, stale };
}

/** The messages in order. */
export function messagesOf(view: ConversationView): ChatMessage[] {
  const out: ChatMessage[] = [];
  for (const id of view.order) {
    const message = view.byId.get(id);
    if (message !== undefined) out.push(message);
  }
  return out;
}

/** The message as the server shape (for W2's components). */
export function toBody(message: ChatMessage): MessageBody {
  return {
    id: message.id,
    conversation_id: message.conversation_id,
    task_id: message.task_id,
    kind: message.kind,
    key: message.key,
    reply_to_message_id: message.reply_to_message_id,
    purpose: message.purpose,
    status: message.status,
    created_at: message.created_at,
    updated_at: message.updated_at ?? message.created_at,
    revision: message.revision,
    content: (message.content ?? { version: "1.1", biz: "chat", meta: {}, blocks: [] }) as unknown as JsonObject,
  };
}
