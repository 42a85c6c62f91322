// What a message's status badge says, from the message, the stream's connection and pending questions. Pure.
import { isRefBlock } from "../agentue";
import type { ChatMessage, ConversationView } from "./store";

export type BadgeStatus = "connecting" | "running" | "waiting" | "reconnecting" | "completed" | "failed";
export type Connection = "idle" | "connecting" | "open" | "reconnecting" | "failed";

export const BADGE_TEXT: Record<BadgeStatus, string> = {
  connecting: "connecting…",
  running: "running",
  waiting: "waiting for you",
  reconnecting: "reconnecting…",
  completed: "completed",
  failed: "failed",
};

/** Whether the message carries a pending gate (an `ask` block `gate/...` with status pending). */
export function hasPendingGate(message: ChatMessage): boolean {
  for (const block of message.content?.blocks ?? []) {
    if (!isRefBlock(block) && block.type === "ask" && block.id.startsWith("gate/") && block["status"] === "pending") return true;
  }
  return false;
}

/** The Tasks that wait for the user: an open human question, or a pending gate, of theirs is in the view. */
export function waitingTasks(view: ConversationView): Set<string> {
  const waiting = new Set<string>();
  for (const message of view.byId.values()) {
    if (message.task_id === null || message.status !== "streaming") continue;
    if (message.purpose === "human_request" || hasPendingGate(message)) waiting.add(message.task_id);
  }
  return waiting;
}

/** The badge of a message (null for messages without one: the user's own, human questions and replies). */
export function badgeOf(message: ChatMessage, connection: Connection, waiting: ReadonlySet<string>): BadgeStatus | null {
  if (message.kind === "user" || message.purpose === "human_request" || message.purpose === "human_reply") return null;
  if (message.status === "completed") return "completed";
  if (message.status !== "streaming") return "failed";
  if (connection === "reconnecting" || connection === "failed") return "reconnecting";
  if (connection === "connecting" || connection === "idle") return "connecting";
  if (message.task_id !== null && waiting.has(message.task_id)) return "waiting";
  if (hasPendingGate(message)) return "waiting";
  return "running";
}
