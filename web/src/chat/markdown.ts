// Markdown → sanitized HTML for text blocks: marked (GFM) + highlight.js for fenced code (a few languages, core
// build, loaded on first use) + DOMPurify (no scripts, no event handlers, no style attributes: the page's CSP forbids inline styles).
// Results are cached by source text, so re-rendering an unchanged block costs a map lookup.
// Must not do: fetch anything (images and links are left to the browser and the CSP).
import DOMPurify from "dompurify";
import { Marked, type Tokens } from "marked";

type Highlighter = (typeof import("./highlighter"))["hljs"];
let hljs: Highlighter | null = null;
let loading: Promise<void> | null = null;
const waiting = new Set<() => void>();

/** Load highlight.js (its own chunk) once; code rendered before that is plain and re-rendered when it arrives. */
export function ensureHighlighter(): Promise<void> {
  loading ??= import("./highlighter").then(
    (module) => {
      hljs = module.hljs;
      cache.clear(); // cached HTML has unhighlighted code
      const callbacks = [...waiting];
      waiting.clear();
      for (const callback of callbacks) callback();
    },
    () => {
      loading = null; // try again next time
    },
  );
  return loading;
}

/** Call `callback` once highlighting is available (at once if it is); returns an unsubscribe function. */
export function onHighlighterReady(callback: () => void): () => void {
  if (hljs !== null) {
    callback();
    return () => undefined;
  }
  waiting.add(callback);
  void ensureHighlighter();
  return () => waiting.delete(callback);
}

/** Whether code blocks are highlighted now. */
export function highlighterReady(): boolean {
  return hljs !== null;
}

/** Whether a Markdown text may hold a fenced code block (only those wait for the highlighter). */
export function hasCode(source: string): boolean {
  return source.includes("```") || source.includes("~~~");
}

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (char) => `&#${char.charCodeAt(0)};`);
}

/** Highlight `code` as `lang` (or plain, escaped, when the language is not bundled, the text is very long, or the
 * highlighter has not loaded yet). */
export function highlight(code: string, lang: string | undefined): string {
  const name = (lang ?? "").trim().split(/\s+/)[0]?.toLowerCase() ?? "";
  if (hljs === null) {
    void ensureHighlighter();
    return escapeHtml(code);
  }
  if (name !== "" && code.length <= 50_000 && hljs.getLanguage(name) !== undefined) {
    return hljs.highlight(code, { language: name, ignoreIllegals: true }).value;
  }
  return escapeHtml(code);
}

const marked = new Marked({
  gfm: true,
  breaks: false,
  async: false,
  renderer: {
    code(token: Tokens.Code): string {
      const lang = (token.lang ?? "").trim().split(/\s+/)[0] ?? "";
      const label = lang === "" ? "" : ` data-lang="${escapeHtml(lang)}"`;
      return `<pre class="code"${label}><code class="hljs">${highlight(token.text, lang)}</code></pre>\n`;
    },
  },
});

let purifier: ReturnType<typeof DOMPurify> | null = null;

/** This module's own DOMPurify instance, configured once (parsing a config on every call costs per streamed frame). */
function sanitizer(): ReturnType<typeof DOMPurify> {
  if (purifier === null) {
    purifier = DOMPurify(window);
    purifier.setConfig({
      FORBID_ATTR: ["style"],
      FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "iframe"],
      ADD_ATTR: ["target"],
    });
    purifier.addHook("afterSanitizeAttributes", (node) => {
      if (node.tagName === "A" && node.hasAttribute("href")) {
        node.setAttribute("target", "_blank");
        node.setAttribute("rel", "noopener noreferrer");
      }
    });
  }
  return purifier;
}

const cache = new Map<string, string>();
const CACHE_LIMIT = 2000;

/** Sanitized HTML for a Markdown text (cached). */
export function renderMarkdown(source: string): string {
  const hit = cache.get(source);
  if (hit !== undefined) return hit;
  const raw = marked.parse(source) as string;
  const html = sanitizer().sanitize(raw);
  if (cache.size >= CACHE_LIMIT) {
    const oldest = cache.keys().next().value;
    if (oldest !== undefined) cache.delete(oldest);
  }
  cache.set(source, html);
  return html;
}
