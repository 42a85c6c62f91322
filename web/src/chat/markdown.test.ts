// @vitest-environment jsdom
import { describe, expect, it } from "vitest";
import { ensureHighlighter, highlight, highlighterReady, renderMarkdown } from "./markdown";

describe("renderMarkdown", () => {
  it("renders Markdown", () => {
    const html = renderMarkdown("# Title\n\nSome **bold** and a [link](https://example.invalid/x).\n\n- a\n- b");
    expect(html).toContain("<h1>Title</h1>");
    expect(html).toContain("<strong>bold</strong>");
    expect(html).toContain('rel="noopener noreferrer"');
    expect(html).toContain("<li>a</li>");
  });

  it("sanitizes scripts, handlers, javascript: links and style attributes", () => {
    const html = renderMarkdown(
      '<script>alert(1)</script><img src=x onerror="alert(2)"><a href="javascript:alert(3)">x</a><p style="color:red">s</p>',
    );
    expect(html).not.toContain("<script");
    expect(html).not.toContain("onerror");
    expect(html).not.toContain("javascript:");
    expect(html).not.toContain("style=");
    expect(renderMarkdown("[y](javascript:alert(4))")).not.toContain("javascript:");
  });

  it("renders code plain until the highlighter has loaded, then highlighted", async () => {
    if (!highlighterReady()) expect(renderMarkdown("```python\nimport os\n```")).not.toContain("hljs-keyword");
    await ensureHighlighter();
    expect(renderMarkdown("```python\nimport os\n```")).toContain("hljs-keyword");
  });

  it("highlights fenced code of a bundled language, and escapes unknown ones", async () => {
    await ensureHighlighter();
    const html = renderMarkdown("```python\ndef f(x):\n    return x\n```");
    expect(html).toContain('class="hljs"');
    expect(html).toContain("hljs-keyword");
    expect(highlight("<b>", "nosuchlang")).toBe("&#60;b&#62;");
  });
});
