// @vitest-environment node
import { describe, expect, it } from "vitest";
import { Generations } from "./generation";

describe("Generations", () => {
  it("drops a stale callback from an earlier visit", () => {
    const generations = new Generations();
    const seen: string[] = [];
    const first = generations.next();
    const late = first.guard((text: string) => seen.push(`first:${text}`));
    const second = generations.next();
    const live = second.guard((text: string) => seen.push(`second:${text}`));
    late("stale"); // e.g. a stream frame of conversation A arriving after the switch to B
    live("fresh");
    expect(seen).toEqual(["second:fresh"]);
    expect(first.current).toBe(false);
    expect(first.signal.aborted).toBe(true);
    expect(second.current).toBe(true);
    expect(second.signal.aborted).toBe(false);
  });

  it("a return to the same conversation is a new generation too", () => {
    const generations = new Generations();
    const a1 = generations.next();
    const seen: number[] = [];
    const fromA1 = a1.guard(() => seen.push(a1.id));
    generations.next(); // B
    const a2 = generations.next(); // A again
    fromA1();
    a2.guard(() => seen.push(a2.id))();
    expect(seen).toEqual([a2.id]);
  });

  it("end() silences the current generation", () => {
    const generations = new Generations();
    const g = generations.next();
    let calls = 0;
    const cb = g.guard(() => (calls += 1));
    generations.end();
    cb();
    expect(calls).toBe(0);
    expect(g.signal.aborted).toBe(true);
  });
});
