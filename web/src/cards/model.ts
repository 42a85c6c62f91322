/**
 * Card models (pure): what a Human question block (`ask` / `confirm` of a `human_request` message) and a harness
 * gate block (`ask` with id `gate/<id>` in a harness message) say, read defensively from message content, and the
 * card states the page shows.
 *
 * Must not do: I/O or rendering.
 */

import type { MessageBody } from "../detail/http";

export interface Choice {
  readonly value: string;
  readonly label: string;
  readonly description?: string;
}

/** A question's stored outcome (`status` of its block). */
export type QuestionStatus = "pending" | "success" | "dismissed" | "timeout" | "failure";

/** `data-state` of an ask / confirm card. */
export type CardState = "pending" | "submitting" | "answered" | "dismissed" | "timeout" | "failed";

/** `data-state` of a gate card. */
export type GateState = "pending" | "submitting" | "approved" | "denied" | "timeout" | "failed";

export type GateAnswer = "approve" | "always" | "deny";

/** A Human question as its block shows it. */
export interface Question {
  readonly messageId: string;
  readonly conversationId: string;
  readonly taskId: string | null;
  readonly type: "ask" | "confirm";
  readonly title: string;
  readonly prompt: string;
  readonly choices: readonly Choice[];
  readonly allowOther: boolean;
  readonly confirmLabel: string;
  readonly declineLabel: string;
  readonly status: QuestionStatus;
  readonly value: string | null;
  readonly reason: string | null;
  readonly dueAt: string | null;
}

/** A harness permission request (gate) as its block shows it. */
export interface Gate {
  readonly blockId: string;
  readonly gateId: string;
  readonly callId: string | null;
  readonly title: string;
  readonly prompt: string;
  readonly status: QuestionStatus;
  readonly value: string | null;
  readonly reason: string | null;
}

export const QUESTION_BLOCK_ID = "question";
export const GATE_PREFIX = "gate/";
const STATUSES: readonly QuestionStatus[] = ["pending", "success", "dismissed", "timeout", "failure"];

type Block = Record<string, unknown>;

function text(value: unknown, fallback = ""): string {
  return typeof value === "string" ? value : fallback;
}

function status(value: unknown): QuestionStatus {
  return STATUSES.includes(value as QuestionStatus) ? (value as QuestionStatus) : "pending";
}

function choices(value: unknown): Choice[] {
  if (!Array.isArray(value)) return [];
  const out: Choice[] = [];
  for (const raw of value as unknown[]) {
    if (typeof raw !== "object" || raw === null) continue;
    const item = raw as Block;
    const choiceValue = item["value"];
    if (typeof choiceValue !== "string" || choiceValue === "") continue;
    const description = item["description"];
    out.push({
      value: choiceValue,
      label: text(item["label"], choiceValue) || choiceValue,
      ...(typeof description === "string" && description ? { description } : {}),
    });
  }
  return out;
}

function blocksOf(message: Pick<MessageBody, "content">): Block[] {
  const blocks: unknown = (message.content as Record<string, unknown> | null | undefined)?.["blocks"];
  return Array.isArray(blocks) ? (blocks as unknown[]).filter((b): b is Block => typeof b === "object" && b !== null && !Array.isArray(b)) : [];
}

/** True for a `human_request` message (a question to the user). */
export function isHumanRequest(message: Pick<MessageBody, "purpose">): boolean {
  return message.purpose === "human_request";
}

/** The question a `human_request` message holds, or null when its content has no ask/confirm block. */
export function questionOf(message: MessageBody): Question | null {
  const blocks = blocksOf(message);
  const block =
    blocks.find((b) => b["id"] === QUESTION_BLOCK_ID && (b["type"] === "ask" || b["type"] === "confirm")) ??
    blocks.find((b) => b["type"] === "ask" || b["type"] === "confirm");
  if (!block) return null;
  const type = block["type"] === "confirm" ? "confirm" : "ask";
  const value = block["value"];
  return {
    messageId: message.id,
    conversationId: message.conversation_id,
    taskId: message.task_id,
    type,
    title: text(block["title"], "Question"),
    prompt: text(block["prompt"]),
    choices: type === "ask" ? choices(block["choices"]) : [],
    allowOther: type === "ask" && block["allow_other"] === true,
    confirmLabel: text(block["confirm_label"]) || "Confirm",
    declineLabel: text(block["decline_label"]) || "Decline",
    status: status(block["status"]),
    value: typeof value === "string" ? value : value == null ? null : JSON.stringify(value),
    reason: typeof block["reason"] === "string" ? block["reason"] : null,
    dueAt: typeof block["due_at"] === "string" ? block["due_at"] : null,
  };
}

/** True for a gate block: an `ask` whose id starts with `gate/`. */
export function isGateBlock(block: Block): boolean {
  return block["type"] === "ask" && typeof block["id"] === "string" && block["id"].startsWith(GATE_PREFIX);
}

/** The gate blocks of a harness message, in block order (none for other messages). */
export function gateBlocks(message: MessageBody): Block[] {
  return message.kind === "harness" ? blocksOf(message).filter(isGateBlock) : [];
}

/** A gate block read as a `Gate`. */
export function gateOf(block: Block): Gate {
  const blockId = text(block["id"]);
  const value = block["value"];
  return {
    blockId,
    gateId: blockId.slice(GATE_PREFIX.length),
    callId: typeof block["call_id"] === "string" && block["call_id"] ? block["call_id"] : null,
    title: text(block["title"], "Permission needed") || "Permission needed",
    prompt: text(block["prompt"]),
    status: status(block["status"]),
    value: typeof value === "string" ? value : null,
    reason: typeof block["reason"] === "string" ? block["reason"] : null,
  };
}

/** A question's card state: its stored outcome, or `submitting` while a reply is on its way. */
export function cardState(question: Pick<Question, "status">, submitting: boolean): CardState {
  switch (question.status) {
    case "success":
      return "answered";
    case "dismissed":
      return "dismissed";
    case "timeout":
      return "timeout";
    case "failure":
      return "failed";
    default:
      return submitting ? "submitting" : "pending";
  }
}

/** A gate's card state: approve / always → approved, deny → denied; timeout (the harness denies) and failure
 * (the call ended first) are their own states. */
export function gateState(gate: Pick<Gate, "status" | "value">, submitting: boolean): GateState {
  switch (gate.status) {
    case "success":
      return gate.value === "deny" ? "denied" : "approved";
    case "timeout":
      return "timeout";
    case "failure":
    case "dismissed":
      return "failed";
    default:
      return submitting ? "submitting" : "pending";
  }
}

/** The value an ask would send: the selected choice, else the trimmed free text (when allowed); null if none. */
export function askValue(question: Pick<Question, "choices" | "allowOther">, choice: string | null, freeText: string): string | null {
  if (choice !== null && question.choices.some((c) => c.value === choice)) return choice;
  const trimmed = freeText.trim();
  return question.allowOther && trimmed ? trimmed : null;
}

/** The words for a terminal question's outcome (what the read-only card says). */
export function outcomeText(question: Question): string {
  switch (question.status) {
    case "success": {
      if (question.type === "confirm") {
        return question.value === "accepted" ? `Answered: ${question.confirmLabel}` : `Answered: ${question.declineLabel}`;
      }
      const chosen = question.choices.find((c) => c.value === question.value);
      return `Answered: ${chosen ? chosen.label : (question.value ?? "")}`;
    }
    case "dismissed":
      return "Dismissed";
    case "timeout":
      return "Timed out without an answer";
    case "failure":
      return question.reason ? `Closed: ${question.reason}` : "Closed without an answer";
    default:
      return "Waiting for your answer";
  }
}

/** The words for a gate's outcome. */
export function gateOutcomeText(gate: Gate): string {
  switch (gate.status) {
    case "success":
      return gate.value === "always" ? "Approved (always)" : gate.value === "deny" ? "Denied" : "Approved once";
    case "timeout":
      return "Timed out: denied";
    case "failure":
    case "dismissed":
      return gate.reason ? `Closed: ${gate.reason}` : "Closed without an answer";
    default:
      return "Waiting for your decision";
  }
}

/** The newer of two versions of one message (higher revision wins; ties keep `current`). */
export function newerMessage(current: MessageBody, other: MessageBody | null): MessageBody {
  if (other === null || other.id !== current.id) return current;
  return other.revision > current.revision ? other : current;
}
