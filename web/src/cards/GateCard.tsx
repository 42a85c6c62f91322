/**
 * <GateCard>: a harness permission request (gate) — what the tool wants to do, and Approve once / Always / Deny.
 *
 * Shown only to the asker: the card first reads `GET /v1/harness/calls/{call_id}`, which the server answers only to
 * the admin, the call's asker and the Task's responder (a browser user is never a responder); on 404/403 it renders
 * nothing. The answer goes to `POST /v1/harness/calls/{call_id}/gates/{gate_id}`; controls are disabled while it is on
 * its way, and a failure is shown (`card-error`) with the controls enabled again. A closed gate is read-only: its options as text, the chosen one marked, and the outcome.
 * Must not do: answer by itself, or show the controls to anyone the server would refuse.
 */

import type { JSX } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { type Api, HttpError, type MessageBody, errorText, httpApi } from "../detail/http";
import "../detail/theme.css";
import "./cards.css";
import { type GateAnswer, gateOf, gateOutcomeText, gateState } from "./model";
import { ReadOnlyOptions } from "./ReadOnlyOptions";

export interface GateCardProps {
  /** The harness message holding the gate block. */
  readonly message: MessageBody;
  /** The gate's `ask` block (one of `gateBlocks(message)`). */
  readonly block: Record<string, unknown>;
  /** Skip the asker check when the caller already knows (true: show; false: render nothing). */
  readonly asker?: boolean;
  readonly api?: Api;
}

type Visibility = "checking" | "visible" | "hidden";

const ANSWERS: readonly { answer: GateAnswer; label: string; testid: string; hint: string }[] = [
  { answer: "approve", label: "Approve once", testid: "gate-approve", hint: "Allow this once." },
  { answer: "always", label: "Always allow", testid: "gate-always", hint: "Allow it now and remember it." },
  { answer: "deny", label: "Deny", testid: "gate-deny", hint: "Do not allow it." },
];

/** The card for one gate of a harness call. */
export function GateCard({ message, block, asker, api = httpApi }: GateCardProps): JSX.Element | null {
  const gate = gateOf(block);
  const [visibility, setVisibility] = useState<Visibility>(asker === undefined ? "checking" : asker ? "visible" : "hidden");
  const [answered, setAnswered] = useState<GateAnswer | null>(null);
  const [submitting, setSubmitting] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const inFlight = useRef(false);
  const alive = useRef<AbortController | null>(null);

  useEffect(() => {
    const controller = new AbortController();
    alive.current = controller;
    return () => controller.abort();
  }, []);

  useEffect(() => {
    setAnswered(null);
    setError(null);
  }, [message.id, gate.blockId]);

  useEffect(() => {
    if (asker !== undefined) {
      setVisibility(asker ? "visible" : "hidden");
      return;
    }
    if (gate.callId === null) {
      setVisibility("hidden");
      return;
    }
    const controller = new AbortController();
    api
      .get<unknown>(`/v1/harness/calls/${encodeURIComponent(gate.callId)}`, controller.signal)
      .then(() => setVisibility("visible"))
      .catch((exc: unknown) => {
        if (controller.signal.aborted) return;
        // Not the asker: the server hides the call. Any other failure: show the card (the server still decides).
        const refused = exc instanceof HttpError && (exc.status === 404 || exc.status === 403);
        setVisibility(refused ? "hidden" : "visible");
      });
    return () => controller.abort();
  }, [api, asker, gate.callId]);

  if (visibility !== "visible") return null;

  // The block is the truth; a successful answer shows at once, until the block catches up.
  const shown = gate.status === "pending" && answered !== null ? { ...gate, status: "success" as const, value: answered } : gate;
  const state = gateState(shown, submitting);
  const pending = shown.status === "pending";
  const locked = !pending || submitting;
  const base = `gate-${message.id}-${gate.gateId}`.replace(/[^A-Za-z0-9_-]/g, "_");

  const answer = async (choice: GateAnswer) => {
    if (inFlight.current || !pending || gate.callId === null) return;
    inFlight.current = true;
    setSubmitting(true);
    setError(null);
    const signal = alive.current?.signal;
    try {
      const path = `/v1/harness/calls/${encodeURIComponent(gate.callId)}/gates/${encodeURIComponent(gate.gateId)}`;
      await api.post<unknown>(path, { answer: choice }, signal);
      if (!signal?.aborted) setAnswered(choice);
    } catch (exc) {
      if (!signal?.aborted) setError(errorText(exc));
    } finally {
      inFlight.current = false;
      if (!signal?.aborted) setSubmitting(false);
    }
  };

  return (
    <section
      class="w2-card"
      data-testid="gate-card"
      data-state={state}
      data-gate-id={gate.gateId}
      data-call-id={gate.callId ?? ""}
      aria-labelledby={`${base}-title`}
      aria-describedby={`${base}-summary`}
      aria-busy={submitting ? "true" : "false"}
    >
      <h3 id={`${base}-title`}>{gate.title}</h3>
      <p class="w2-summary" id={`${base}-summary`} data-testid="gate-summary">
        {gate.prompt || "The harness asks for permission."}
      </p>
      {pending ? (
        <div class="w2-actions" role="group" aria-label="Your decision">
          {ANSWERS.map((item) => (
            <button
              key={item.answer}
              type="button"
              class={`w2-button${item.answer === "deny" ? " danger" : item.answer === "approve" ? " primary" : ""}`}
              data-testid={item.testid}
              title={item.hint}
              disabled={locked}
              onClick={() => void answer(item.answer)}
            >
              {item.label}
            </button>
          ))}
        </div>
      ) : (
        <ReadOnlyOptions
          options={ANSWERS.map((item) => ({ value: item.answer, label: item.label }))}
          chosen={shown.status === "success" ? shown.value : null}
        />
      )}
      {!pending && (
        <p class="w2-outcome" data-testid="card-outcome">
          {gateOutcomeText(shown)}
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
