// The AgentUE reducer: reduce(state, event) -> state, fold(events). Pure; the same rules as loopd.agentue (Python).
// A refused event throws AgentUERejectedError and the caller keeps the state it passed in (nothing is mutated).
//
// Sequence rules: `start` always applies (a whole snapshot: replaces model and seq, reopens an ended stream);
// any other event at or below the applied seq is a duplicate and a no-op (redelivery after a reconnect is
// idempotent), except an `end` at exactly the applied seq, which marks the stream ended; `ping` never changes
// state; before the first start every other op is refused; after `end` every new change is refused.
// Must not do: I/O, resolve references, or mutate its inputs (unchanged blocks are shared, not copied).
import { type Event, parseEvent } from "./events";
import {
  AgentUEValidationError,
  type Block,
  type InlineBlock,
  type Json,
  type JsonObject,
  type Model,
  VERSION_1_0,
  checkInline,
  checkMeta,
  clone,
  describe,
  isObject,
  isRefBlock,
} from "./model";

export type RejectCode =
  | "invalid_event"
  | "wrong_stream"
  | "not_started"
  | "ended"
  | "missing_block"
  | "unresolved_reference"
  | "legacy_reference"
  | "type_mismatch"
  | "path_conflict"
  | "invalid_result";

/** An event the reducer refused; the state it was applied to is unchanged. */
export class AgentUERejectedError extends Error {
  readonly code: RejectCode;
  readonly op: string;
  readonly seq: number | null;
  constructor(code: RejectCode, reason: string, op: string, seq: number | null) {
    super(`${op} (seq ${seq ?? "?"}) refused: ${code}: ${reason}`);
    this.name = "AgentUERejectedError";
    this.code = code;
    this.op = op;
    this.seq = seq;
  }
}

/** One stream's snapshot: its model (null before the first start), the highest seq applied, and whether it ended. */
export interface StreamState {
  readonly stream: string;
  readonly model: Model | null;
  readonly seq: number | null;
  readonly ended: boolean;
}

/** A stream that has not started (`stream` "" is the unnamed stream). */
export function emptyState(stream = ""): StreamState {
  return { stream, model: null, seq: null, ended: false };
}

/** A started stream holding `model` (a stored snapshot, for example), with an unknown or given seq. */
export function stateOf(model: Model, seq: number | null = null, stream = ""): StreamState {
  return { stream, model, seq, ended: false };
}

class Refusal extends Error {
  constructor(
    readonly code: RejectCode,
    readonly reason: string,
  ) {
    super(reason);
  }
}

/** Apply one event (JSON or parsed); returns the new state (the same object when nothing changes). */
export function reduce(state: StreamState, event: unknown): StreamState {
  let parsed: Event;
  try {
    parsed = isParsed(event) ? event : parseEvent(event);
  } catch (error) {
    if (!(error instanceof AgentUEValidationError)) throw error;
    const raw = isObject(event) ? event : {};
    throw new AgentUERejectedError(
      "invalid_event",
      error.message,
      typeof raw["op"] === "string" ? raw["op"] : "event",
      typeof raw["seq"] === "number" ? raw["seq"] : null,
    );
  }
  try {
    return reduceParsed(state, parsed);
  } catch (error) {
    if (error instanceof Refusal) throw new AgentUERejectedError(error.code, error.reason, parsed.op, parsed.seq);
    throw error;
  }
}

/** Reduce `events` in order from `initial` (or an empty state of the first event's stream). */
export function fold(events: Iterable<unknown>, initial?: StreamState): StreamState {
  let state = initial ?? null;
  for (const event of events) {
    if (state === null) {
      const stream = isObject(event) && typeof event["stream_id"] === "string" ? event["stream_id"] : "";
      state = emptyState(stream);
    }
    state = reduce(state, event);
  }
  return state ?? emptyState();
}

const parsedEvents = new WeakSet<object>();

/** Parse once, reuse: a parsed event can be handed to `reduce` again without re-validation. */
export function prepare(event: unknown): Event {
  const parsed = parseEvent(event);
  parsedEvents.add(parsed);
  return parsed;
}

function isParsed(event: unknown): event is Event {
  return typeof event === "object" && event !== null && parsedEvents.has(event);
}

function reduceParsed(state: StreamState, event: Event): StreamState {
  if (event.stream !== state.stream) {
    throw new Refusal("wrong_stream", `the event addresses stream ${JSON.stringify(event.stream)}, not ${JSON.stringify(state.stream)}`);
  }
  if (event.op === "start") return { stream: state.stream, model: event.model, seq: event.seq, ended: false };
  if (event.op === "ping") return state;
  const model = state.model;
  if (model === null) throw new Refusal("not_started", "the stream has not started; a delivery begins with start");
  if (state.seq !== null && event.seq <= state.seq) {
    if (event.op === "end" && event.seq === state.seq && !state.ended) return { ...state, ended: true };
    return state; // already applied: redelivery is a no-op
  }
  if (state.ended) throw new Refusal("ended", `the stream ended at seq ${state.seq}; only a new start reopens it`);
  if (event.op === "end") return { ...state, seq: event.seq, ended: true };
  let next: Model;
  if (event.op === "set") next = applySet(model, event);
  else if (event.op === "append") next = applyAppend(model, event);
  else next = withMeta(model, { ...model.meta, error: clone(event.error as Json) });
  return { stream: state.stream, model: next, seq: event.seq, ended: false };
}

function findBlock(model: Model, id: string): number {
  const blocks = model.blocks;
  // Streaming appends usually hit the last blocks: search from the end.
  for (let index = blocks.length - 1; index >= 0; index -= 1) if ((blocks[index] as Block).id === id) return index;
  return -1;
}

function withBlock(model: Model, index: number, block: Block): Model {
  const blocks = model.blocks.slice();
  if (index < 0) blocks.push(block);
  else blocks[index] = block;
  return { version: model.version, biz: model.biz, meta: model.meta, blocks };
}

function withMeta(model: Model, meta: JsonObject): Model {
  try {
    checkMeta(meta, "meta");
  } catch (error) {
    if (error instanceof AgentUEValidationError) throw new Refusal("invalid_result", `the result would be invalid: ${error.message}`);
    throw error;
  }
  return { version: model.version, biz: model.biz, meta, blocks: model.blocks };
}

function checkedInline(data: JsonObject, where: string): InlineBlock {
  try {
    checkInline(data, where);
  } catch (error) {
    if (error instanceof AgentUEValidationError) throw new Refusal("invalid_result", `the result would be invalid: ${error.message}`);
    throw error;
  }
  return data as InlineBlock;
}

/** A copy of `obj` with `value` at `path`, creating missing objects (copy on write along the path only). */
function setPath(obj: JsonObject, path: readonly string[], value: Json, where: string): JsonObject {
  const out: JsonObject = { ...obj };
  let node = out;
  for (let depth = 0; depth < path.length - 1; depth += 1) {
    const segment = path[depth] as string;
    const child = segment in node ? node[segment] : {};
    if (!isObject(child)) {
      throw new Refusal("path_conflict", `cannot write ${where}: ${path.slice(0, depth + 1).join(".")} is ${describe(child)}, not an object`);
    }
    const copy = { ...child };
    node[segment] = copy;
    node = copy;
  }
  node[path[path.length - 1] as string] = value;
  return out;
}

function applySet(model: Model, event: Extract<Event, { op: "set" }>): Model {
  if ("whole" in event) {
    const whole = event.whole;
    if (isRefBlock(whole) && model.version === VERSION_1_0) {
      throw new Refusal("legacy_reference", "block references need a version 1.1 model; this one is 1.0");
    }
    return withBlock(model, findBlock(model, whole.id), clone(whole as unknown as Json) as unknown as Block);
  }
  const dotted = event.path.join(".");
  const value = clone(event.value);
  if (event.slot === "meta") return withMeta(model, setPath(model.meta, event.path, value, `meta.${dotted}`));
  const id = event.blockId as string;
  const index = findBlock(model, id);
  if (index < 0) throw new Refusal("missing_block", `block ${JSON.stringify(id)} does not exist (set block.${dotted} patches one)`);
  const target = model.blocks[index] as Block;
  if (isRefBlock(target)) {
    throw new Refusal("unresolved_reference", `block ${JSON.stringify(id)} is an unresolved reference; only a whole-block set can replace it`);
  }
  const data = setPath(target as unknown as JsonObject, event.path, value, `block.${dotted} of ${JSON.stringify(id)}`);
  return withBlock(model, index, checkedInline(data, `block ${JSON.stringify(id)}`));
}

function applyAppend(model: Model, event: Extract<Event, { op: "append" }>): Model {
  const index = findBlock(model, event.blockId);
  if (index < 0) {
    const body = clone(event.payload);
    if (!("type" in body)) {
      throw new Refusal("missing_block", `block ${JSON.stringify(event.blockId)} does not exist and the append payload has no type`);
    }
    return withBlock(model, -1, checkedInline(body, `block ${JSON.stringify(event.blockId)}`));
  }
  const target = model.blocks[index] as Block;
  if (isRefBlock(target)) {
    throw new Refusal("unresolved_reference", `block ${JSON.stringify(event.blockId)} is an unresolved reference`);
  }
  const addition = clone(event.payload[event.field] as Json);
  const current = (target as unknown as JsonObject)[event.field];
  let merged: Json;
  if (current === undefined || current === null) merged = addition;
  else if (typeof current === "string" && typeof addition === "string") merged = current + addition;
  else if (Array.isArray(current) && Array.isArray(addition)) merged = [...current, ...addition];
  else {
    throw new Refusal(
      "type_mismatch",
      `cannot append ${describe(addition)} to ${event.field} of block ${JSON.stringify(event.blockId)}, which is ${describe(current)}`,
    );
  }
  const data: JsonObject = { ...(target as unknown as JsonObject), [event.field]: merged };
  return withBlock(model, index, checkedInline(data, `block ${JSON.stringify(event.blockId)}`));
}

/** Several named streams: each has its own model, seq and block ids; events are routed by `stream_id`. */
export type Streams = ReadonlyMap<string, StreamState>;

/** Route one event to its stream's state (creating it), returning a new map (or the same one if nothing changed). */
export function reduceStreams(streams: Streams, event: unknown): Streams {
  const stream = isObject(event) && typeof event["stream_id"] === "string" ? event["stream_id"] : "";
  const before = streams.get(stream) ?? emptyState(stream);
  const after = reduce(before, event);
  if (after === before && streams.has(stream)) return streams;
  const next = new Map(streams);
  next.set(stream, after);
  return next;
}
