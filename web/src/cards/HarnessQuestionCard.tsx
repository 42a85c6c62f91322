/**
 * <HarnessQuestionCard>: a question the harness asks mid-turn (its ask_user tool) — an `ask` block with id
 * `question/<request_id>` in a harness message: the question, its choices, and a free-text answer.
 *
 * Shown only to the asker (like <GateCard>: `GET /v1/harness/calls/{call_id}` answers only the admin, the call's
 * asker and the Task's responder; on 404/403 it renders nothing). The answer goes to
 * `POST /v1/harness/calls/{call_id}/questions/{request_id}` with `{text}`; controls are disabled while it is on its
 * way; a failure is shown with the controls enabled again. A closed question is read-only: its answer, or that the
 * deadline passed. Must not do: answer by itself, or show the controls to anyone the server would refuse.
 */

import type { JSX } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { type Api, HttpError, type MessageBody, errorText, httpApi } from "../detail/http";
import "../detail/theme.css";
import "./cards.css";

export const QUESTION_PREFIX = "question/";

export interface HarnessQuestionCardProps {
  readonly message: MessageBody;
  /** The question's `ask` block (`question/<request_id>`). */
  readonly block: Record<string, unknown>;
  /** Skip the asker check when the caller already knows (true: show; false: render nothing). */
  readonly asker?: boolean;
  readonly api?: Api;
}

/** True for an ask_user question block: an `ask` whose id starts with `question/`. */
export function isHarnessQuestionBlock(block: Record<string, unknown>): boolean {
  return block["type"] === "ask" && typeof block["id"] === "string" && block["id"].startsWith(QUESTION_PREFIX);
}

function choicesOf(block: Record<string, unknown>): string[] {
  const raw = block["choices"];
  if (!Array.isArray(raw)) return [];
  return raw.map((c) => (typeof c === "object" && c !== null && typeof (c as Record<string, unknown>)["value"] === "string" ? String((c as Record<string, unknown>)["value"]) : "")).filter((c) => c !== "");
}

/** The card for one question of a harness call. */
export function HarnessQuestionCard({ message, block, asker, api = httpApi }: HarnessQuestionCardProps): JSX.Element | null {
  const blockId = typeof block["id"] === "string" ? block["id"] : "";
  const requestId = blockId.slice(QUESTION_PREFIX.length);
  const callId = typeof block["call_id"] === "string" && block["call_id"] ? block["call_id"] : null;
  const status = typeof block["status"] === "string" ? block["status"] : "pending";
  const [visible, setVisible] = useState<boolean | null>(asker === undefined ? null : asker);
  const [answered, setAnswered] = useState<string | null>(null);
  const [text, setText] = useState("");
  const [submitting, setSubmitting] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const inFlight = useRef(false);

  useEffect(() => {
    if (asker !== undefined) {
      setVisible(asker);
      return;
    }
    if (callId === null) {
      setVisible(false);
      return;
    }
    const controller = new AbortController();
    api
      .get<unknown>(`/v1/harness/calls/${encodeURIComponent(callId)}`, controller.signal)
      .then(() => setVisible(true))
      .catch((exc: unknown) => {
        if (controller.signal.aborted) return;
        setVisible(!(exc instanceof HttpError && (exc.status === 404 || exc.status === 403)));
      });
    return () => controller.abort();
  }, [api, asker, callId]);

  if (visible !== true) return null;
  const value = answered ?? (status === "success" && typeof block["value"] === "string" ? block["value"] : null);
  const pending = status === "pending" && answered === null;

  const answer = async (reply: string) => {
    const trimmed = reply.trim();
    if (inFlight.current || !pending || callId === null || trimmed === "") return;
    inFlight.current = true;
    setSubmitting(true);
    setError(null);
    try {
      await api.post<unknown>(`/v1/harness/calls/${encodeURIComponent(callId)}/questions/${encodeURIComponent(requestId)}`, { text: trimmed });
      setAnswered(trimmed);
    } catch (exc) {
      setError(errorText(exc));
    } finally {
      inFlight.current = false;
      setSubmitting(false);
    }
  };

  return (
    <section class="w2-card" data-testid="harness-question-card" data-state={pending ? (submitting ? "submitting" : "pending") : status === "timeout" ? "timeout" : "answered"} data-request-id={requestId} data-message-id={message.id}>
      <h3>{typeof block["title"] === "string" ? block["title"] : "The harness asks"}</h3>
      <p class="w2-summary" data-testid="harness-question">
        {typeof block["prompt"] === "string" ? block["prompt"] : ""}
      </p>
      {pending ? (
        <div class="w2-actions" role="group" aria-label="Your answer">
          {choicesOf(block).map((choice) => (
            <button key={choice} type="button" class="w2-button" data-testid="harness-question-choice" disabled={submitting} onClick={() => void answer(choice)}>
              {choice}
            </button>
          ))}
          <input
            type="text"
            aria-label="Your answer"
            data-testid="harness-question-text"
            value={text}
            maxLength={4000}
            disabled={submitting}
            onInput={(event) => setText((event.currentTarget as HTMLInputElement).value)}
            onKeyDown={(event) => {
              if (event.key === "Enter") {
                event.preventDefault();
                void answer(text);
              }
            }}
          />
          <button type="button" class="w2-button primary" data-testid="harness-question-send" disabled={submitting || text.trim() === ""} onClick={() => void answer(text)}>
            Answer
          </button>
        </div>
      ) : (
        <p class="w2-outcome" data-testid="card-outcome">
          {value !== null ? `Answered: ${value}` : status === "timeout" ? "No answer before the deadline" : "Closed"}
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
