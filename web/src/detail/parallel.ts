/**
 * Parallel layout of a work conversation (pure): messages grouped by overlapping [created_at, updated_at]
 * intervals, one column per actor inside each group.
 *
 * Rules: two intervals that overlap or touch (start <= the other's end) are in one group, and overlaps chain (A
 * overlaps B, B overlaps C → one group even when A and C do not meet). A message without a usable timestamp is a
 * group of its own. Groups are ordered by the position of their first message in the input (the server's id
 * order = creation order); each group's columns are its actors in first-seen order, and an actor's messages stack
 * in its column in input order. Every new group starts again at the left.
 *
 * Must not do: I/O, or read the clock (the caller passes `now` for messages still streaming).
 */

import { authorPart } from "../chat/author";

/** A closed time interval in epoch milliseconds. */
export interface Interval {
  readonly start: number;
  readonly end: number;
}

/** One actor's column inside a group. */
export interface ParallelColumn<T> {
  readonly actor: string;
  readonly items: readonly T[];
}

/** One group of messages whose intervals overlap (or a message standing alone). */
export interface ParallelGroup<T> {
  /** Stable key: the position (in the input) of the group's first item. */
  readonly key: number;
  readonly columns: readonly ParallelColumn<T>[];
  /** The group's span, or null for an untimed item. */
  readonly span: Interval | null;
}

/** How to read an item's actor and interval. */
export interface LayoutOptions<T> {
  readonly actorOf: (item: T) => string;
  readonly intervalOf: (item: T) => Interval | null;
}

/** The fields of a server message the layout reads. */
export interface LayoutMessage {
  readonly kind: string;
  readonly key: string;
  readonly status?: string;
  readonly created_at?: string | null;
  readonly updated_at?: string | null;
  readonly content?: unknown;
}

function parseTime(text: string | null | undefined): number | null {
  if (typeof text !== "string" || text === "") return null;
  const value = Date.parse(text);
  return Number.isFinite(value) ? value : null;
}

/**
 * A message's interval: [created_at, updated_at]; a message still `streaming` lasts at least until `now`
 * (when given). Null when created_at is missing or unreadable; an unreadable or earlier updated_at is the start.
 */
export function messageInterval(message: LayoutMessage, now?: number): Interval | null {
  const start = parseTime(message.created_at);
  if (start === null) return null;
  const updated = parseTime(message.updated_at);
  let end = updated !== null && updated > start ? updated : start;
  if (message.status === "streaming" && now !== undefined && Number.isFinite(now) && now > end) end = now;
  return { start, end };
}

/**
 * A message's column: `kind:key`, plus `/<effect_key>` when the message's `content.meta.effect_key` names the
 * call it shows (the engine sets it on every harness output, so parallel calls to one harness get one column each).
 */
export function messageActor(message: LayoutMessage): string {
  const base = `${message.kind}:${message.key}`;
  const part = authorPart(message);
  if (part !== null) return `${base}/${part}`; // an operator's part (LongHorizon's manager, executor, auditor)
  const content = message.content;
  const meta = typeof content === "object" && content !== null ? (content as Record<string, unknown>)["meta"] : undefined;
  const effect = typeof meta === "object" && meta !== null ? (meta as Record<string, unknown>)["effect_key"] : undefined;
  return typeof effect === "string" && effect !== "" ? `${base}/${effect}` : base;
}

/** A readable column heading for an actor string from `messageActor`: `assistant · work/0`. */
export function actorLabel(actor: string): string {
  const colon = actor.indexOf(":");
  const rest = colon >= 0 ? actor.slice(colon + 1) : actor;
  const slash = rest.indexOf("/");
  return slash >= 0 ? `${rest.slice(0, slash)} · ${rest.slice(slash + 1)}` : rest;
}

function columnsOf<T>(items: readonly T[], actorOf: (item: T) => string): ParallelColumn<T>[] {
  const byActor = new Map<string, T[]>();
  for (const item of items) {
    const actor = actorOf(item);
    const column = byActor.get(actor);
    if (column) column.push(item);
    else byActor.set(actor, [item]);
  }
  return [...byActor].map(([actor, stacked]) => ({ actor, items: stacked }));
}

/** Lay `items` (in creation order) out in parallel groups; see the module rules. */
export function parallelGroups<T>(items: readonly T[], options: LayoutOptions<T>): ParallelGroup<T>[] {
  interface Entry {
    readonly index: number;
    readonly interval: Interval;
  }
  const timed: Entry[] = [];
  const groups: { key: number; indices: number[]; span: Interval | null }[] = [];
  items.forEach((item, index) => {
    const interval = options.intervalOf(item);
    if (interval === null || !Number.isFinite(interval.start) || !Number.isFinite(interval.end)) {
      groups.push({ key: index, indices: [index], span: null });
    } else {
      const end = interval.end >= interval.start ? interval.end : interval.start;
      timed.push({ index, interval: { start: interval.start, end } });
    }
  });
  // Sweep by start time: an interval starting at or before the running end joins (and may extend) the group.
  const sorted = [...timed].sort((a, b) => a.interval.start - b.interval.start || a.index - b.index);
  let current: { key: number; indices: number[]; span: { start: number; end: number } } | null = null;
  for (const entry of sorted) {
    if (current !== null && entry.interval.start <= current.span.end) {
      current.indices.push(entry.index);
      current.key = Math.min(current.key, entry.index);
      current.span.end = Math.max(current.span.end, entry.interval.end);
    } else {
      current = { key: entry.index, indices: [entry.index], span: { ...entry.interval } };
      groups.push(current);
    }
  }
  groups.sort((a, b) => a.key - b.key);
  return groups.map((group) => {
    const members = [...group.indices].sort((a, b) => a - b).map((index) => items[index] as T);
    return {
      key: group.key,
      span: group.span === null ? null : { start: group.span.start, end: group.span.end },
      columns: columnsOf(members, options.actorOf),
    };
  });
}

/** `parallelGroups` for server messages: `messageActor` columns, `messageInterval` (streaming ones last until `now`). */
export function layoutMessages<M extends LayoutMessage>(messages: readonly M[], now?: number): ParallelGroup<M>[] {
  return parallelGroups(messages, { actorOf: messageActor, intervalOf: (m) => messageInterval(m, now) });
}
