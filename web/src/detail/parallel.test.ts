// @vitest-environment node
import { describe, expect, it } from "vitest";
import {
  actorLabel,
  layoutMessages,
  messageActor,
  messageInterval,
  parallelGroups,
  type Interval,
  type LayoutMessage,
  type ParallelGroup,
} from "./parallel";

interface Item {
  readonly id: number;
  readonly actor: string;
  readonly interval: Interval | null;
}

const options = { actorOf: (i: Item) => i.actor, intervalOf: (i: Item) => i.interval };
const ids = (groups: ParallelGroup<Item>[]) => groups.map((g) => g.columns.map((c) => c.items.map((i) => i.id)));

function item(id: number, actor: string, start: number | null, end?: number): Item {
  return { id, actor, interval: start === null ? null : { start, end: end ?? start } };
}

/** A small seeded PRNG (mulberry32): property tests are reproducible. */
function random(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function randomItems(next: () => number): Item[] {
  const count = Math.floor(next() * 25);
  const actors = ["a", "b", "c", "d"];
  const out: Item[] = [];
  let clock = 0;
  for (let id = 0; id < count; id += 1) {
    clock += Math.floor(next() * 6); // creation order: starts mostly rise, like server messages
    const untimed = next() < 0.1;
    const start = next() < 0.1 ? clock - Math.floor(next() * 5) : clock; // a few out of order
    out.push(item(id, actors[Math.floor(next() * actors.length)] ?? "a", untimed ? null : start, start + Math.floor(next() * 8)));
  }
  return out;
}

const overlaps = (a: Interval, b: Interval) => a.start <= b.end && b.start <= a.end;

describe("parallelGroups examples", () => {
  it("puts the Router's three parallel calls side by side, between the plan and the summary", () => {
    const t = (s: number) => new Date(Date.UTC(2026, 0, 1, 12, 0, s)).toISOString();
    const msg = (id: string, effect: string, start: number, end: number): LayoutMessage & { id: string } => ({
      id,
      kind: "harness",
      key: "assistant",
      status: "completed",
      created_at: t(start),
      updated_at: t(end),
      content: { meta: { effect_key: effect, title: effect } },
    });
    const messages = [
      msg("plan", "plan", 0, 2),
      msg("w0", "work/0", 3, 9),
      msg("w1", "work/1", 3, 7),
      msg("w2", "work/2", 4, 12),
      msg("sum", "summarize", 13, 15),
    ];
    const groups = layoutMessages(messages);
    expect(groups.map((g) => g.columns.map((c) => c.actor))).toEqual([
      ["harness:assistant/plan"],
      ["harness:assistant/work/0", "harness:assistant/work/1", "harness:assistant/work/2"],
      ["harness:assistant/summarize"],
    ]);
    expect(groups[1]?.columns.map((c) => c.items.map((m) => m.id))).toEqual([["w0"], ["w1"], ["w2"]]);
  });

  it("counts touching intervals as overlapping and chains overlaps", () => {
    const groups = parallelGroups(
      [item(1, "a", 0, 5), item(2, "b", 5, 6), item(3, "c", 6, 9), item(4, "a", 10, 11)],
      options,
    );
    expect(ids(groups)).toEqual([[[1], [2], [3]], [[4]]]);
  });

  it("stacks one actor's messages in its column, in first-seen column order", () => {
    const groups = parallelGroups([item(1, "b", 0, 10), item(2, "a", 1, 2), item(3, "b", 3, 4)], options);
    expect(groups[0]?.columns.map((c) => c.actor)).toEqual(["b", "a"]);
    expect(ids(groups)).toEqual([[[1, 3], [2]]]);
  });

  it("renders a message without timestamps alone, and restarts each group at the left", () => {
    const groups = parallelGroups([item(1, "a", 0, 10), item(2, "b", null), item(3, "b", 2, 3), item(4, "c", 20)], options);
    expect(ids(groups)).toEqual([[[1], [3]], [[2]], [[4]]]);
    expect(groups[1]?.span).toBeNull();
  });

  it("handles an empty list and a single message", () => {
    expect(parallelGroups([], options)).toEqual([]);
    expect(ids(parallelGroups([item(1, "a", 5)], options))).toEqual([[[1]]]);
  });
});

describe("message helpers", () => {
  it("reads [created_at, updated_at], extends a streaming message to now, and rejects bad times", () => {
    const base = { kind: "harness", key: "x", created_at: "2026-01-01T00:00:00Z", updated_at: "2026-01-01T00:00:01Z" };
    const start = Date.parse(base.created_at);
    expect(messageInterval(base)).toEqual({ start, end: start + 1000 });
    expect(messageInterval({ ...base, status: "streaming" }, start + 5000)).toEqual({ start, end: start + 5000 });
    expect(messageInterval({ ...base, status: "completed" }, start + 5000)).toEqual({ start, end: start + 1000 });
    expect(messageInterval({ ...base, updated_at: "2025-01-01T00:00:00Z" })).toEqual({ start, end: start });
    expect(messageInterval({ ...base, created_at: "not a time" })).toBeNull();
    expect(messageInterval({ ...base, created_at: null })).toBeNull();
  });

  it("names columns by kind:key and the call's effect key", () => {
    expect(messageActor({ kind: "operator", key: "router" })).toBe("operator:router");
    expect(messageActor({ kind: "harness", key: "assistant", content: { meta: { effect_key: "work/1" } } })).toBe(
      "harness:assistant/work/1",
    );
    expect(actorLabel("harness:assistant/work/1")).toBe("assistant · work/1");
    expect(actorLabel("operator:router")).toBe("router");
  });
});

/** The broken properties of one random layout (empty when all hold). */
function brokenProperties(seed: number): string[] {
  const items = randomItems(random(seed));
  const groups = parallelGroups(items, options);
  const members = groups.map((g) => g.columns.flatMap((c) => c.items));
  const broken: string[] = [];
  const seen = members.flat().map((i) => i.id).sort((a, b) => a - b);
  if (seen.join() !== items.map((i) => i.id).join()) broken.push("every item exactly once");
  for (const [gi, group] of groups.entries()) {
    const inGroup = members[gi] ?? [];
    if (inGroup.some((i) => i.interval === null) && inGroup.length !== 1) broken.push(`group ${gi}: an untimed item stands alone`);
    const timed = inGroup.flatMap((i) => (i.interval ? [i.interval] : [])).sort((a, b) => a.start - b.start);
    let end = timed[0]?.end ?? 0;
    for (const interval of timed.slice(1)) {
      if (interval.start > end) broken.push(`group ${gi}: intervals connected (overlaps chain)`);
      end = Math.max(end, interval.end);
    }
    const actors = group.columns.map((c) => c.actor);
    const firstSeen = [...new Set([...inGroup].sort((a, b) => a.id - b.id).map((i) => i.actor))];
    if (actors.join() !== firstSeen.join()) broken.push(`group ${gi}: one column per actor, first-seen order`);
    for (const column of group.columns) {
      if (column.items.some((i) => i.actor !== column.actor)) broken.push(`group ${gi}: a column holds its actor only`);
      if (column.items.some((i, n) => n > 0 && (column.items[n - 1]?.id ?? -1) > i.id)) broken.push(`group ${gi}: stacked in input order`);
    }
    if (group.key !== Math.min(...inGroup.map((i) => i.id))) broken.push(`group ${gi}: key is its first item`);
  }
  for (let a = 0; a < members.length; a += 1) {
    for (let b = a + 1; b < members.length; b += 1) {
      for (const x of members[a] ?? []) {
        for (const y of members[b] ?? []) {
          if (x.interval && y.interval && overlaps(x.interval, y.interval)) broken.push(`items ${x.id} and ${y.id} overlap across groups`);
        }
      }
    }
  }
  const keys = groups.map((g) => g.key);
  if (keys.some((k, n) => n > 0 && (keys[n - 1] ?? -1) > k)) broken.push("groups in the order of their first item");
  return broken;
}

describe("parallelGroups properties (seeded random inputs)", () => {
  it("hold for 300 seeds", () => {
    const failures = [];
    for (let seed = 1; seed <= 300; seed += 1) {
      const broken = brokenProperties(seed);
      if (broken.length > 0) failures.push({ seed, broken });
    }
    expect(failures).toEqual([]);
  });
});

describe("an operator's parts", () => {
  it("stand in their own columns (LongHorizon's manager, executor and auditor)", () => {
    const report = (id: string, part: string, start: string, end: string) => ({
      id,
      kind: "operator",
      key: "longhorizon",
      created_at: start,
      updated_at: end,
      content: { meta: { author: `operator/longhorizon/${part}` } },
    });
    const groups = layoutMessages([
      report("a", "manager", "2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z"),
      report("b", "executor", "2026-01-01T00:00:01Z", "2026-01-01T00:00:06Z"),
      report("c", "auditor", "2026-01-01T00:00:02Z", "2026-01-01T00:00:07Z"),
    ]);
    expect(groups.map((g) => g.columns.map((c) => c.actor))).toEqual([
      ["operator:longhorizon/manager", "operator:longhorizon/executor", "operator:longhorizon/auditor"],
    ]);
    expect(actorLabel("operator:longhorizon/auditor")).toBe("longhorizon · auditor");
  });
});
