// Renders an AgentUE model's blocks: text as sanitized Markdown, tools folded with input/output, results as JSON
// or text, artifacts, progress, and a generic fallback. Gates (`ask` blocks `gate/...`) are rendered by the
// caller (W2's GateCard). Must not do: fetch, or change the model.
import { type ComponentChild, Fragment } from "preact";
import { memo } from "preact/compat";
import { useEffect, useState } from "preact/hooks";
import type { Block, InlineBlock, Json, Model } from "../agentue";
import { isRefBlock } from "../agentue";
import { hasCode, highlighterReady, onHighlighterReady, renderMarkdown } from "./markdown";

function asText(value: Json | undefined): string {
  if (value === undefined || value === null) return "";
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

function str(value: Json | undefined): string | null {
  return typeof value === "string" && value !== "" ? value : null;
}

/** Sanitized Markdown, memoized on the text itself. */
export const Markdown = memo(function Markdown({ text, testId }: { text: string; testId?: string }) {
  // Code waits for the highlighter (loaded on first use): render it plain now, again when it arrives.
  const [, setReady] = useState(false);
  const waits = !highlighterReady() && hasCode(text);
  useEffect(() => (waits ? onHighlighterReady(() => setReady(true)) : undefined), [waits]);
  return <div class="markdown" data-testid={testId} dangerouslySetInnerHTML={{ __html: renderMarkdown(text) }} />;
});

function JsonOrText({ value, format }: { value: Json | undefined; format?: string | null }) {
  if (typeof value === "string" && format !== "json") return <Markdown text={value} />;
  let text = asText(value);
  if (typeof value === "string") {
    try {
      text = JSON.stringify(JSON.parse(value), null, 2);
    } catch {
      // not JSON after all: show as is
    }
  }
  return (
    <pre class="json">
      <code>{text}</code>
    </pre>
  );
}

function statusClass(status: string | null): string {
  return status === null ? "" : ` is-${status.replace(/[^a-z_-]/gi, "")}`;
}

function ToolBlock({ block }: { block: InlineBlock }) {
  const tool = (typeof block["tool"] === "object" && block["tool"] !== null ? block["tool"] : {}) as Record<string, Json>;
  const name = str(block["name"]) ?? str(tool["name"]) ?? "tool";
  const status = str(block["status"]) ?? str(tool["status"]);
  const input = block["input"] ?? tool["input"];
  const output = block["output"] ?? tool["output"] ?? tool["result"];
  return (
    <details class={`block tool${statusClass(status)}`} data-testid="tool-call" data-status={status ?? undefined}>
      <summary>
        <span class="tool-name">{name}</span>
        {status !== null && <span class="tool-status">{status}</span>}
      </summary>
      {input !== undefined && (
        <div class="tool-io">
          <div class="io-label">Input</div>
          <JsonOrText value={input} format="json" />
        </div>
      )}
      {output !== undefined && output !== null && (
        <div class="tool-io">
          <div class="io-label">Output</div>
          <pre class="json">
            <code>{asText(output)}</code>
          </pre>
        </div>
      )}
    </details>
  );
}

function ResultBlock({ block, answerText }: { block: InlineBlock; answerText: string | null }) {
  const format = str(block["format"]);
  const content = block["content"];
  // The streamed text usually ends with the final result: fold the result then.
  const sameAsAnswer =
    typeof content === "string" && content.trim() !== "" && answerText !== null && answerText.trim().endsWith(content.trim());
  if (sameAsAnswer) {
    // The streamed text already shows it: keep the result folded.
    return (
      <details class="block result" data-testid="block-result" data-format={format ?? undefined}>
        <summary>Result (same as the answer above)</summary>
        <JsonOrText value={content} format={format} />
      </details>
    );
  }
  return (
    <div class="block result" data-testid="block-result" data-format={format ?? undefined}>
      <div class="io-label">Result</div>
      <JsonOrText value={content} format={format} />
    </div>
  );
}

function ArtifactBlock({ block }: { block: InlineBlock }) {
  const title = str(block["title"]) ?? str(block["name"]) ?? str(block["path"]) ?? "artifact";
  const uri = str(block["uri"]) ?? str(block["url"]);
  const safeUri = uri !== null && /^(https?:|\/)/.test(uri) ? uri : null;
  const body = block["content"] ?? block["data"];
  return (
    <div class="block artifact" data-testid="block-artifact">
      <div class="artifact-title">
        <span aria-hidden="true">📄 </span>
        {safeUri !== null ? (
          <a href={safeUri} target="_blank" rel="noopener noreferrer">
            {title}
          </a>
        ) : (
          title
        )}
        {str(block["mime_type"]) !== null && <span class="muted"> · {str(block["mime_type"])}</span>}
      </div>
      {body !== undefined && body !== null && (
        <details>
          <summary>Show content</summary>
          <JsonOrText value={body} format={str(block["format"]) ?? (typeof body === "string" ? "text" : "json")} />
        </details>
      )}
    </div>
  );
}

function ProgressBlock({ block, live }: { block: InlineBlock; live: boolean }) {
  const text = str(block["content"]) ?? str(block["text"]) ?? str(block["label"]) ?? "Working…";
  const value = typeof block["value"] === "number" ? block["value"] : typeof block["percent"] === "number" ? block["percent"] : null;
  return (
    <div class="block progress" data-testid="block-progress" role="status">
      {live && <span class="spinner" aria-hidden="true" />}
      <span>{text}</span>
      {value !== null && <progress max={value > 1 ? 100 : 1} value={value} aria-label={text} />}
    </div>
  );
}

function AskBlock({ block }: { block: InlineBlock }) {
  // A non-gate ask inside an answer (human questions are their own messages): shown read-only.
  const status = str(block["status"]);
  return (
    <div class={`block ask${statusClass(status)}`} data-testid="block-ask">
      <div class="ask-title">{str(block["title"]) ?? "Question"}</div>
      {str(block["prompt"]) !== null && <Markdown text={str(block["prompt"]) as string} />}
      {status !== null && <div class="muted">{status === "success" ? `Answered: ${asText(block["value"])}` : status}</div>}
    </div>
  );
}

function GenericBlock({ block }: { block: InlineBlock }) {
  const { id: _id, type, ...rest } = block;
  return (
    <details class="block generic" data-testid="block-generic" data-type={type}>
      <summary>{type}</summary>
      <pre class="json">
        <code>{JSON.stringify(rest, null, 2)}</code>
      </pre>
    </details>
  );
}

/** One block (memoized by identity: the reducer keeps unchanged blocks identical). */
export const BlockView = memo(function BlockView({ block, answerText, live = true }: { block: Block; answerText: string | null; live?: boolean }) {
  if (isRefBlock(block)) {
    return (
      <div class="block ref muted" data-testid="block-ref">
        (content stored elsewhere: {block.ref})
      </div>
    );
  }
  switch (block.type) {
    case "text":
    case "markdown":
      return <Markdown text={asText(block["content"] ?? block["text"])} testId="message-text" />;
    case "tool":
    case "tool_call":
      return <ToolBlock block={block} />;
    case "result":
      return <ResultBlock block={block} answerText={answerText} />;
    case "artifact":
    case "file":
      return <ArtifactBlock block={block} />;
    case "progress":
      return <ProgressBlock block={block} live={live} />;
    case "ask":
    case "confirm":
      return <AskBlock block={block} />;
    default:
      return <GenericBlock block={block} />;
  }
});

/** The text of the model's main text block (what a folded result is compared with). */
export function answerTextOf(model: Model | null): string | null {
  if (model === null) return null;
  let text: string | null = null;
  for (const block of model.blocks) {
    if (!isRefBlock(block) && (block.type === "text" || block.type === "markdown")) {
      const content = block["content"];
      if (typeof content === "string") text = text === null ? content : `${text}\n${content}`;
    }
  }
  return text;
}

/** Whether a block is a harness gate or an ask_user question (rendered by the caller with a card). */
export function isGateBlock(block: Block): boolean {
  return !isRefBlock(block) && block.type === "ask" && (block.id.startsWith("gate/") || block.id.startsWith("question/"));
}

/** The blocks of a model in order; gates go through `renderGate` (W2's GateCard) in their place. `live`: the message
 * is still being written (a progress block spins only then). */
export function Blocks({ model, renderGate, live = true }: { model: Model | null; renderGate?: (block: InlineBlock) => ComponentChild; live?: boolean }) {
  if (model === null) return null;
  const answerText = answerTextOf(model);
  const errorInfo = model.meta["error"];
  return (
    <>
      {model.blocks.map((block) =>
        isGateBlock(block) ? (
          renderGate === undefined ? (
            <BlockView key={block.id} block={block} answerText={answerText} live={live} />
          ) : (
            <Fragment key={block.id}>{renderGate(block as InlineBlock)}</Fragment>
          )
        ) : (
          <BlockView key={block.id} block={block} answerText={answerText} live={live} />
        ),
      )}
      {typeof errorInfo === "object" && errorInfo !== null && !Array.isArray(errorInfo) && (
        <div class="block error" role="alert" data-testid="block-error">
          {asText(errorInfo["message"]) || asText(errorInfo["code"]) || "failed"}
        </div>
      )}
    </>
  );
}
