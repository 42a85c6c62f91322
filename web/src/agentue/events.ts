// AgentUE events: six ops, validated from JSON into a typed union. Pure.
// Must not do: look at the current model (whether a block exists or is a reference is the reducer's business).
import {
  AgentUEValidationError,
  type Block,
  type Json,
  type JsonObject,
  type Model,
  checkErrorObject,
  describe,
  isNonEmptyString,
  isObject,
  parseBlock,
  parseModel,
} from "./model";

export type Op = "start" | "set" | "append" | "error" | "ping" | "end";
const OPS: readonly Op[] = ["start", "set", "append", "error", "ping", "end"];
const ENVELOPE = new Set(["op", "seq", "stream_id", "ts", "event_type", "mask", "model", "meta", "block"]);
const SLOTS: Record<Op, readonly string[]> = {
  start: ["model"],
  set: ["mask", "meta", "block"],
  append: ["mask", "block"],
  error: ["mask", "meta"],
  ping: [],
  end: [],
};
const REFERENCE_FIELDS = new Set(["id", "ref"]);

interface Envelope {
  seq: number;
  /** The stream this event addresses: "" is the unnamed stream. */
  stream: string;
}

export type Event =
  | (Envelope & { op: "start"; model: Model })
  | (Envelope & { op: "set"; whole: Block })
  | (Envelope & { op: "set"; slot: "meta" | "block"; path: string[]; value: Json; blockId: string | null })
  | (Envelope & { op: "append"; blockId: string; field: string; payload: JsonObject })
  | (Envelope & { op: "error"; error: JsonObject })
  | (Envelope & { op: "ping" })
  | (Envelope & { op: "end" });

/** Split a dotted mask such as `block.tool.status`; every segment must be non-empty. */
export function splitPath(path: unknown, where: string): string[] {
  if (!isNonEmptyString(path)) throw new AgentUEValidationError(where, `must be a non-empty dotted path, not ${describe(path)}`);
  const segments = path.split(".");
  if (segments.some((segment) => segment === "")) throw new AgentUEValidationError(where, `${path} has an empty segment`);
  return segments;
}

/** The value at `segments` of `obj`: [found, value]. */
export function getPath(obj: JsonObject, segments: readonly string[]): [boolean, Json] {
  let node: Json = obj;
  for (const segment of segments) {
    if (!isObject(node) || !(segment in node)) return [false, null];
    node = node[segment] as Json;
  }
  return [true, node];
}

/** The value a field patch carries: at the same path in the payload, else under a flat key named after the last
 * segment. `null` is a real value. */
export function readPatchValue(payload: JsonObject, segments: readonly string[]): [boolean, Json] {
  const [found, value] = getPath(payload, segments);
  if (found) return [true, value];
  const last = segments[segments.length - 1] as string;
  if (last in payload) return [true, payload[last] as Json];
  return [false, null];
}

function isCount(value: unknown): value is number {
  return typeof value === "number" && Number.isInteger(value) && value >= 0;
}

function checkFieldPatch(payload: JsonObject, path: readonly string[]): string {
  if (REFERENCE_FIELDS.has(path[0] as string)) {
    throw new AgentUEValidationError("event.mask", `a field patch may not target ${path[0]}`);
  }
  if ("ref" in payload) throw new AgentUEValidationError("event.block.ref", "a field patch may not carry ref");
  if (!isNonEmptyString(payload["id"])) throw new AgentUEValidationError("event.block.id", "must be a non-empty string");
  return payload["id"];
}

/** Validate a JSON event; throws `AgentUEValidationError` naming the offending field. */
export function parseEvent(data: unknown): Event {
  if (!isObject(data)) throw new AgentUEValidationError("event", `must be a JSON object, not ${describe(data)}`);
  const unknown = Object.keys(data).filter((name) => !ENVELOPE.has(name));
  if (unknown.length > 0) throw new AgentUEValidationError("event", `unknown field(s) ${unknown.sort().join(", ")}`);
  const op = data["op"];
  if (typeof op !== "string" || !(OPS as readonly string[]).includes(op)) {
    throw new AgentUEValidationError("event.op", `must be one of ${OPS.join(", ")}, not ${describe(op)}`);
  }
  const present = (name: string): boolean => data[name] !== undefined && data[name] !== null;
  const seq = data["seq"];
  if (!isCount(seq)) throw new AgentUEValidationError("event.seq", `must be an integer >= 0, not ${describe(seq)}`);
  const streamId = data["stream_id"];
  if (present("stream_id") && typeof streamId !== "string") throw new AgentUEValidationError("event.stream_id", "must be a string");
  if (present("ts") && !isCount(data["ts"])) throw new AgentUEValidationError("event.ts", "must be unix milliseconds");
  if (present("event_type") && typeof data["event_type"] !== "string") {
    throw new AgentUEValidationError("event.event_type", "must be a string");
  }
  const stray = ["mask", "model", "meta", "block"].filter((name) => present(name) && !SLOTS[op as Op].includes(name));
  if (stray.length > 0) throw new AgentUEValidationError("event", `${op} may not carry ${stray.join(", ")}`);
  const env: Envelope = { seq, stream: typeof streamId === "string" ? streamId : "" };
  switch (op as Op) {
    case "start": {
      if (!present("model")) throw new AgentUEValidationError("event.model", "start carries the whole model");
      return { ...env, op: "start", model: parseModel(data["model"], "event.model") };
    }
    case "set":
      return parseSet(env, data);
    case "append": {
      if (!present("mask")) throw new AgentUEValidationError("event.mask", "append needs a mask 'block.<field>'");
      if (!present("block")) throw new AgentUEValidationError("event.block", "append carries a block");
      const segments = splitPath(data["mask"], "event.mask");
      if (segments.length !== 2 || segments[0] !== "block") {
        throw new AgentUEValidationError("event.mask", "append needs a mask 'block.<field>' with a single field");
      }
      const body = data["block"];
      if (!isObject(body)) throw new AgentUEValidationError("event.block", `must be an object, not ${describe(body)}`);
      const blockId = checkFieldPatch(body, segments.slice(1));
      const field = segments[1] as string;
      if (!(field in body)) throw new AgentUEValidationError(`event.block.${field}`, "append carries no value for its masked field");
      const value = body[field];
      if (typeof value !== "string" && !Array.isArray(value)) {
        throw new AgentUEValidationError(`event.block.${field}`, `append takes a string or an array, not ${describe(value)}`);
      }
      return { ...env, op: "append", blockId, field, payload: body };
    }
    case "error": {
      if (!present("mask")) throw new AgentUEValidationError("event.mask", "error needs the mask 'meta.error'");
      if (data["mask"] !== "meta.error") throw new AgentUEValidationError("event.mask", "error needs the mask 'meta.error'");
      const meta = data["meta"];
      if (!isObject(meta) || !("error" in meta)) throw new AgentUEValidationError("event.meta.error", "error carries meta.error");
      checkErrorObject(meta["error"], "event.meta.error");
      return { ...env, op: "error", error: meta["error"] as JsonObject };
    }
    case "ping":
      return { ...env, op: "ping" };
    case "end":
      return { ...env, op: "end" };
  }
}

function parseSet(env: Envelope, data: JsonObject): Event {
  const meta = data["meta"];
  const block = data["block"];
  const hasMeta = meta !== undefined && meta !== null;
  const hasBlock = block !== undefined && block !== null;
  if (hasMeta === hasBlock) throw new AgentUEValidationError("event", "set carries exactly one of meta or block");
  const mask = data["mask"];
  if (mask === undefined || mask === null) {
    if (!hasBlock) throw new AgentUEValidationError("event.mask", "a set of meta needs a mask 'meta.<path>'");
    return { ...env, op: "set", whole: parseBlock(block, "event.block") };
  }
  const segments = splitPath(mask, "event.mask");
  const slot = segments[0];
  const path = segments.slice(1);
  if (slot !== "meta" && slot !== "block") throw new AgentUEValidationError("event.mask", "must start with 'meta.' or 'block.'");
  if (path.length === 0) throw new AgentUEValidationError("event.mask", `names the ${slot} slot but no field in it`);
  const payload = slot === "meta" ? meta : block;
  if (payload === undefined || payload === null) {
    throw new AgentUEValidationError("event.mask", `selects ${slot} but the event carries the other slot`);
  }
  if (!isObject(payload)) throw new AgentUEValidationError(`event.${slot}`, `must be an object, not ${describe(payload)}`);
  const blockId = slot === "block" ? checkFieldPatch(payload, path) : null;
  const [found, value] = readPatchValue(payload, path);
  if (!found) throw new AgentUEValidationError(`event.${slot}`, `carries no value for ${mask}`);
  return { ...env, op: "set", slot, path, value, blockId };
}
