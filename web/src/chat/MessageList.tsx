// The chat's messages: only the newest `window` are mounted (more on scrolling up or on "Show earlier"), so a
// conversation with thousands of messages opens fast. The scroller is a reversed flex column: its origin is the
// bottom, so it opens at the newest message and stays there while text streams in (no scroll code, no forced
// layout per frame), and mounting earlier messages above does not move what the reader sees. Must not do: fetch.
import { useCallback, useEffect, useMemo, useRef, useState } from "preact/hooks";
import type { ActorBody, MessageBody } from "../api";
import type { ForkHandler } from "./MessageActions";
import { MessageView } from "./MessageView";
import { badgeOf, type Connection, waitingTasks } from "./status";
import { type ConversationView, messagesOf } from "./store";
import { authorLabel } from "./author";

/** Messages mounted at first (the newest fill a tall screen twice), and added on each step back. */
export const WINDOW_FIRST = 24;
export const WINDOW_STEP = 40;

export interface MessageListProps {
  view: ConversationView;
  connection: Connection;
  actors: ActorBody[];
  selectedId: string | null;
  onSelect: (id: string) => void;
  onHumanUpdate: (body: MessageBody) => void;
  /** Retry / edit and resend on a message (see MessageActions); absent: none. */
  onFork?: ForkHandler | null;
}

export function MessageList({ view, connection, actors, selectedId, onSelect, onHumanUpdate, onFork = null }: MessageListProps) {
  const [limit, setLimit] = useState(WINDOW_FIRST);
  const scroller = useRef<HTMLDivElement>(null);
  const sentinel = useRef<HTMLDivElement>(null);
  const messages = useMemo(() => messagesOf(view), [view.byId, view.order]);
  const waiting = useMemo(() => waitingTasks(view), [view.byId]);
  const names = useMemo(() => {
    const map = new Map<string, string>();
    for (const actor of actors) map.set(`${actor.kind}:${actor.key}`, actor.display_name || actor.key);
    return map;
  }, [actors]);
  const hidden = Math.max(0, messages.length - limit);
  const shown = hidden > 0 ? messages.slice(hidden) : messages;

  useEffect(() => setLimit(WINDOW_FIRST), [view.conversationId]);

  const showEarlier = useCallback(() => setLimit((value) => value + WINDOW_STEP), []);

  // Scrolling to the top mounts the earlier messages.
  useEffect(() => {
    const target = sentinel.current;
    if (target === null || hidden === 0 || typeof IntersectionObserver === "undefined") return;
    const observer = new IntersectionObserver((entries) => {
      if (entries.some((entry) => entry.isIntersecting)) showEarlier();
    });
    observer.observe(target);
    return () => observer.disconnect();
  }, [hidden, showEarlier]);

  // The reader's own new question brings the view back to the newest message.
  const last = messages[messages.length - 1];
  const lastMine = last !== undefined && last.kind === "user" ? last.id : null;
  useEffect(() => {
    if (lastMine !== null && scroller.current !== null) scroller.current.scrollTop = 0;
  }, [lastMine]);

  return (
    <div class="message-list" ref={scroller} tabIndex={0} aria-label="Messages">
      <div class="message-stack" aria-live="polite" aria-relevant="additions">
        <div ref={sentinel} />
        {hidden > 0 && (
          <button type="button" class="show-earlier" onClick={showEarlier} data-testid="show-earlier">
            Show earlier messages ({hidden})
          </button>
        )}
        {shown.length === 0 && <p class="empty muted">No messages yet. Pick a responder below and ask something.</p>}
        {shown.map((message) => (
          <MessageView
            key={message.id}
            message={message}
            badge={badgeOf(message, connection, waiting)}
            selected={message.id === selectedId}
            authorName={authorLabel(message, names.get(`${message.kind}:${message.key}`) ?? message.key)}
            onSelect={onSelect}
            onHumanUpdate={onHumanUpdate}
            onFork={onFork}
            replyTo={message.purpose === "human_reply" && message.reply_to_message_id !== null ? view.byId.get(message.reply_to_message_id) : undefined}
          />
        ))}
      </div>
    </div>
  );
}
