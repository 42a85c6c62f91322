// One chat message: author, badge, blocks; human questions as W2's HumanCard, gates as W2's GateCard.
// Memoized: it re-renders only when its message (a new object on every change), badge or selection changes.
import { memo } from "preact/compat";
import type { MessageBody } from "../api";
import { GateCard, HarnessQuestionCard, HumanCard, isHarnessQuestionBlock } from "../cards";
import { Blocks, isGateBlock } from "./Blocks";
import { type ForkHandler, MessageActions } from "./MessageActions";
import { BADGE_TEXT, type BadgeStatus } from "./status";
import { replyText } from "./reply";
import { type ChatMessage, toBody } from "./store";

export interface MessageViewProps {
  message: ChatMessage;
  badge: BadgeStatus | null;
  selected: boolean;
  /** The display name of the message's author (from the actors list), when known. */
  authorName: string;
  /** Select the message (its Task goes to the detail panel); null: not selectable (inside the detail panel). */
  onSelect: ((id: string) => void) | null;
  onHumanUpdate: (body: MessageBody) => void;
  /** "Retry from here" / "Edit and resend" (a fork of the conversation); absent: no such actions. */
  onFork?: ForkHandler | null;
  /** For a `human_reply`: the question it answers (its labels name the outcome), when loaded. */
  replyTo?: ChatMessage | undefined;
}

/** The status badge (`status-badge`, `data-status`). */
export function StatusBadge({ status }: { status: BadgeStatus }) {
  return (
    <span class={`badge badge-${status}`} data-testid="status-badge" data-status={status} role="status">
      {BADGE_TEXT[status]}
    </span>
  );
}

function HumanReply({ message, request }: { message: ChatMessage; request: ChatMessage | undefined }) {
  return <div class="human-reply">{replyText(message, request)}</div>;
}

// HH:MM in local time, by hand: locale formatting (Intl) costs tens of milliseconds on a page's first use.
function timeOf(iso: string): string {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return "";
  return `${String(date.getHours()).padStart(2, "0")}:${String(date.getMinutes()).padStart(2, "0")}`;
}

export const MessageView = memo(function MessageView({ message, badge, selected, authorName, onSelect, onHumanUpdate, onFork = null, replyTo }: MessageViewProps) {
  const role = message.purpose;
  const mine = message.kind === "user";
  const body = message.purpose === "human_request" || hasGates(message) ? toBody(message) : null;
  const select = () => onSelect?.(message.id);
  return (
    <article
      class={`message role-${role}${mine ? " mine" : ""}${selected ? " selected" : ""}`}
      data-testid="message"
      data-message-id={message.id}
      data-role={role}
      data-author={`${message.kind}:${message.key}`}
      data-revision={message.revision}
      data-task-id={message.task_id ?? undefined}
      data-status={message.status}
      aria-label={`${mine ? "You" : authorName}${badge !== null ? `, ${BADGE_TEXT[badge]}` : ""}`}
    >
      <header class="message-head">
        <span class="author">{mine ? "You" : authorName}</span>
        <time class="muted" dateTime={message.created_at}>
          {timeOf(message.created_at)}
        </time>
        {badge !== null && <StatusBadge status={badge} />}
        {message.task_id !== null && !mine && onSelect !== null && (
          <button
            type="button"
            class="link details-button"
            aria-pressed={selected}
            aria-label={`Show the work behind this ${role === "response" ? "answer" : "message"}`}
            onClick={select}
          >
            {selected ? "Showing details" : "Details"}
          </button>
        )}
      </header>
      <div class="message-body">
        {message.purpose === "human_request" && body !== null ? (
          <HumanCard message={body} onUpdate={(update) => onHumanUpdate(update as unknown as MessageBody)} />
        ) : message.purpose === "human_reply" ? (
          <HumanReply message={message} request={replyTo} />
        ) : (
          <>
            <Blocks
              model={message.content}
              live={message.status === "streaming"}
              renderGate={
                body === null
                  ? undefined
                  : (block) => {
                      const raw = block as unknown as Record<string, unknown>;
                      return isHarnessQuestionBlock(raw) ? <HarnessQuestionCard message={body} block={raw} /> : <GateCard message={body} block={raw} />;
                    }
              }
            />
          </>
        )}
        {message.content === null && message.status === "streaming" && <div class="muted">…</div>}
      </div>
      {onFork !== null && <MessageActions message={message} onFork={onFork} />}
    </article>
  );
});

function hasGates(message: ChatMessage): boolean {
  return message.kind === "harness" && (message.content?.blocks ?? []).some(isGateBlock);
}
