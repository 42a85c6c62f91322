// The chat list mounts only the newest messages, and more on request.
import { render } from "preact";
import { act } from "preact/test-utils";
import { describe, expect, it } from "vitest";
import type { MessageBody } from "../api";
import { MessageList, WINDOW_FIRST, WINDOW_STEP } from "./MessageList";
import { emptyView, fromBody, mergeMessages } from "./store";

function body(n: number): MessageBody {
  return {
    id: `m${String(n).padStart(4, "0")}`,
    conversation_id: "c1",
    task_id: n % 2 === 1 ? `t${n}` : null,
    kind: n % 2 === 1 ? "operator" : "user",
    key: n % 2 === 1 ? "echo" : "me",
    reply_to_message_id: null,
    purpose: n % 2 === 1 ? "response" : "input",
    status: "completed",
    created_at: "2026-01-01T00:00:00Z",
    updated_at: "2026-01-01T00:00:00Z",
    revision: 1,
    content: { version: "1.1", biz: "chat", meta: {}, blocks: [{ id: "t", type: "text", content: `message ${n}` }] },
  };
}

describe("MessageList", () => {
  it("mounts the newest messages first and more on 'Show earlier'", () => {
    const view = mergeMessages(emptyView("c1"), Array.from({ length: 1000 }, (_, n) => fromBody(body(n), null)));
    const root = document.createElement("div");
    document.body.appendChild(root);
    act(() =>
      render(
        <MessageList view={view} connection="open" actors={[]} selectedId={null} onSelect={() => undefined} onHumanUpdate={() => undefined} />,
        root,
      ),
    );
    const ids = () => [...root.querySelectorAll("[data-testid=message]")].map((m) => m.getAttribute("data-message-id"));
    expect(ids()).toHaveLength(WINDOW_FIRST);
    expect(ids().at(-1)).toBe("m0999");
    expect(root.querySelector("[data-testid=show-earlier]")?.textContent).toContain(String(1000 - WINDOW_FIRST));
    act(() => (root.querySelector("[data-testid=show-earlier]") as HTMLElement).click());
    expect(ids()).toHaveLength(WINDOW_FIRST + WINDOW_STEP);
    expect(ids()[0]).toBe(`m${String(1000 - WINDOW_FIRST - WINDOW_STEP).padStart(4, "0")}`);
    expect(root.querySelectorAll("[data-testid=status-badge][data-status=completed]").length).toBe((WINDOW_FIRST + WINDOW_STEP) / 2);
    render(null, root);
    root.remove();
  });
});
