// The AgentUE content model {version, biz, meta, blocks} and its validation (protocol 1.1). Pure.
// Must not do: I/O, or resolve reference blocks (`ref` is opaque and application-owned).

/** Any JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
/** A JSON object. */
export type JsonObject = { [key: string]: Json };

/** An inline block: non-empty `id` and `type`, optional `parent_id` / `group_id`, any domain fields. */
export interface InlineBlock {
  readonly id: string;
  readonly type: string;
  readonly parent_id?: string;
  readonly group_id?: string;
  readonly [field: string]: Json | undefined;
}

/** A reference block: exactly {id, ref} (version 1.1 only). */
export interface RefBlock {
  readonly id: string;
  readonly ref: string;
}

export type Block = InlineBlock | RefBlock;

/** The error a model's `meta.error` carries. */
export interface ErrorInfo {
  code: string;
  message: string;
  detail?: Json;
  trace_id?: string;
}

/** An AgentUE model. Treat as immutable: the reducer returns new objects and shares unchanged parts. */
export interface Model {
  readonly version: string;
  readonly biz: string;
  readonly meta: JsonObject;
  readonly blocks: readonly Block[];
}

export const VERSION_1_0 = "1.0";
export const VERSION_1_1 = "1.1";
export const SUPPORTED_VERSIONS: readonly string[] = [VERSION_1_1, VERSION_1_0];
const MODEL_FIELDS = ["version", "biz", "meta", "blocks"] as const;
const REFERENCE_FIELDS = new Set(["id", "ref"]);

/** A model, block or event that breaks the protocol; `path` names the offending field (e.g. `model.blocks[0].id`). */
export class AgentUEValidationError extends Error {
  readonly path: string;
  constructor(path: string, reason: string) {
    super(`${path}: ${reason}`);
    this.name = "AgentUEValidationError";
    this.path = path;
  }
}

/** True for a plain JSON object (not null, not an array). */
export function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** True for a non-empty string. */
export function isNonEmptyString(value: unknown): value is string {
  return typeof value === "string" && value.length > 0;
}

/** A short description of a value's JSON type, for error messages. */
export function describe(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  if (typeof value === "object") return "an object";
  return `${typeof value} ${JSON.stringify(value)}`;
}

/** True when `block` is a reference block (it carries a `ref` key). */
export function isRefBlock(block: Block): block is RefBlock {
  return "ref" in block;
}

function requireNonEmpty(obj: JsonObject, key: string, path: string): void {
  if (!isNonEmptyString(obj[key])) {
    throw new AgentUEValidationError(`${path}.${key}`, `must be a non-empty string, not ${describe(obj[key])}`);
  }
}

/** Check `meta.error` when not null: an object with string `code` and `message` (optional string `trace_id`). */
export function checkErrorObject(value: unknown, path: string): void {
  if (!isObject(value)) {
    throw new AgentUEValidationError(path, `must be null or an object {code, message}, not ${describe(value)}`);
  }
  for (const key of ["code", "message"]) {
    if (typeof value[key] !== "string") {
      throw new AgentUEValidationError(`${path}.${key}`, `must be a string, not ${describe(value[key])}`);
    }
  }
  if (value["trace_id"] != null && typeof value["trace_id"] !== "string") {
    throw new AgentUEValidationError(`${path}.trace_id`, "must be a string");
  }
}

/** Type the known meta keys (`error`, `task_id`, `trace_id`, `stats`); unknown keys are free. */
export function checkMeta(meta: JsonObject, path: string): void {
  if (meta["error"] != null) checkErrorObject(meta["error"], `${path}.error`);
  for (const key of ["task_id", "trace_id"]) {
    if (meta[key] != null && typeof meta[key] !== "string") {
      throw new AgentUEValidationError(`${path}.${key}`, `must be a string, not ${describe(meta[key])}`);
    }
  }
  if (meta["stats"] != null && !isObject(meta["stats"])) {
    throw new AgentUEValidationError(`${path}.stats`, `must be an object, not ${describe(meta["stats"])}`);
  }
}

/** Check the inline-block rules (the caller has excluded `ref`). */
export function checkInline(data: JsonObject, path: string): void {
  requireNonEmpty(data, "id", path);
  requireNonEmpty(data, "type", path);
  for (const key of ["parent_id", "group_id"]) {
    if (data[key] != null && !isNonEmptyString(data[key])) {
      throw new AgentUEValidationError(`${path}.${key}`, `must be a non-empty string, not ${describe(data[key])}`);
    }
  }
}

/** Validate one JSON block: any `ref` key makes it a reference block (exactly {id, ref}), else it is inline. */
export function parseBlock(data: unknown, path = "block"): Block {
  if (!isObject(data)) throw new AgentUEValidationError(path, `must be a JSON object, not ${describe(data)}`);
  if ("ref" in data) {
    const extra = Object.keys(data).filter((key) => !REFERENCE_FIELDS.has(key)).sort();
    if (extra.length > 0) {
      throw new AgentUEValidationError(path, `a reference block is exactly {id, ref}; it may not carry ${extra.join(", ")}`);
    }
    requireNonEmpty(data, "id", path);
    requireNonEmpty(data, "ref", path);
    return { id: data["id"] as string, ref: data["ref"] as string };
  }
  checkInline(data, path);
  return data as InlineBlock;
}

/** Validate a JSON model; throws `AgentUEValidationError` naming the offending path. Returns a deep copy. */
export function parseModel(data: unknown, path = "model"): Model {
  if (!isObject(data)) {
    throw new AgentUEValidationError(path, `must be a JSON object {version, biz, meta, blocks}, not ${describe(data)}`);
  }
  const missing = MODEL_FIELDS.filter((name) => !(name in data));
  if (missing.length > 0) throw new AgentUEValidationError(path, `missing required field(s): ${missing.join(", ")}`);
  const unknown = Object.keys(data).filter((name) => !(MODEL_FIELDS as readonly string[]).includes(name));
  if (unknown.length > 0) throw new AgentUEValidationError(path, `unknown field(s) ${unknown.sort().join(", ")}`);
  const version = data["version"];
  if (typeof version !== "string" || !SUPPORTED_VERSIONS.includes(version)) {
    throw new AgentUEValidationError(`${path}.version`, `unsupported version ${describe(version)}`);
  }
  const biz = data["biz"];
  if (!isNonEmptyString(biz)) throw new AgentUEValidationError(`${path}.biz`, `must be a non-empty string`);
  const meta = data["meta"];
  if (!isObject(meta)) throw new AgentUEValidationError(`${path}.meta`, `must be an object, not ${describe(meta)}`);
  checkMeta(meta, `${path}.meta`);
  const rawBlocks = data["blocks"];
  if (!Array.isArray(rawBlocks)) throw new AgentUEValidationError(`${path}.blocks`, "must be an array");
  const seen = new Map<string, number>();
  const blocks: Block[] = rawBlocks.map((raw, index) => {
    const where = `${path}.blocks[${index}]`;
    const block = parseBlock(raw, where);
    if (isRefBlock(block) && version === VERSION_1_0) {
      throw new AgentUEValidationError(where, "block references need version 1.1");
    }
    const before = seen.get(block.id);
    if (before !== undefined) {
      throw new AgentUEValidationError(`${where}.id`, `duplicate block id ${JSON.stringify(block.id)} (also at blocks[${before}])`);
    }
    seen.set(block.id, index);
    return block;
  });
  return clone({ version, biz, meta, blocks: blocks as unknown as Json[] }) as unknown as Model;
}

/** A deep copy of a JSON value. */
export function clone<T extends Json>(value: T): T {
  if (value === null || typeof value !== "object") return value;
  if (Array.isArray(value)) return value.map((item) => clone(item)) as T;
  const out: JsonObject = {};
  for (const key of Object.keys(value)) out[key] = clone((value as JsonObject)[key] as Json);
  return out as T;
}
