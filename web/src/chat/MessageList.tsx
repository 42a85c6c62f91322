// The chat's messages: only the newest `window` are mounted (more on scrolling up or on "Show earlier"), so a
// conversation with thousands of messages opens fast; the list sticks to the bottom while new text streams in,
// unless the reader scrolled up. Must not do: fetch.
import { useCallback, useEffect, useLayoutEffect, useMemo, useRef, useState } from "preact/hooks";
import type { ActorBody, MessageBody } from "../api";
import { MessageView } from "./MessageView";
import { badgeOf, type Connection, waitingTasks } from "./status";
import { type ConversationView, messagesOf } from "./store";

export const WINDOW_STEP = 60;

export interface MessageListProps {
  view: ConversationView;
  connection: Connection;
  actors: ActorBody[];
  selectedId: string | null;
  onSelect: (id: string) => void;
  onHumanUpdate: (body: MessageBody) => void;
}

export function MessageList({ view, connection, actors, selectedId, onSelect, onHumanUpdate }: MessageListProps) {
  const [limit, setLimit] = useState(WINDOW_STEP);
  const scroller = useRef<HTMLDivElement>(null);
  const sentinel = useRef<HTMLDivElement>(null);
  const stick = useRef(true);
  const messages = useMemo(() => messagesOf(view), [view.byId, view.order]);
  const waiting = useMemo(() => waitingTasks(view), [view.byId]);
  const names = useMemo(() => {
    const map = new Map<string, string>();
    for (const actor of actors) map.set(`${actor.kind}:${actor.key}`, actor.display_name || actor.key);
    return map;
  }, [actors]);
  const hidden = Math.max(0, messages.length - limit);
  const shown = hidden > 0 ? messages.slice(hidden) : messages;

  useEffect(() => setLimit(WINDOW_STEP), [view.conversationId]);

  const showEarlier = useCallback(() => {
    const element = scroller.current;
    const before = element === null ? 0 : element.scrollHeight - element.scrollTop;
    setLimit((value) => value + WINDOW_STEP);
    // keep the reader's place once the earlier messages are mounted
    requestAnimationFrame(() => {
      if (element !== null) element.scrollTop = element.scrollHeight - before;
    });
  }, []);

  // Scrolling to the top mounts the earlier messages.
  useEffect(() => {
    const target = sentinel.current;
    if (target === null || hidden === 0 || typeof IntersectionObserver === "undefined") return;
    const observer = new IntersectionObserver((entries) => {
      if (entries.some((entry) => entry.isIntersecting) && !stick.current) showEarlier();
    });
    observer.observe(target);
    return () => observer.disconnect();
  }, [hidden, showEarlier]);

  const onScroll = useCallback(() => {
    const element = scroller.current;
    if (element !== null) stick.current = element.scrollHeight - element.scrollTop - element.clientHeight < 48;
  }, []);

  useLayoutEffect(() => {
    const element = scroller.current;
    if (element !== null && stick.current) element.scrollTop = element.scrollHeight;
  });

  return (
    <div class="message-list" ref={scroller} onScroll={onScroll} aria-live="polite" aria-relevant="additions" tabIndex={0} aria-label="Messages">
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
          authorName={names.get(`${message.kind}:${message.key}`) ?? message.key}
          onSelect={onSelect}
          onHumanUpdate={onHumanUpdate}
        />
      ))}
    </div>
  );
}
