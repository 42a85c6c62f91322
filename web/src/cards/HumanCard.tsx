/**
 * <HumanCard>: a Human Ask (choices, choices + free text, free text) or Confirm (custom labels) in the page.
 *
 * Pending: the user answers (or dismisses: the button, or Escape inside the card); controls are disabled while the
 * reply is on its way; a failed reply keeps the input and shows why (`card-error`). Terminal: read-only, keeping the
 * options, the selection and the outcome (answered / dismissed / timeout / failed). The state shown is the newer
 * (higher revision) of the `message` prop and the reply the server returned.
 * Must not do: decide an outcome locally (only the server's answer changes the state), or answer for a timeout.
 */

import type { JSX } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { type Api, HttpError, type MessageBody, errorText, httpApi } from "../detail/http";
import "../detail/theme.css";
import "./cards.css";
import { askValue, cardState, newerMessage, outcomeText, type Question, questionOf } from "./model";
import { ReadOnlyOptions } from "./ReadOnlyOptions";

export interface HumanCardProps {
  /** A `human_request` message (its block is the question). */
  readonly message: MessageBody;
  /** Called with the question message the server returned after a reply (merge it by id and revision). */
  readonly onUpdate?: (message: MessageBody) => void;
  /** The HTTP client (tests pass their own). */
  readonly api?: Api;
}

interface ReplyBody {
  readonly status: string;
  readonly message: MessageBody;
}

interface QuestionBody {
  readonly message: MessageBody;
}

type Outcome = { outcome: "success"; value: string } | { outcome: "dismissed" };

function replyPath(question: Question): string {
  return `/v1/conversations/${encodeURIComponent(question.conversationId)}/tasks/${encodeURIComponent(
    question.taskId ?? "",
  )}/replies`;
}

function dueText(dueAt: string | null): string | null {
  if (!dueAt) return null;
  const due = new Date(dueAt);
  return Number.isNaN(due.getTime()) ? null : `Answer by ${due.toLocaleString()}`;
}

/** The card for one Human question. */
export function HumanCard({ message, onUpdate, api = httpApi }: HumanCardProps): JSX.Element | null {
  const [latest, setLatest] = useState<MessageBody | null>(null);
  const [choice, setChoice] = useState<string | null>(null);
  const [freeText, setFreeText] = useState("");
  const [submitting, setSubmitting] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const inFlight = useRef(false);
  const alive = useRef<AbortController | null>(null);

  useEffect(() => {
    const controller = new AbortController();
    alive.current = controller;
    return () => controller.abort();
  }, []);

  // Another question in the same place: nothing of the previous one's input carries over.
  const questionId = message.id;
  useEffect(() => {
    setLatest(null);
    setChoice(null);
    setFreeText("");
    setError(null);
  }, [questionId]);

  const current = newerMessage(message, latest);
  const question = questionOf(current);
  if (question === null) return null;
  const state = cardState(question, submitting);
  const pending = question.status === "pending";
  const locked = !pending || submitting;
  const base = `card-${question.messageId}`;

  const adopt = (updated: MessageBody) => {
    setLatest(updated);
    onUpdate?.(updated);
  };

  const send = async (reply: Outcome) => {
    if (inFlight.current || !pending) return;
    if (question.taskId === null) {
      setError("This question belongs to no task; it cannot be answered here.");
      return;
    }
    inFlight.current = true;
    setSubmitting(true);
    setError(null);
    const signal = alive.current?.signal;
    try {
      const body = { reply_to_message_id: question.messageId, ...reply };
      const answered = await api.post<ReplyBody>(replyPath(question), body, signal);
      if (signal?.aborted) return;
      adopt(answered.message);
    } catch (exc) {
      if (signal?.aborted) return;
      setError(errorText(exc));
      if (exc instanceof HttpError && exc.status === 409) {
        // Answered elsewhere, or timed out meanwhile: show the stored outcome.
        try {
          const stored = await api.get<QuestionBody>(`/v1/human/${encodeURIComponent(question.messageId)}`, signal);
          if (!signal?.aborted) adopt(stored.message);
        } catch {
          // keep the error shown; the stream will bring the state
        }
      }
    } finally {
      inFlight.current = false;
      if (!signal?.aborted) setSubmitting(false);
    }
  };

  const dismiss = () => void send({ outcome: "dismissed" });
  const onKeyDown = (event: KeyboardEvent) => {
    if (event.key === "Escape" && !locked) {
      event.preventDefault();
      event.stopPropagation();
      dismiss();
    }
  };

  const selected = pending ? choice : question.value;
  const typed = pending ? freeText : question.value !== null && !question.choices.some((c) => c.value === question.value) ? question.value : "";
  const value = askValue(question, choice, freeText);
  const testid = question.type === "confirm" ? "confirm-card" : "ask-card";
  const due = pending ? dueText(question.dueAt) : null;

  return (
    <section
      class="w2-card"
      data-testid={testid}
      data-state={state}
      data-message-id={question.messageId}
      aria-labelledby={`${base}-title`}
      aria-describedby={`${base}-prompt`}
      aria-busy={submitting ? "true" : "false"}
      onKeyDown={onKeyDown}
    >
      <h3 id={`${base}-title`}>{question.title}</h3>
      <p class="w2-prompt" id={`${base}-prompt`}>
        {question.prompt}
      </p>
      {question.type === "ask" ? (
        <form
          onSubmit={(event) => {
            event.preventDefault();
            if (value !== null) void send({ outcome: "success", value });
          }}
        >
          {question.choices.length > 0 && (
            <fieldset disabled={locked}>
              <legend>Choose one</legend>
              {question.choices.map((c, index) => (
                <div class="w2-choice" key={c.value}>
                  <input
                    type="radio"
                    id={`${base}-choice-${index}`}
                    name={`${base}-choice`}
                    value={c.value}
                    data-testid="ask-choice"
                    disabled={locked}
                    checked={selected === c.value}
                    onChange={() => {
                      setChoice(c.value);
                    }}
                  />
                  <label for={`${base}-choice-${index}`} class={!pending && selected === c.value ? "w2-chosen" : ""}>
                    {c.label}
                    {c.description && <small>{c.description}</small>}
                  </label>
                </div>
              ))}
            </fieldset>
          )}
          {question.allowOther && (
            <div>
              <label class="w2-text-label" for={`${base}-text`}>
                {question.choices.length > 0 ? "Or write your own answer" : "Your answer"}
              </label>
              <textarea
                id={`${base}-text`}
                data-testid="ask-free-text"
                value={typed}
                readOnly={!pending}
                disabled={submitting}
                onInput={(event) => {
                  const text = (event.currentTarget as HTMLTextAreaElement).value;
                  setFreeText(text);
                  if (text.trim()) setChoice(null);
                }}
                onKeyDown={(event) => {
                  if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && value !== null && !locked) {
                    event.preventDefault();
                    void send({ outcome: "success", value });
                  }
                }}
              />
            </div>
          )}
          {pending && (
            <div class="w2-actions">
              <button
                type="submit"
                class="w2-button primary"
                data-testid="card-submit"
                disabled={locked || value === null}
              >
                {submitting ? "Sending…" : "Send answer"}
              </button>
              <button type="button" class="w2-button" data-testid="card-dismiss" disabled={locked} onClick={dismiss}>
                Dismiss
              </button>
            </div>
          )}
        </form>
      ) : (
        pending ? (
          <div class="w2-actions" role="group" aria-label="Your decision">
            <button
              type="button"
              class="w2-button primary"
              data-testid="confirm-accept"
              disabled={locked}
              onClick={() => void send({ outcome: "success", value: "accepted" })}
            >
              {question.confirmLabel}
            </button>
            <button
              type="button"
              class="w2-button"
              data-testid="confirm-decline"
              disabled={locked}
              onClick={() => void send({ outcome: "success", value: "declined" })}
            >
              {question.declineLabel}
            </button>
            <button type="button" class="w2-button" data-testid="card-dismiss" disabled={locked} onClick={dismiss}>
              Dismiss
            </button>
          </div>
        ) : (
          <ReadOnlyOptions
            options={[
              { value: "accepted", label: question.confirmLabel },
              { value: "declined", label: question.declineLabel },
            ]}
            chosen={question.status === "success" ? question.value : null}
          />
        )
      )}
      {due && <p class="w2-due">{due}</p>}
      {!pending && (
        <p class="w2-outcome" data-testid="card-outcome">
          {outcomeText(question)}
        </p>
      )}
      {error && (
        <p class="w2-error" role="alert" data-testid="card-error">
          {error}
        </p>
      )}
    </section>
  );
}
