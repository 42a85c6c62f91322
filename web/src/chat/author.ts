// Who wrote a message, more precisely than its `kind:key`: an operator's message may name the part of the operator
// that wrote it in `content.meta.author` as `<kind>/<key>/<part>` (LongHorizon's reports: `operator/longhorizon/
// manager`, `…/executor`, `…/auditor`). Only a part of the message's own author counts; anything else is ignored.

interface Authored {
  readonly kind: string;
  readonly key: string;
  readonly content?: unknown;
}

const MAX_PART = 100;

/** The part of the operator that wrote `message` (`manager`), or null when it names none (or another author). */
export function authorPart(message: Authored): string | null {
  if (message.kind !== "operator") return null;
  const content = message.content;
  const meta = typeof content === "object" && content !== null ? (content as Record<string, unknown>)["meta"] : undefined;
  const author = typeof meta === "object" && meta !== null ? (meta as Record<string, unknown>)["author"] : undefined;
  if (typeof author !== "string") return null;
  const prefix = `${message.kind}/${message.key}/`;
  if (!author.startsWith(prefix)) return null;
  const part = author.slice(prefix.length);
  return part !== "" && part.length <= MAX_PART && !part.includes("/") ? part : null;
}

/** A message's author for people: its actor's display name, with the part that wrote it (`LongHorizon · manager`). */
export function authorLabel(message: Authored, displayName: string): string {
  const part = authorPart(message);
  return part === null ? displayName : `${displayName} · ${part}`;
}
