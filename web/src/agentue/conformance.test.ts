// @vitest-environment node
// The AgentUE conformance cases (tests/data/agentue, shared with the Python reducer's tests), every one of them.
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { AgentUERejectedError, AgentUEValidationError, emptyState, fold, parseModel, reduce, stateOf } from ".";
import type { StreamState } from ".";

// vitest runs in web/ (npm scripts run in the package folder).
const DATA = resolve(process.cwd(), "../tests/data/agentue");

function load(name: string): any {
  return JSON.parse(readFileSync(resolve(DATA, name), "utf-8"));
}

const TRANSITIONS = load("state-transitions.json");
const REFERENCES = load("block-references.json");

function initial(model: Record<string, unknown>): StreamState {
  // The conformance files write "no model yet" as {}.
  return Object.keys(model).length === 0 ? emptyState() : stateOf(parseModel(model));
}

describe("the fixture files", () => {
  it("hold every named case", () => {
    expect(TRANSITIONS.cases).toHaveLength(4);
    expect(REFERENCES.invalid_models).toHaveLength(14);
    expect(REFERENCES.rejected_updates).toHaveLength(23);
  });
});

describe("state transitions", () => {
  it.each<any>(TRANSITIONS.cases)("$name reaches the exact expected state", (c: any) => {
    const events = structuredClone(c.events);
    const state = fold(events, initial(c.initial));
    expect(state.model).toEqual(c.expected);
    expect(events).toEqual(c.events); // the reducer must not mutate its input events
  });

  it.each<any>(TRANSITIONS.cases)("$name is the same event by event", (c: any) => {
    let state = initial(c.initial);
    for (const event of c.events) state = reduce(state, event);
    expect(state.model).toEqual(c.expected);
  });
});

describe("invalid models", () => {
  it.each<any>(REFERENCES.invalid_models)("$name fails validation", (c: any) => {
    expect(() => parseModel(c.model)).toThrow(AgentUEValidationError);
    try {
      parseModel(c.model);
    } catch (error) {
      expect((error as AgentUEValidationError).path.startsWith("model")).toBe(true);
    }
  });
});

describe("rejected updates", () => {
  it.each<any>(REFERENCES.rejected_updates)("$name leaves the initial state unchanged", (c: any) => {
    const state = initial(c.initial);
    const before = structuredClone(state);
    const event = structuredClone(c.event);
    expect(() => reduce(state, event)).toThrow(AgentUERejectedError);
    expect(state.model).toEqual(c.initial);
    expect(state).toEqual(before);
    expect(event).toEqual(c.event);
  });

  it.each<any>(REFERENCES.rejected_updates)("$name starts from a valid model", (c: any) => {
    expect(parseModel(c.initial)).toEqual(c.initial);
  });
});
