// Markdown → sanitized HTML for text blocks: marked (GFM) + highlight.js for fenced code (a few languages, core
// build) + DOMPurify (no scripts, no event handlers, no style attributes: the page's CSP forbids inline styles).
// Results are cached by source text, so re-rendering an unchanged block costs a map lookup.
// Must not do: fetch anything (images and links are left to the browser and the CSP).
import DOMPurify from "dompurify";
import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import css from "highlight.js/lib/languages/css";
import diff from "highlight.js/lib/languages/diff";
import go from "highlight.js/lib/languages/go";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import markdownLang from "highlight.js/lib/languages/markdown";
import python from "highlight.js/lib/languages/python";
import rust from "highlight.js/lib/languages/rust";
import sql from "highlight.js/lib/languages/sql";
import typescript from "highlight.js/lib/languages/typescript";
import xml from "highlight.js/lib/languages/xml";
import yaml from "highlight.js/lib/languages/yaml";
import { Marked, type Tokens } from "marked";

const LANGUAGES = { bash, css, diff, go, javascript, json, markdown: markdownLang, python, rust, sql, typescript, xml, yaml };
for (const [name, language] of Object.entries(LANGUAGES)) hljs.registerLanguage(name, language);
hljs.registerAliases(["sh", "shell", "zsh", "console"], { languageName: "bash" });
hljs.registerAliases(["js", "jsx", "mjs"], { languageName: "javascript" });
hljs.registerAliases(["ts", "tsx"], { languageName: "typescript" });
hljs.registerAliases(["py"], { languageName: "python" });
hljs.registerAliases(["html", "svg"], { languageName: "xml" });
hljs.registerAliases(["yml"], { languageName: "yaml" });
hljs.registerAliases(["md"], { languageName: "markdown" });

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (char) => `&#${char.charCodeAt(0)};`);
}

/** Highlight `code` as `lang` (or plain, escaped, when the language is not bundled or the text is very long). */
export function highlight(code: string, lang: string | undefined): string {
  const name = (lang ?? "").trim().split(/\s+/)[0]?.toLowerCase() ?? "";
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
