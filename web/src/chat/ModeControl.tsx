// The mode of the harness a conversation talks to (e.g. plan = read-only tools, build = every tool): shown next to
// the responder picker when that responder has modes, switched with `PUT /v1/conversations/{id}/mode`. The choice
// belongs to the conversation and applies from its next question on (a running answer keeps its mode).
// Must not do: talk to the server (the app passes `onChange`).
import { useState } from "preact/hooks";
import type { ActorBody } from "../api";

export interface ModeControlProps {
  /** The chosen responder; nothing is shown when it has no modes. */
  actor: ActorBody | undefined;
  /** The conversation's mode (null: the responder's own, `actor.mode`). */
  mode: string | null;
  /** Null when no conversation is open (the control is then disabled). */
  onChange: ((mode: string) => Promise<void>) | null;
}

/** The mode a question sent now runs in: the conversation's, else the responder's own. */
export function effectiveMode(actor: Pick<ActorBody, "mode"> | undefined, mode: string | null): string | null {
  return mode ?? actor?.mode ?? null;
}

export function ModeControl({ actor, mode, onChange }: ModeControlProps) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const modes = actor?.modes ?? [];
  if (actor === undefined || modes.length === 0) return null;
  const current = effectiveMode(actor, mode) ?? modes[0] ?? "";
  const change = async (value: string) => {
    if (onChange === null || value === current) return;
    setBusy(true);
    setError(null);
    try {
      await onChange(value);
    } catch (failure) {
      setError(failure instanceof Error ? failure.message : String(failure));
    } finally {
      setBusy(false);
    }
  };
  return (
    <label class="picker mode-control" title="Applies from the next question on; an answer already running keeps its mode">
      <span class="label">Mode</span>
      <select
        data-testid="mode-control"
        value={current}
        disabled={busy || onChange === null}
        onChange={(event) => void change((event.currentTarget as HTMLSelectElement).value)}
      >
        {modes.map((name) => (
          <option key={name} value={name}>
            {name === actor.mode && mode === null ? `${name} (default)` : name}
          </option>
        ))}
      </select>
      {error !== null && (
        <span class="error" role="alert" data-testid="mode-error">
          {error}
        </span>
      )}
    </label>
  );
}
