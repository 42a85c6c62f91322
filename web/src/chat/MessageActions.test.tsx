// Retry from here / Edit and resend: which messages offer them, keyboard use, and what the handler receives.
import { render } from "preact";
import { act } from "preact/test-utils";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { MessageBody } from "../api";
import { MessageView } from "./MessageView";
import { fromBody } from "./store";

function body(over: Partial<MessageBody>): MessageBody {
  return {
    id: "m1",
    conversation_id: "c1",
    task_id: "t1",
    kind: "user",
    key: "me",
    reply_to_message_id: null,
    purpose: "input",
    status: "completed",
    created_at: "2026-01-01T00:00:00Z",
    updated_at: "2026-01-01T00:00:00Z",
    revision: 1,
    content: { version: "1.1", biz: "chat", meta: {}, blocks: [{ id: "t", type: "text", content: "apples?" }] },
    ...over,
  };
}

const roots: HTMLElement[] = [];
function mount(message: MessageBody, onFork: (id: string, mode: string, text?: string) => Promise<void>): HTMLElement {
  const root = document.createElement("div");
  document.body.appendChild(root);
  roots.push(root);
  act(() =>
    render(
      <MessageView message={fromBody(message, null)} badge={null} selected={false} authorName="Echo" onSelect={null} onHumanUpdate={() => undefined} onFork={onFork} />,
      root,
    ),
  );
  return root;
}

afterEach(() => {
  for (const root of roots.splice(0)) {
    render(null, root);
    root.remove();
  }
});

describe("MessageActions", () => {
  it("retries a finished answer, and offers nothing while it streams", async () => {
    const onFork = vi.fn(() => Promise.resolve());
    const streaming = mount(body({ id: "a0", kind: "operator", key: "echo", purpose: "response", status: "streaming" }), onFork);
    expect(streaming.querySelector("[data-testid=retry-from-here]")).toBeNull();
    const root = mount(body({ id: "a1", kind: "operator", key: "echo", purpose: "response" }), onFork);
    const button = root.querySelector("[data-testid=retry-from-here]") as HTMLButtonElement;
    expect(button.tagName).toBe("BUTTON");
    expect(button.getAttribute("aria-label")).toContain("Retry from here");
    expect(root.querySelector("[data-testid=edit-and-resend]")).toBeNull();
    await act(async () => button.click());
    expect(onFork).toHaveBeenCalledWith("a1", "retry", undefined);
  });

  it("edits a question inline and resends it with Ctrl+Enter; Escape cancels", async () => {
    const onFork = vi.fn(() => Promise.resolve());
    const root = mount(body({}), onFork);
    expect(root.querySelector("[data-testid=retry-from-here]")).toBeNull();
    act(() => (root.querySelector("[data-testid=edit-and-resend]") as HTMLButtonElement).click());
    const editor = root.querySelector("[data-testid=edit-text]") as HTMLTextAreaElement;
    expect(editor.value).toBe("apples?");
    expect(editor.getAttribute("aria-label")).toBe("Edit your question");
    expect(document.activeElement).toBe(editor);
    act(() => {
      editor.dispatchEvent(new KeyboardEvent("keydown", { key: "Escape", bubbles: true }));
    });
    expect(root.querySelector("[data-testid=edit-text]")).toBeNull();
    expect(onFork).not.toHaveBeenCalled();

    act(() => (root.querySelector("[data-testid=edit-and-resend]") as HTMLButtonElement).click());
    const again = root.querySelector("[data-testid=edit-text]") as HTMLTextAreaElement;
    act(() => {
      again.value = "plums?";
      again.dispatchEvent(new Event("input", { bubbles: true }));
    });
    await act(async () => {
      again.dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", ctrlKey: true, bubbles: true }));
    });
    expect(onFork).toHaveBeenCalledWith("m1", "edit", "plums?");
    expect(root.querySelector("[data-testid=edit-text]")).toBeNull();
  });

  it("shows the server's refusal and keeps the editor open", async () => {
    const onFork = vi.fn(() => Promise.reject(new Error("the answer is still streaming")));
    const root = mount(body({}), onFork);
    act(() => (root.querySelector("[data-testid=edit-and-resend]") as HTMLButtonElement).click());
    await act(async () => (root.querySelector("[data-testid=edit-send]") as HTMLButtonElement).click());
    expect(root.querySelector("[role=alert]")?.textContent).toContain("still streaming");
    expect(root.querySelector("[data-testid=edit-text]")).not.toBeNull();
  });
});
