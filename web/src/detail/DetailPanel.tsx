/**
 * <DetailPanel>: the work conversation of the selected message's Task, laid out in parallel columns (see
 * `parallel.ts`), with an empty state and the `ledger-open` button (the ledger opens inside the panel).
 *
 * Finds the work conversation with `GET /v1/conversations?task_id=`, reads its snapshot, and re-reads both every
 * `pollMs` only while the Task runs (`running` from the page; without it: while any work message is streaming, or
 * while no work conversation has appeared yet after a first look says nothing). A new `taskId` starts a new visit:
 * the previous one's requests are aborted and their late answers dropped.
 * Must not do: write anything, or keep polling a Task that is not running.
 */

import type { ComponentChild, JSX } from "preact";
import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import { GateCard } from "../cards/GateCard";
import { HumanCard } from "../cards/HumanCard";
import { gateBlocks, isGateBlock, isHumanRequest } from "../cards/model";
import { LedgerView } from "../ledger/LedgerView";
import "./detail.css";
import { type Api, type ConversationBody, errorText, httpApi, type MessageBody, type SnapshotBody } from "./http";
import { actorLabel, layoutMessages } from "./parallel";
import "./theme.css";

export interface DetailPanelProps {
  /** The Task of the selected message; null: nothing selected. */
  readonly taskId: string | null;
  /** Whether the Task runs (its response message is streaming); omitted: judged from the work messages. */
  readonly running?: boolean;
  /** The user conversation the Task belongs to (the ledger's chart covers it). */
  readonly conversationId?: string | null;
  /** The page's message renderer (must render `data-testid="message"`); a small built-in one otherwise. */
  readonly renderMessage?: (message: MessageBody) => ComponentChild;
  readonly api?: Api;
  readonly pollMs?: number;
}

interface ConversationList {
  readonly data: readonly ConversationBody[];
}

type Load = { phase: "idle" } | { phase: "loading" } | { phase: "none" } | { phase: "ready"; conversation: ConversationBody; messages: MessageBody[] };

/** Merge a fresh snapshot into the current list: by id, the higher revision wins (unchanged objects are kept). */
export function mergeMessages(current: readonly MessageBody[], fresh: readonly MessageBody[]): MessageBody[] {
  const known = new Map(current.map((m) => [m.id, m] as const));
  const merged = fresh.map((m) => {
    const old = known.get(m.id);
    return old && old.revision >= m.revision ? old : m;
  });
  const ids = new Set(merged.map((m) => m.id));
  for (const m of current) if (!ids.has(m.id)) merged.push(m); // never drop what was shown
  return merged.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}

function textOf(block: Record<string, unknown>): string {
  const content = block["content"];
  if (typeof content === "string") return content;
  const text = block["text"];
  return typeof text === "string" ? text : "";
}

/** The built-in message renderer: text, tool calls folded, results, gates and questions as cards. */
export function DefaultMessage({ message, api }: { message: MessageBody; api?: Api }): JSX.Element {
  const raw: unknown = message.content["blocks"];
  const blocks = Array.isArray(raw) ? (raw as unknown[]).filter((b): b is Record<string, unknown> => typeof b === "object" && b !== null) : [];
  const cardApi = api ? { api } : {};
  return (
    <article
      class="w2-message"
      data-testid="message"
      data-message-id={message.id}
      data-role={message.purpose}
      data-author={`${message.kind}:${message.key}`}
      data-revision={String(message.revision)}
      data-task-id={message.task_id ?? ""}
      data-status={message.status}
    >
      {isHumanRequest(message) ? (
        <HumanCard message={message} {...cardApi} />
      ) : (
        blocks.map((block, index) => {
          const key = typeof block["id"] === "string" ? block["id"] : String(index);
          if (isGateBlock(block)) return null;
          switch (block["type"]) {
            case "text":
              return (
                <p class="w2-text" data-testid="message-text" key={key}>
                  {textOf(block)}
                </p>
              );
            case "tool":
              return (
                <details data-testid="tool-call" key={key}>
                  <summary>
                    Tool {String(block["name"] ?? "")} <span class="w2-meta">({String(block["status"] ?? "")})</span>
                  </summary>
                  <pre>{JSON.stringify(block["input"] ?? null, null, 2)}</pre>
                  {block["output"] !== undefined && <pre>{typeof block["output"] === "string" ? block["output"] : JSON.stringify(block["output"], null, 2)}</pre>}
                </details>
              );
            case "result":
              return (
                <pre data-testid="block-result" key={key}>
                  {typeof block["content"] === "string" ? block["content"] : JSON.stringify(block["content"], null, 2)}
                </pre>
              );
            default:
              return null;
          }
        })
      )}
      {gateBlocks(message).map((block) => (
        <GateCard key={String(block["id"])} message={message} block={block} {...cardApi} />
      ))}
      {message.status === "streaming" && <p class="w2-meta">working…</p>}
      {message.status === "failed" && <p class="w2-meta">failed</p>}
    </article>
  );
}

async function readWork(api: Api, taskId: string, signal: AbortSignal): Promise<{ conversation: ConversationBody; messages: readonly MessageBody[] } | null> {
  const list = await api.get<ConversationList>(`/v1/conversations?task_id=${encodeURIComponent(taskId)}`, signal);
  const conversation = list.data[0];
  if (!conversation) return null;
  const snapshot = await api.get<SnapshotBody>(`/v1/conversations/${encodeURIComponent(conversation.id)}/snapshot`, signal);
  return { conversation, messages: snapshot.messages };
}

/** The detail panel. */
export function DetailPanel({ taskId, running, conversationId, renderMessage, api = httpApi, pollMs = 1000 }: DetailPanelProps): JSX.Element {
  const [load, setLoad] = useState<Load>({ phase: taskId ? "loading" : "idle" });
  const [error, setError] = useState<string | null>(null);
  const [ledger, setLedger] = useState(false);
  const [tick, setTick] = useState(0);
  const [reads, setReads] = useState(0);
  const wasLive = useRef(false);

  // A new Task: a new visit (and back to the work view).
  useEffect(() => {
    setLoad({ phase: taskId ? "loading" : "idle" });
    setError(null);
    setLedger(false);
  }, [taskId]);

  const streaming = load.phase === "ready" && load.messages.some((m) => m.status === "streaming");
  const live = taskId !== null && (running ?? streaming);

  useEffect(() => {
    if (taskId === null) return;
    const controller = new AbortController();
    readWork(api, taskId, controller.signal)
      .then((found) => {
        if (controller.signal.aborted) return;
        setError(null);
        if (found === null) {
          setLoad({ phase: "none" });
          return;
        }
        setLoad((previous) => ({
          phase: "ready",
          conversation: found.conversation,
          messages: mergeMessages(previous.phase === "ready" && previous.conversation.id === found.conversation.id ? previous.messages : [], found.messages),
        }));
      })
      .catch((exc: unknown) => {
        if (!controller.signal.aborted) setError(errorText(exc));
      })
      .finally(() => {
        if (!controller.signal.aborted) setReads((n) => n + 1);
      });
    return () => controller.abort();
  }, [api, taskId, tick]);

  // Poll only while the Task runs: each re-read is scheduled once the previous one has answered.
  useEffect(() => {
    if (!live) return;
    const timer = setTimeout(() => setTick((n) => n + 1), pollMs);
    return () => clearTimeout(timer);
  }, [live, reads, pollMs]);

  // The Task just stopped running: one last read shows its final state.
  useEffect(() => {
    if (wasLive.current && !live && taskId !== null) setTick((n) => n + 1);
    wasLive.current = live;
  }, [live, taskId]);

  const groups = useMemo(() => (load.phase === "ready" ? layoutMessages(load.messages, Date.now()) : []), [load]);
  const render = renderMessage ?? ((m: MessageBody) => <DefaultMessage message={m} api={api} />);

  return (
    <section class="w2-detail" data-testid="detail-panel" aria-label="Task detail" data-task-id={taskId ?? ""}>
      {!(taskId !== null && ledger) && (
        <header>
          <h2>Work</h2>
          {taskId !== null && (
            <span class="w2-live" aria-live="polite">
              {live ? "Live" : load.phase === "ready" ? "Finished" : ""}
            </span>
          )}
          {taskId !== null && (
            <button type="button" class="w2-button" data-testid="ledger-open" onClick={() => setLedger(true)}>
              Ledger
            </button>
          )}
        </header>
      )}
      {error && (
        <p class="w2-error" role="alert">
          {error}
        </p>
      )}
      {taskId !== null && ledger ? (
        <LedgerView taskId={taskId} conversationId={conversationId ?? null} running={live} api={api} onClose={() => setLedger(false)} />
      ) : taskId === null ? (
        <p class="w2-empty" data-testid="detail-empty">
          Select a message to see the work behind it.
        </p>
      ) : load.phase === "loading" ? (
        <p class="w2-empty">Loading the work…</p>
      ) : load.phase === "none" || (load.phase === "ready" && load.messages.length === 0) ? (
        <p class="w2-empty" data-testid="detail-empty">
          {live ? "No work yet: it appears here as soon as the task starts a call." : "This task has no work conversation: its answer is all there is."}
        </p>
      ) : (
        <div class="w2-groups">
          {groups.map((group) => (
            <div
              key={group.key}
              class="w2-group"
              data-testid="parallel-group"
              data-columns={String(group.columns.length)}
              style={{ "--w2-columns": String(group.columns.length) }}
              role={group.columns.length > 1 ? "group" : undefined}
              aria-label={group.columns.length > 1 ? `${group.columns.length} calls side by side` : undefined}
              tabIndex={group.columns.length > 1 ? 0 : undefined /* a scrollable row is reachable by keyboard */}
            >
              {group.columns.map((column) => (
                <section key={column.actor} class="w2-column" data-testid="parallel-column" data-actor={column.actor} aria-label={actorLabel(column.actor)}>
                  <h3>{actorLabel(column.actor)}</h3>
                  {column.items.map((message) => (
                    <div key={message.id}>{render(message)}</div>
                  ))}
                </section>
              ))}
            </div>
          ))}
        </div>
      )}
    </section>
  );
}
