// What a `human_reply` message says in the chat: the outcome in the words of the question it answers (a Confirm's
// own labels, e.g. "Continue" / "Finish here", instead of the stored `accepted` / `declined`). Pure.
import { isRefBlock } from "../agentue";
import { questionOf } from "../cards/model";
import { type ChatMessage, toBody } from "./store";

/** The line shown for `reply` (a `human_reply` message); `request` is the question it answers, when loaded. */
export function replyText(reply: ChatMessage, request: ChatMessage | undefined): string {
  const block = reply.content?.blocks[0];
  if (block === undefined || isRefBlock(block)) return "";
  if (block["outcome"] === "dismissed") return "You dismissed the question.";
  const raw = block["value"];
  const value = typeof raw === "string" ? raw : "";
  const question = request === undefined || request.content === null ? null : questionOf(toBody(request));
  if (question !== null && question.type === "confirm" && (value === "accepted" || value === "declined")) {
    return `You answered: ${value === "accepted" ? question.confirmLabel : question.declineLabel}`;
  }
  return `You answered: ${value}`;
}
