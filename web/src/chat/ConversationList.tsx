// The conversations pane: the list (newest first), "New conversation", and rename in place (Enter saves,
// Escape cancels). Must not do: fetch (the app passes the actions in).
import { memo } from "preact/compat";
import { useEffect, useRef, useState } from "preact/hooks";
import type { ConversationBody } from "../api";

export interface ConversationListProps {
  conversations: ConversationBody[];
  activeId: string | null;
  hasMore: boolean;
  error: string | null;
  onSelect: (id: string) => void;
  onCreate: () => void;
  onRename: (id: string, name: string) => Promise<void>;
  onMore: () => void;
}

/** The title shown for a conversation: the name its owner gave it, else the generated title, else its date. */
export function conversationTitle(conversation: ConversationBody): string {
  if (conversation.name.trim() !== "") return conversation.name;
  const generated = (conversation.title ?? "").trim();
  if (generated !== "") return generated;
  const date = new Date(conversation.created_at);
  if (Number.isNaN(date.getTime())) return "New conversation";
  // By hand, not Intl: locale formatting costs tens of milliseconds on a page's first use.
  const two = (n: number) => String(n).padStart(2, "0");
  return `Conversation of ${date.getFullYear()}-${two(date.getMonth() + 1)}-${two(date.getDate())} ${two(date.getHours())}:${two(date.getMinutes())}`;
}

function RenameInput({ conversation, onDone, onRename }: { conversation: ConversationBody; onDone: (keyboard: boolean) => void; onRename: ConversationListProps["onRename"] }) {
  const [value, setValue] = useState(conversation.name);
  const [error, setError] = useState<string | null>(null);
  const [saving, setSaving] = useState(false);
  const input = useRef<HTMLInputElement>(null);
  useEffect(() => {
    input.current?.focus();
    input.current?.select();
  }, []);
  const save = async () => {
    setSaving(true);
    try {
      await onRename(conversation.id, value.trim());
      onDone(true);
    } catch (failure) {
      setError(failure instanceof Error ? failure.message : String(failure));
      setSaving(false);
    }
  };
  return (
    <div class="rename">
      <input
        ref={input}
        data-testid="conversation-title-input"
        aria-label="Conversation name"
        value={value}
        maxLength={200}
        disabled={saving}
        onInput={(event) => setValue((event.currentTarget as HTMLInputElement).value)}
        onKeyDown={(event) => {
          if (event.key === "Enter") {
            event.preventDefault();
            void save();
          } else if (event.key === "Escape") {
            event.preventDefault();
            onDone(true);
          }
        }}
        onBlur={() => {
          if (!saving && error === null) onDone(false);
        }}
      />
      {error !== null && (
        <p class="error" role="alert">
          {error}
        </p>
      )}
    </div>
  );
}

export const ConversationList = memo(function ConversationList({ conversations, activeId, hasMore, error, onSelect, onCreate, onRename, onMore }: ConversationListProps) {
  const [renaming, setRenaming] = useState<string | null>(null);
  // A rename ended from the keyboard (Enter, Escape) gives the focus back to its rename button, not to the page.
  const list = useRef<HTMLElement>(null);
  const [refocus, setRefocus] = useState<string | null>(null);
  useEffect(() => {
    if (refocus === null || renaming !== null) return;
    const button = [...(list.current?.querySelectorAll<HTMLElement>("[data-testid=rename-conversation]") ?? [])].find(
      (candidate) => candidate.dataset["conversationId"] === refocus,
    );
    button?.focus();
    setRefocus(null);
  }, [refocus, renaming]);
  const renameDone = (id: string) => (keyboard: boolean) => {
    setRenaming(null);
    if (keyboard) setRefocus(id);
  };
  return (
    <nav class="conversations" aria-label="Conversations" ref={list}>
      <div class="pane-head">
        <h2>Conversations</h2>
        <button type="button" class="primary" data-testid="new-conversation" onClick={onCreate}>
          New conversation
        </button>
      </div>
      {error !== null && (
        <p class="error" role="alert">
          {error}
        </p>
      )}
      <ul data-testid="conversation-list" class="conversation-list">
        {conversations.map((conversation) => {
          const active = conversation.id === activeId;
          return (
            <li key={conversation.id} class={active ? "active" : ""}>
              {renaming === conversation.id ? (
                <RenameInput conversation={conversation} onRename={onRename} onDone={renameDone(conversation.id)} />
              ) : (
                <div class="conversation-row">
                  <button
                    type="button"
                    class="conversation-item"
                    data-testid="conversation-item"
                    data-conversation-id={conversation.id}
                    aria-current={active ? "true" : undefined}
                    title={conversation.summary || undefined}
                    onClick={() => onSelect(conversation.id)}
                  >
                    {conversationTitle(conversation)}
                    {conversation.summary ? (
                      <span class="conversation-summary muted" data-testid="conversation-summary">
                        {conversation.summary}
                      </span>
                    ) : null}
                  </button>
                  <button
                    type="button"
                    class="icon"
                    data-testid="rename-conversation"
                    data-conversation-id={conversation.id}
                    aria-label={`Rename ${conversationTitle(conversation)}`}
                    title="Rename"
                    onClick={() => setRenaming(conversation.id)}
                  >
                    ✎
                  </button>
                </div>
              )}
            </li>
          );
        })}
      </ul>
      {conversations.length === 0 && error === null && <p class="muted empty">No conversations yet.</p>}
      {hasMore && (
        <button type="button" class="link" onClick={onMore}>
          Load more
        </button>
      )}
    </nav>
  );
});
