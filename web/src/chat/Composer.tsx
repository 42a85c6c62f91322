// The composer: a responder picker (Operators / Harnesses from /v1/actors) and a text area. Enter sends,
// Shift+Enter adds a line; the text is kept when sending fails. Follow-ups can be sent while work runs.
import type { ComponentChild } from "preact";
import { memo } from "preact/compat";
import { useState } from "preact/hooks";
import type { ActorBody } from "../api";

export interface ComposerProps {
  actors: ActorBody[];
  target: string;
  onTarget: (target: string) => void;
  onSend: (text: string) => Promise<void>;
  disabled?: boolean;
  /** Shown beside the responder picker (the app's mode control). */
  controls?: ComponentChild;
}

/** The picker's option value of an actor (`operator:router`). */
export function actorValue(actor: Pick<ActorBody, "kind" | "key">): string {
  return `${actor.kind}:${actor.key}`;
}

export function ActorPicker({ actors, target, onTarget }: Pick<ComposerProps, "actors" | "target" | "onTarget">) {
  const operators = actors.filter((actor) => actor.kind === "operator");
  const harnesses = actors.filter((actor) => actor.kind === "harness");
  const known = actors.some((actor) => actorValue(actor) === target);
  return (
    <label class="picker">
      <span class="label">Responder</span>
      <select data-testid="actor-picker" value={target} onChange={(event) => onTarget((event.currentTarget as HTMLSelectElement).value)}>
        {!known && <option value={target}>{target === "" ? "Loading responders…" : `${target} (offline)`}</option>}
        {operators.length > 0 && (
          <optgroup label="Operators">
            {operators.map((actor) => (
              <option key={actorValue(actor)} value={actorValue(actor)} title={actor.description}>
                {actor.display_name || actor.key}
              </option>
            ))}
          </optgroup>
        )}
        {harnesses.length > 0 && (
          <optgroup label="Harnesses">
            {harnesses.map((actor) => (
              <option key={actorValue(actor)} value={actorValue(actor)} title={actor.description}>
                {actor.display_name || actor.key}
              </option>
            ))}
          </optgroup>
        )}
      </select>
    </label>
  );
}

export const Composer = memo(function Composer({ actors, target, onTarget, onSend, disabled = false, controls }: ComposerProps) {
  const [text, setText] = useState("");
  const [sending, setSending] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const send = async () => {
    const question = text.trim();
    if (question === "" || sending || target === "" || disabled) return;
    setSending(true);
    setError(null);
    try {
      await onSend(question);
      setText("");
    } catch (failure) {
      setError(failure instanceof Error ? failure.message : String(failure));
    } finally {
      setSending(false);
    }
  };
  return (
    <form
      class="composer"
      onSubmit={(event) => {
        event.preventDefault();
        void send();
      }}
    >
      <div class="composer-pickers">
        <ActorPicker actors={actors} target={target} onTarget={onTarget} />
        {controls}
      </div>
      <div class="composer-row">
        <label class="visually-hidden" for="composer-input">
          Message
        </label>
        <textarea
          id="composer-input"
          data-testid="composer-input"
          rows={2}
          placeholder="Ask something… (Enter sends, Shift+Enter for a new line)"
          value={text}
          disabled={disabled}
          onInput={(event) => setText((event.currentTarget as HTMLTextAreaElement).value)}
          onKeyDown={(event) => {
            if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
              event.preventDefault();
              void send();
            }
          }}
        />
        <button type="submit" data-testid="composer-send" disabled={sending || disabled || text.trim() === "" || target === ""}>
          {sending ? "Sending…" : "Send"}
        </button>
      </div>
      {error !== null && (
        <p class="error" role="alert" data-testid="composer-error">
          {error}
        </p>
      )}
    </form>
  );
});
