// The chat components render the e2e selectors and behave as the contract says (props in, callbacks out).
import { render } from "preact";
import { act } from "preact/test-utils";
import { afterEach, describe, expect, it } from "vitest";
import type { ActorBody, ConversationBody, MessageBody } from "../api";
import { Composer } from "./Composer";
import { ConversationList } from "./ConversationList";
import { MessageView } from "./MessageView";
import { fromBody } from "./store";

let root: HTMLElement | null = null;
function mount(node: preact.ComponentChild): HTMLElement {
  root = document.createElement("div");
  document.body.appendChild(root);
  act(() => render(node, root as HTMLElement));
  return root;
}
afterEach(() => {
  if (root !== null) {
    render(null, root);
    root.remove();
    root = null;
  }
});
const q = (el: Element, sel: string) => el.querySelector(sel) as HTMLElement;
const flush = () => act(async () => await new Promise((resolve) => setTimeout(resolve, 0)));

function key(el: Element, keyName: string, shiftKey = false) {
  act(() => {
    el.dispatchEvent(new KeyboardEvent("keydown", { key: keyName, shiftKey, bubbles: true, cancelable: true }));
  });
}
function type(el: HTMLInputElement | HTMLTextAreaElement, value: string) {
  act(() => {
    el.value = value;
    el.dispatchEvent(new Event("input", { bubbles: true }));
  });
}

const ACTORS: ActorBody[] = [
  { kind: "operator", key: "router", display_name: "Router", description: "" },
  { kind: "harness", key: "assistant", display_name: "assistant", description: "" },
];

describe("Composer", () => {
  it("groups the picker into Operators and Harnesses", () => {
    const el = mount(<Composer actors={ACTORS} target="operator:router" onTarget={() => undefined} onSend={async () => undefined} />);
    const groups = [...el.querySelectorAll("[data-testid=actor-picker] optgroup")].map((g) => g.getAttribute("label"));
    expect(groups).toEqual(["Operators", "Harnesses"]);
    const options = [...el.querySelectorAll("[data-testid=actor-picker] option")].map((o) => [(o as HTMLOptionElement).value, o.textContent]);
    expect(options).toEqual([
      ["operator:router", "Router"],
      ["harness:assistant", "assistant"],
    ]);
  });

  it("Enter sends, Shift+Enter does not, and the text is kept when sending fails", async () => {
    const sent: string[] = [];
    let fail = true;
    const el = mount(
      <Composer
        actors={ACTORS}
        target="operator:router"
        onTarget={() => undefined}
        onSend={async (text) => {
          sent.push(text);
          if (fail) throw new Error("server down");
        }}
      />,
    );
    const input = q(el, "[data-testid=composer-input]") as HTMLTextAreaElement;
    type(input, "hello");
    key(input, "Enter", true);
    expect(sent).toEqual([]);
    key(input, "Enter");
    await flush();
    expect(sent).toEqual(["hello"]);
    expect(input.value).toBe("hello");
    expect(q(el, "[role=alert]").textContent).toContain("server down");
    fail = false;
    act(() => q(el, "[data-testid=composer-send]").click());
    await flush();
    expect(sent).toEqual(["hello", "hello"]);
    expect(input.value).toBe("");
  });
});

describe("ConversationList", () => {
  const conversation = (id: string, name: string): ConversationBody => ({
    id,
    name,
    actor_kind: "user",
    actor_key: "me",
    task_id: null,
    created_at: "2026-01-01T00:00:00Z",
    updated_at: "2026-01-01T00:00:00Z",
  });

  it("marks the active item and renames with Enter", async () => {
    const renamed: [string, string][] = [];
    const created: number[] = [];
    const el = mount(
      <ConversationList
        conversations={[conversation("c1", "First"), conversation("c2", "")]}
        activeId="c2"
        hasMore={false}
        error={null}
        onSelect={() => undefined}
        onCreate={() => created.push(1)}
        onRename={async (id, name) => {
          renamed.push([id, name]);
        }}
        onMore={() => undefined}
      />,
    );
    const items = [...el.querySelectorAll("[data-testid=conversation-item]")];
    expect(items.map((i) => i.getAttribute("data-conversation-id"))).toEqual(["c1", "c2"]);
    expect(items[1]?.getAttribute("aria-current")).toBe("true");
    expect(items[0]?.hasAttribute("aria-current")).toBe(false);
    act(() => q(el, "[data-testid=new-conversation]").click());
    expect(created).toEqual([1]);
    act(() => (el.querySelectorAll("[data-testid=rename-conversation]")[0] as HTMLElement).click());
    const input = q(el, "[data-testid=conversation-title-input]") as HTMLInputElement;
    expect(input.value).toBe("First");
    type(input, "Renamed");
    key(input, "Enter");
    await flush();
    expect(renamed).toEqual([["c1", "Renamed"]]);
    expect(el.querySelector("[data-testid=conversation-title-input]")).toBeNull();
  });
});

describe("ConversationList keyboard", () => {
  const conversation = (id: string, name: string): ConversationBody => ({
    id,
    name,
    actor_kind: "user",
    actor_key: "me",
    task_id: null,
    created_at: "2026-01-01T00:00:00Z",
    updated_at: "2026-01-01T00:00:00Z",
  });

  it("gives the focus back to the rename button after Enter or Escape", async () => {
    const el = mount(
      <ConversationList
        conversations={[conversation("c1", "First"), conversation("c2", "Second")]}
        activeId="c1"
        hasMore={false}
        error={null}
        onSelect={() => undefined}
        onCreate={() => undefined}
        onRename={async () => undefined}
        onMore={() => undefined}
      />,
    );
    const renameButton = (id: string) => q(el, `[data-testid=rename-conversation][data-conversation-id=${id}]`);
    act(() => renameButton("c2").click());
    const input = q(el, "[data-testid=conversation-title-input]") as HTMLInputElement;
    expect(document.activeElement).toBe(input);
    type(input, "Renamed");
    key(input, "Enter");
    await flush();
    expect(el.querySelector("[data-testid=conversation-title-input]")).toBeNull();
    expect(document.activeElement).toBe(renameButton("c2"));
    act(() => renameButton("c1").click());
    key(q(el, "[data-testid=conversation-title-input]"), "Escape");
    await flush();
    expect(document.activeElement).toBe(renameButton("c1"));
  });
});

describe("ConversationList titles", () => {
  const base: ConversationBody = {
    id: "c1",
    name: "",
    actor_kind: "user",
    actor_key: "me",
    task_id: null,
    created_at: "2026-01-01T00:00:00Z",
    updated_at: "2026-01-01T00:00:00Z",
  };

  it("shows the generated title and summary, and the owner's name before them", () => {
    const el = mount(
      <ConversationList
        conversations={[
          { ...base, id: "c1", title: "Weekend in Lisbon", summary: "The user plans a weekend trip." },
          { ...base, id: "c2", name: "Mine", title: "Generated" },
          { ...base, id: "c3", title: "" },
        ]}
        activeId={null}
        hasMore={false}
        error={null}
        onSelect={() => undefined}
        onCreate={() => undefined}
        onRename={async () => undefined}
        onMore={() => undefined}
      />,
    );
    const items = [...el.querySelectorAll("[data-testid=conversation-item]")] as HTMLElement[];
    expect(items[0]?.textContent).toBe("Weekend in LisbonThe user plans a weekend trip.");
    expect(items[0]?.getAttribute("title")).toBe("The user plans a weekend trip.");
    expect(q(items[0] as HTMLElement, "[data-testid=conversation-summary]").textContent).toBe("The user plans a weekend trip.");
    expect(items[1]?.textContent).toBe("Mine");
    expect(items[2]?.textContent).toMatch(/^Conversation of 2026-01-01/);
    expect(items[2]?.hasAttribute("title")).toBe(false);
  });
});

describe("MessageView", () => {
  const body: MessageBody = {
    id: "m1",
    conversation_id: "c1",
    task_id: "t1",
    kind: "harness",
    key: "assistant",
    reply_to_message_id: null,
    purpose: "response",
    status: "streaming",
    created_at: "2026-01-01T00:00:00Z",
    updated_at: "2026-01-01T00:00:00Z",
    revision: 4,
    content: {
      version: "1.1",
      biz: "chat",
      meta: {},
      blocks: [
        { id: "answer", type: "text", content: "Hello **world**" },
        { id: "tool/1", type: "tool", name: "bash", input: { command: "ls" }, output: "a.txt", status: "completed" },
        { id: "result", type: "result", format: "json", content: { ok: true } },
        { id: "p", type: "progress", content: "Thinking" },
      ],
    },
  };

  it("renders the selectors, attributes and blocks", () => {
    const el = mount(
      <MessageView message={fromBody(body, null)} badge="running" selected={false} authorName="assistant" onSelect={() => undefined} onHumanUpdate={() => undefined} />,
    );
    const message = q(el, "[data-testid=message]");
    expect(message.dataset).toMatchObject({ messageId: "m1", role: "response", author: "harness:assistant", revision: "4", taskId: "t1" });
    expect(q(el, "[data-testid=message-text]").textContent).toContain("Hello world");
    const tool = q(el, "[data-testid=tool-call]");
    expect(tool.tagName).toBe("DETAILS");
    expect(tool.textContent).toContain("bash");
    expect(tool.textContent).toContain('"command": "ls"');
    expect(tool.textContent).toContain("a.txt");
    expect(q(el, "[data-testid=block-result]").textContent).toContain('"ok": true');
    expect(q(el, "[data-testid=status-badge]").dataset["status"]).toBe("running");
    expect(q(el, "[data-testid=block-progress]").textContent).toContain("Thinking");
  });

  it("spins a progress block only while the message is written", () => {
    const live = mount(
      <MessageView message={fromBody(body, null)} badge="running" selected={false} authorName="assistant" onSelect={null} onHumanUpdate={() => undefined} />,
    );
    expect(q(live, "[data-testid=block-progress]").querySelector(".spinner")).not.toBeNull();
    render(null, live);
    const done = mount(
      <MessageView message={fromBody({ ...body, status: "completed" }, null)} badge="completed" selected={false} authorName="assistant" onSelect={null} onHumanUpdate={() => undefined} />,
    );
    expect(q(done, "[data-testid=block-progress]").textContent).toContain("Thinking");
    expect(q(done, "[data-testid=block-progress]").querySelector(".spinner")).toBeNull();
  });

  it("says 'waiting for you' for a waiting badge", () => {
    const el = mount(
      <MessageView message={fromBody(body, null)} badge="waiting" selected={false} authorName="assistant" onSelect={null} onHumanUpdate={() => undefined} />,
    );
    expect(q(el, "[data-testid=status-badge]").textContent).toBe("waiting for you");
    expect(el.querySelector(".details-button")).toBeNull();
  });
});
