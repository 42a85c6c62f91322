// The server's JSON shapes the page reads (see /openapi.json of `loopd up`). Types only.
import type { JsonObject } from "../agentue";

export type ActorKind = "user" | "operator" | "harness";
export type MessagePurpose = "input" | "response" | "human_request" | "human_reply" | "output";
export type MessageStatus = "streaming" | "completed" | "failed" | "cancelled" | "expired";

/** A conversation (`GET /v1/conversations/{id}`). */
export interface ConversationBody {
  id: string;
  name: string;
  actor_kind: ActorKind;
  actor_key: string;
  task_id: string | null;
  created_at: string;
  updated_at: string;
  /** Written by a background run after the first question ("" until then; absent from older servers). */
  title?: string;
  summary?: string;
  /** For a fork ("retry from here", "edit and resend"): its parent conversation and the message chosen there. */
  forked_from?: ForkOrigin | null;
  /** The mode its built-in harness calls start in (`PUT …/mode`); null: each harness's own (absent: older servers). */
  mode?: string | null;
}

/** Where a forked conversation came from. */
export interface ForkOrigin {
  conversation_id: string;
  message_id: string;
  mode: "retry" | "edit";
}

/** A message without content (the `message` of a stream's start and end frames). */
export interface MessageHeader {
  id: string;
  conversation_id: string;
  task_id: string | null;
  kind: ActorKind;
  key: string;
  reply_to_message_id: string | null;
  purpose: MessagePurpose;
  status: MessageStatus;
  created_at: string;
}

/** A message with its content (an AgentUE model) and revision. */
export interface MessageBody extends MessageHeader {
  revision: number;
  content: JsonObject;
  updated_at: string;
}

export interface ConversationList {
  data: ConversationBody[];
  next_after: string | null;
}

export interface SnapshotBody {
  conversation: ConversationBody;
  messages: MessageBody[];
  /** The content is current through this cursor; resume the stream after it. */
  cursor: number;
}

/** A live responder for the picker (`GET /v1/actors`). */
export interface ActorBody {
  kind: "operator" | "harness";
  key: string;
  display_name: string;
  description: string;
  /** The modes a conversation can set for it (a built-in harness: build, plan); empty or absent: none. */
  modes?: string[];
  /** Its own mode, used when the conversation sets none. */
  mode?: string | null;
}

export interface ActorList {
  data: ActorBody[];
}

/** The answer to a JSON chat request (`POST /v1/conversations/{id}/messages`). */
export interface ChatAccepted {
  task_id: string;
  conversation_id: string;
  input: MessageBody;
  response: MessageBody;
  /** The conversation cursor just before this question. */
  cursor: number;
}

export interface MeBody {
  kind: string;
  key: string;
  trusted: boolean;
}

/** One frame of a conversation stream: `id:` is `cursor`, `data:` the rest. */
export interface StreamFrame {
  cursor: number;
  message_id: string;
  seq: number;
  event: JsonObject;
  /** On start and end: the message's header (who wrote it, purpose, task, status). */
  message?: MessageHeader;
}
