// The actions under a finished message: "Retry from here" on an answer, "Edit and resend" (an inline editor) on
// your question. Both fork the conversation (the server keeps the original); the app opens the fork.
// Must not do: call the server (the `onFork` callback does).
import { useEffect, useRef, useState } from "preact/hooks";
import type { ForkMode } from "../api";
import type { ChatMessage } from "./store";

export type ForkHandler = (messageId: string, mode: ForkMode, text?: string) => Promise<void>;

/** The plain text of a message's text blocks (what the editor starts from). */
export function messageText(message: ChatMessage): string {
  const parts: string[] = [];
  for (const block of message.content?.blocks ?? []) {
    const record = block as Record<string, unknown>;
    if (record["type"] === "text" && typeof record["content"] === "string") parts.push(record["content"]);
  }
  return parts.join("\n\n");
}

/** Whether a message offers an action: a finished answer (retry) or a question you asked (edit). */
export function forkModeOf(message: ChatMessage): ForkMode | null {
  if (message.status === "streaming") return null;
  if (message.purpose === "response") return "retry";
  if (message.purpose === "input" && message.kind === "user") return "edit";
  return null;
}

export function MessageActions({ message, onFork }: { message: ChatMessage; onFork: ForkHandler }) {
  const mode = forkModeOf(message);
  const [editing, setEditing] = useState(false);
  const [text, setText] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const editor = useRef<HTMLTextAreaElement>(null);

  useEffect(() => {
    if (editing) editor.current?.focus();
  }, [editing]);

  if (mode === null) return null;

  const run = async (text?: string) => {
    setBusy(true);
    setError(null);
    try {
      await onFork(message.id, mode, text);
      setEditing(false);
    } catch (failure) {
      setError(failure instanceof Error ? failure.message : String(failure));
    } finally {
      setBusy(false);
    }
  };

  if (mode === "retry") {
    return (
      <div class="message-actions">
        <button type="button" class="link" data-testid="retry-from-here" disabled={busy} aria-label="Retry from here: ask this question again in a new conversation" onClick={() => void run()}>
          {busy ? "Retrying…" : "Retry from here"}
        </button>
        {error !== null && <span class="error" role="alert">{error}</span>}
      </div>
    );
  }
  if (!editing) {
    return (
      <div class="message-actions">
        <button
          type="button"
          class="link"
          data-testid="edit-and-resend"
          aria-label="Edit and resend this question in a new conversation"
          onClick={() => {
            setText(messageText(message));
            setEditing(true);
          }}
        >
          Edit and resend
        </button>
      </div>
    );
  }
  const send = () => {
    if (text.trim() !== "" && !busy) void run(text);
  };
  return (
    <form
      class="message-edit"
      data-testid="edit-form"
      onSubmit={(event) => {
        event.preventDefault();
        send();
      }}
    >
      <textarea
        ref={editor}
        aria-label="Edit your question"
        data-testid="edit-text"
        value={text}
        rows={3}
        onInput={(event) => setText((event.target as HTMLTextAreaElement).value)}
        onKeyDown={(event) => {
          if (event.key === "Escape") setEditing(false);
          if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
            event.preventDefault();
            send();
          }
        }}
      />
      <div class="message-actions">
        <button type="submit" data-testid="edit-send" disabled={busy || text.trim() === ""}>
          {busy ? "Sending…" : "Resend"}
        </button>
        <button type="button" class="link" onClick={() => setEditing(false)}>
          Cancel
        </button>
        {error !== null && <span class="error" role="alert">{error}</span>}
      </div>
    </form>
  );
}
