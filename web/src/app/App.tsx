// The page shell: three panes (conversations, chat, detail) side by side, or as tabs on a narrow screen.
// State: the conversation list, the open conversation (useConversation), the responders (useActors), the chosen
// responder (remembered in localStorage) and the selected message (whose Task the detail panel shows).
// Must not do: talk to the server except through ../api.
import { useCallback, useEffect, useMemo, useState } from "preact/hooks";
import type { ComponentChild } from "preact";
import { type ConversationBody, type MessageBody, createConversation, getConversation, listConversations, renameConversation, sendMessage } from "../api";
import { type ForkAccepted, type ForkMode, forkConversation, setConversationMode } from "../api";
import { ModeControl } from "../chat/ModeControl";
import { ActorPicker, Composer, actorValue } from "../chat/Composer";
import { ConversationList, conversationTitle } from "../chat/ConversationList";
import { MessageList } from "../chat/MessageList";
import { MessageView } from "../chat/MessageView";
import { badgeOf } from "../chat/status";
import { fromBody, messagesOf } from "../chat/store";
import { DetailPanel } from "../detail";
import { memo } from "preact/compat";
import { useActors } from "./useActors";
import { useConversation } from "./useConversation";
import { authorLabel } from "../chat/author";

export type Pane = "conversations" | "chat" | "detail";
/** The detail panel re-renders only when its props change (not on every streamed frame of the chat). */
const Detail = memo(DetailPanel);
const TARGET_KEY = "loopd.target";
const CONVERSATION_KEY = "loopd.conversation";

function readStorage(key: string): string | null {
  try {
    return localStorage.getItem(key);
  } catch {
    return null;
  }
}

const pendingWrites = new Map<string, string>();
let writeTimer: ReturnType<typeof setTimeout> | null = null;

/** Remember a choice, a little later: the first localStorage write of a page can take a long task by itself. */
function writeStorage(key: string, value: string): void {
  pendingWrites.set(key, value);
  writeTimer ??= setTimeout(() => {
    writeTimer = null;
    for (const [name, text] of pendingWrites) {
      try {
        localStorage.setItem(name, text);
      } catch {
        // storage may be disabled: the choice just isn't remembered
      }
    }
    pendingWrites.clear();
  }, 1500);
}

/** The conversation id in the location hash (`#c=<id>`), if any. */
export function hashConversation(hash: string): string | null {
  const match = /^#c=([^&]+)$/.exec(hash);
  return match === null ? null : decodeURIComponent(match[1] as string);
}

const noop = () => undefined;

export function App() {
  const [conversations, setConversations] = useState<ConversationBody[]>([]);
  const [nextAfter, setNextAfter] = useState<string | null>(null);
  const [listError, setListError] = useState<string | null>(null);
  const [activeId, setActiveId] = useState<string | null>(() =>
    typeof location === "undefined" ? null : hashConversation(location.hash) ?? readStorage(CONVERSATION_KEY),
  );
  const [pane, setPane] = useState<Pane>("chat");
  const [selectedId, setSelectedId] = useState<string | null>(null);
  const [target, setTarget] = useState<string>(() => readStorage(TARGET_KEY) ?? "");
  const { actors, error: actorsError } = useActors();
  const { view, connection, error: streamError, mergeBodies } = useConversation(activeId);

  // The conversation list (first page): at start, and again when the page becomes visible (other tabs may have
  // started conversations; a failed first load is retried).
  useEffect(() => {
    let controller = new AbortController();
    let loadedAt = 0;
    let loaded = false; // until one load succeeds, each one is "the first" (paging, the default conversation)
    const load = () => {
      const first = !loaded;
      controller.abort();
      controller = new AbortController();
      const { signal } = controller;
      loadedAt = Date.now();
      listConversations(undefined, signal).then(
        (page) => {
          loaded = true;
          setListError(null);
          setConversations((known) => [...page.data, ...known.filter((c) => !page.data.some((fresh) => fresh.id === c.id))]);
          if (first) setNextAfter(page.next_after);
          setActiveId((current) => {
            if (current !== null && page.data.some((c) => c.id === current)) return current;
            if (current !== null && (!first || hashConversation(location.hash) === current)) return current;
            return page.data[0]?.id ?? null;
          });
        },
        (failure: Error) => {
          if (!signal.aborted) setListError(failure.message);
        },
      );
    };
    load();
    const onVisible = () => {
      if (document.visibilityState === "visible" && Date.now() - loadedAt > 5000) load();
    };
    document.addEventListener("visibilitychange", onVisible);
    return () => {
      controller.abort();
      document.removeEventListener("visibilitychange", onVisible);
    };
  }, []);

  // Remember the open conversation (hash + storage); follow hash changes (back/forward).
  useEffect(() => {
    if (activeId === null) return;
    writeStorage(CONVERSATION_KEY, activeId);
    const hash = `#c=${encodeURIComponent(activeId)}`;
    if (location.hash !== hash) history.replaceState(null, "", hash);
  }, [activeId]);
  useEffect(() => {
    const onHash = () => {
      const id = hashConversation(location.hash);
      if (id !== null) setActiveId(id);
    };
    addEventListener("hashchange", onHash);
    return () => removeEventListener("hashchange", onHash);
  }, []);

  // The chosen responder: remembered; defaults to the first operator (the Router) once the list arrives.
  useEffect(() => {
    if (actors.length === 0) return;
    if (target === "" || !actors.some((actor) => actorValue(actor) === target)) {
      const preferred = actors.find((actor) => actor.kind === "operator" && actor.key === "router") ?? actors[0];
      if (preferred !== undefined && target === "") setTarget(actorValue(preferred));
    }
  }, [actors, target]);
  const chooseTarget = useCallback((value: string) => {
    setTarget(value);
    writeStorage(TARGET_KEY, value);
  }, []);

  const selectConversation = useCallback((id: string) => {
    setActiveId(id);
    setSelectedId(null);
    setPane("chat");
  }, []);

  const create = useCallback(async () => {
    try {
      const created = await createConversation();
      setConversations((list) => [created, ...list.filter((c) => c.id !== created.id)]);
      selectConversation(created.id);
      setListError(null);
      return created;
    } catch (failure) {
      setListError(failure instanceof Error ? failure.message : String(failure));
      throw failure;
    }
  }, [selectConversation]);

  const rename = useCallback(async (id: string, name: string) => {
    const renamed = await renameConversation(id, name);
    setConversations((list) => list.map((c) => (c.id === id ? renamed : c)));
  }, []);

  const more = useCallback(async () => {
    if (nextAfter === null) return;
    try {
      const page = await listConversations(nextAfter);
      setConversations((list) => [...list, ...page.data.filter((c) => !list.some((known) => known.id === c.id))]);
      setNextAfter(page.next_after);
    } catch (failure) {
      setListError(failure instanceof Error ? failure.message : String(failure));
    }
  }, [nextAfter]);

  const send = useCallback(
    async (text: string) => {
      let conversationId = activeId;
      if (conversationId === null) conversationId = (await create()).id;
      const accepted = await sendMessage(conversationId, target, text);
      if (accepted.conversation_id === conversationId) {
        mergeBodies([accepted.input, accepted.response], accepted.cursor);
        setSelectedId(accepted.response.id);
      }
      setConversations((list) => {
        const index = list.findIndex((c) => c.id === conversationId);
        if (index <= 0) return list;
        const moved = list[index] as ConversationBody;
        return [moved, ...list.slice(0, index), ...list.slice(index + 1)];
      });
      void fetchTitle(conversationId, (fresh) => setConversations((list) => list.map((c) => (c.id === fresh.id ? fresh : c))));
    },
    [activeId, target, create, mergeBodies],
  );

  // Retry from here / edit and resend: the server forks the conversation; open the fork (the original stays).
  const [forkedFrom, setForkedFrom] = useState<ReadonlyMap<string, ForkAccepted["forked_from"]>>(new Map());
  const fork = useCallback(
    async (messageId: string, mode: ForkMode, text?: string) => {
      if (activeId === null) return;
      const forked = await forkConversation(activeId, messageId, mode, text);
      setForkedFrom((known) => new Map(known).set(forked.conversation.id, forked.forked_from));
      setConversations((list) => [forked.conversation, ...list.filter((c) => c.id !== forked.conversation.id)]);
      selectConversation(forked.conversation.id);
      setSelectedId(forked.response.id);
    },
    [activeId, selectConversation],
  );

  // The conversation's mode (of the harness it talks to): stored on the conversation, used from its next question.
  const changeMode = useCallback(
    async (mode: string) => {
      if (activeId === null) return;
      const changed = await setConversationMode(activeId, mode);
      setConversations((list) => list.map((c) => (c.id === changed.id ? changed : c)));
    },
    [activeId],
  );

  // "New conversation" leads to the question: the composer takes the focus (keyboard users type at once).
  const createClicked = useCallback(
    () =>
      void create().then(
        () => requestAnimationFrame(() => document.querySelector<HTMLTextAreaElement>("#composer-input")?.focus()),
        noop,
      ),
    [create],
  );
  const moreClicked = useCallback(() => void more(), [more]);
  const onHumanUpdate = useCallback((body: MessageBody) => mergeBodies([body], null), [mergeBodies]);
  const selectMessage = useCallback((id: string) => {
    setSelectedId(id);
    setPane("detail");
  }, []);

  // The detail panel follows the selected message's Task, else the newest answer's.
  const ordered = useMemo(() => (view === null ? [] : messagesOf(view)), [view?.byId, view?.order]);
  const selected = useMemo(() => {
    if (view === null) return null;
    const chosen = selectedId === null ? undefined : view.byId.get(selectedId);
    if (chosen !== undefined && chosen.task_id !== null) return chosen;
    for (let index = ordered.length - 1; index >= 0; index -= 1) {
      const message = ordered[index];
      if (message !== undefined && message.purpose === "response" && message.task_id !== null) return message;
    }
    return null;
  }, [view, selectedId, ordered]);
  const taskId = selected?.task_id ?? null;
  const taskRunning = useMemo(() => {
    if (view === null || taskId === null) return false;
    for (const message of view.byId.values()) if (message.task_id === taskId && message.purpose === "response") return message.status === "streaming";
    return false;
  }, [view, taskId]);

  const renderDetailMessage = useCallback(
    (body: unknown): ComponentChild => {
      const message = fromBody(body as MessageBody, null);
      const names = new Map(actors.map((actor) => [actorValue(actor), actor.display_name || actor.key]));
      return (
        <MessageView
          key={message.id}
          message={message}
          badge={badgeOf(message, "open", new Set())}
          selected={false}
          authorName={authorLabel(message, names.get(`${message.kind}:${message.key}`) ?? message.key)}
          onSelect={null}
          onHumanUpdate={noop}
        />
      );
    },
    [actors],
  );

  const active = conversations.find((c) => c.id === activeId) ?? null;
  const activeMode = active?.mode ?? null;
  const opened = active !== null;
  // Built once per change of what it shows, so the memoised composer is not re-rendered by every streamed frame.
  const modeControl = useMemo(
    () => (
      <ModeControl
        actor={actors.find((actor) => actorValue(actor) === target)}
        mode={activeMode}
        onChange={opened ? changeMode : null}
      />
    ),
    [actors, target, activeMode, opened, changeMode],
  );
  // A fork names its parent: known from the fork just made here, or from the conversation list (forks made before).
  const origin = (activeId !== null ? forkedFrom.get(activeId) : undefined) ?? active?.forked_from ?? null;
  const tab = (id: Pane, label: string) => (
    <button
      type="button"
      role="tab"
      id={`pane-tab-${id}`}
      data-testid={`pane-tab-${id}`}
      aria-selected={pane === id}
      aria-controls={`pane-${id}`}
      class={pane === id ? "active" : ""}
      onClick={() => setPane(id)}
    >
      {label}
    </button>
  );

  return (
    <div class={`app pane-${pane}`}>
      <header class="topbar">
        <h1>loopd</h1>
        <div class="tabs" role="tablist" aria-label="Panes">
          {tab("conversations", "Conversations")}
          {tab("chat", "Chat")}
          {tab("detail", "Details")}
        </div>
      </header>
      <div class="panes">
        <section id="pane-conversations" class="pane pane-left" aria-label="Conversations">
          <ConversationList
            conversations={conversations}
            activeId={activeId}
            hasMore={nextAfter !== null}
            error={listError}
            onSelect={selectConversation}
            onCreate={createClicked}
            onRename={rename}
            onMore={moreClicked}
          />
        </section>
        <main id="pane-chat" class="pane pane-center" aria-label="Chat">
          <div class="pane-head">
            <h2 class="chat-title">{active !== null ? conversationTitle(active) : activeId === null ? "No conversation open" : "Conversation"}</h2>
            {connection === "reconnecting" && <span class="muted" role="status">Reconnecting…</span>}
          </div>
          {activeId !== null && origin !== null && (
            <p class="muted fork-note" data-testid="fork-note">
              {origin.mode === "edit" ? "Edited and resent" : "Retried"} in a new conversation;{" "}
              <button type="button" class="link" data-testid="fork-parent" onClick={() => selectConversation(origin.conversation_id)}>
                open the original
              </button>
            </p>
          )}
          {streamError !== null && (
            <p class="error" role="alert">
              {streamError}
            </p>
          )}
          {actorsError !== null && actors.length === 0 && (
            <p class="error" role="alert">
              Cannot list responders: {actorsError}
            </p>
          )}
          {view !== null ? (
            <MessageList
              view={view}
              connection={connection}
              actors={actors}
              selectedId={selected?.id ?? null}
              onSelect={selectMessage}
              onHumanUpdate={onHumanUpdate}
              onFork={fork}
            />
          ) : (
            <div class="message-list">
              <p class="empty muted">Start a new conversation, pick a responder and ask a question.</p>
            </div>
          )}
          <Composer
            actors={actors}
            target={target}
            onTarget={chooseTarget}
            onSend={send}
            controls={modeControl}
          />
        </main>
        <aside id="pane-detail" class="pane pane-right" aria-label="Details">
          <Detail taskId={taskId} running={taskRunning} conversationId={activeId} renderMessage={renderDetailMessage as never} />
        </aside>
      </div>
    </div>
  );
}

export { ActorPicker };

/** A conversation's title is written in the background after its first question: look for it a few times. */
async function fetchTitle(id: string, found: (conversation: ConversationBody) => void): Promise<void> {
  for (let attempt = 0; attempt < 5; attempt += 1) {
    await new Promise((resolve) => setTimeout(resolve, 1500 * (attempt + 1)));
    try {
      const conversation = await getConversation(id);
      if ((conversation.title ?? "") !== "") {
        found(conversation);
        return;
      }
    } catch {
      return; // gone or not readable: nothing to show
    }
  }
}
