import { afterEach, describe, expect, it } from "vitest";
import { trailFixture } from "../ledger/fixtures";
import { DetailPanel, mergeMessages } from "./DetailPanel";
import type { ConversationBody, MessageBody } from "./http";
import { click, deferred, FakeApi, flush, type Mounted, mount } from "./testing";

let view: Mounted | null = null;
afterEach(() => {
  view?.unmount();
  view = null;
});

const t = (s: number) => new Date(Date.UTC(2026, 11, 1, 19, 0, s)).toISOString();

function work(id: string, effect: string, start: number, end: number, over: Partial<MessageBody> = {}): MessageBody {
  return {
    id,
    conversation_id: "w1",
    task_id: "t1",
    kind: "harness",
    key: "assistant",
    reply_to_message_id: null,
    purpose: "output",
    status: "completed",
    revision: 3,
    content: { version: "1.1", biz: "chat", meta: { effect_key: effect }, blocks: [{ id: "answer", type: "text", content: `answer of ${effect}` }] },
    created_at: t(start),
    updated_at: t(end),
    ...over,
  };
}

const conversation = (id: string, task: string): ConversationBody => ({
  id,
  name: "",
  actor_kind: "operator",
  actor_key: "router",
  task_id: task,
  created_at: t(0),
  updated_at: t(0),
});

function routerApi(messages: () => MessageBody[]): FakeApi {
  return new FakeApi()
    .on("GET", "/v1/conversations?task_id=t1", () => ({ data: [conversation("w1", "t1")] }))
    .on("GET", "/v1/conversations/w1/snapshot", () => ({ conversation: conversation("w1", "t1"), messages: messages(), cursor: 7 }));
}

const ROUTER = [work("m1", "plan", 0, 2), work("m2", "work/0", 3, 9), work("m3", "work/1", 3, 7), work("m4", "work/2", 4, 12), work("m5", "summarize", 13, 15)];

async function until(condition: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 5000;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await flush();
  }
}

const snapshots = (api: FakeApi) => api.calls.filter((c) => c.path.endsWith("/snapshot")).length;

describe("DetailPanel", () => {
  it("shows an empty state when nothing is selected", async () => {
    view = await mount(<DetailPanel taskId={null} api={new FakeApi()} />);
    expect(view.one("detail-panel")).toBeTruthy();
    expect(view.one("detail-empty").textContent).toContain("Select a message");
    expect(view.byTestId("ledger-open")).toHaveLength(0);
  });

  it("lays the Router's three parallel calls out side by side", async () => {
    const api = routerApi(() => ROUTER);
    view = await mount(<DetailPanel taskId="t1" running={false} api={api} />);
    const groups = view.byTestId("parallel-group");
    expect(groups).toHaveLength(3);
    const columns = (group: HTMLElement) => [...group.querySelectorAll<HTMLElement>('[data-testid="parallel-column"]')];
    expect(columns(groups[1] as HTMLElement).map((c) => c.dataset["actor"])).toEqual([
      "harness:assistant/work/0",
      "harness:assistant/work/1",
      "harness:assistant/work/2",
    ]);
    expect(columns(groups[1] as HTMLElement).map((c) => c.querySelector('[data-testid="message"]')?.getAttribute("data-message-id"))).toEqual(["m2", "m3", "m4"]);
    expect(columns(groups[0] as HTMLElement)).toHaveLength(1);
    expect(view.byTestId("message-text").map((e) => e.textContent)).toContain("answer of work/1");
    expect(view.byTestId("detail-empty")).toHaveLength(0);
  });

  it("uses the page's message renderer", async () => {
    view = await mount(
      <DetailPanel taskId="t1" running={false} api={routerApi(() => ROUTER)} renderMessage={(m) => <b data-testid="message" data-message-id={m.id}>{m.id}</b>} />,
    );
    expect(view.byTestId("message").map((e) => e.textContent)).toEqual(["m1", "m2", "m3", "m4", "m5"]);
  });

  it("says so when the Task has no work conversation", async () => {
    const api = new FakeApi().on("GET", "/v1/conversations?task_id=t1", () => ({ data: [] }));
    view = await mount(<DetailPanel taskId="t1" running={false} api={api} />);
    expect(view.one("detail-empty").textContent).toContain("no work conversation");
    expect(view.byTestId("ledger-open")).toHaveLength(1);
  });

  it("polls while the Task runs, merges by revision, and stops (after one last read) when it ends", async () => {
    let messages = [work("m2", "work/0", 3, 9, { status: "streaming", revision: 1 })];
    const api = routerApi(() => messages);
    view = await mount(<DetailPanel taskId="t1" running={true} api={api} pollMs={5} />);
    await until(() => snapshots(api) >= 3, "three reads while running");
    messages = [work("m2", "work/0", 3, 10, { revision: 5, content: { meta: { effect_key: "work/0" }, blocks: [{ id: "answer", type: "text", content: "done" }] } })];
    await until(() => view?.byTestId("message-text")[0]?.textContent === "done", "the newer revision");
    await view.rerender(<DetailPanel taskId="t1" running={false} api={api} pollMs={5} />);
    await flush();
    const settled = snapshots(api);
    for (let i = 0; i < 10; i += 1) await flush(); // well past several poll periods
    expect(snapshots(api)).toBe(settled);
  });

  it("drops a late answer for an earlier Task", async () => {
    const slow = deferred<unknown>();
    const api = new FakeApi()
      .on("GET", "/v1/conversations?task_id=old", () => slow.promise)
      .on("GET", "/v1/conversations?task_id=t1", () => ({ data: [conversation("w1", "t1")] }))
      .on("GET", "/v1/conversations/w1/snapshot", () => ({ conversation: conversation("w1", "t1"), messages: [work("m9", "work/9", 1, 2)], cursor: 1 }))
      .on("GET", "/v1/conversations/wold/snapshot", () => ({ conversation: conversation("wold", "old"), messages: [work("stale", "work/0", 1, 2)], cursor: 1 }));
    view = await mount(<DetailPanel taskId="old" running={false} api={api} />);
    await view.rerender(<DetailPanel taskId="t1" running={false} api={api} />);
    slow.resolve({ data: [conversation("wold", "old")] });
    await flush();
    expect(view.byTestId("message").map((e) => e.dataset["messageId"])).toEqual(["m9"]);
  });

  it("opens the ledger inside the panel and goes back", async () => {
    const api = routerApi(() => ROUTER).on("GET", "/v1/ledger?task_id=t1", () => trailFixture());
    view = await mount(<DetailPanel taskId="t1" running={false} api={api} />);
    await click(view.one("ledger-open"));
    expect(view.one("ledger-view")).toBeTruthy();
    expect(view.byTestId("ledger-call")).toHaveLength(2);
    expect(view.byTestId("parallel-group")).toHaveLength(0);
    await click(view.one("ledger-close"));
    expect(view.byTestId("parallel-group")).toHaveLength(3);
  });

  it("renders gate and question cards inside work messages", async () => {
    const gate = work("g1", "work/0", 1, 2, {
      status: "streaming",
      content: { meta: { effect_key: "work/0" }, blocks: [{ id: "gate/x", type: "ask", call_id: "call-1", title: "Permission needed", prompt: "run ls", status: "pending", choices: [] }] },
    });
    const api = routerApi(() => [gate]).on("GET", "/v1/harness/calls/call-1", () => ({ id: "call-1" }));
    view = await mount(<DetailPanel taskId="t1" running={false} api={api} />);
    expect(view.one("gate-card").dataset["state"]).toBe("pending");
    expect(view.one("gate-summary").textContent).toBe("run ls");
  });
});

describe("mergeMessages", () => {
  it("keeps the higher revision and never drops a shown message", () => {
    const a1 = work("a", "x", 0, 1, { revision: 1 });
    const a2 = work("a", "x", 0, 2, { revision: 2 });
    const b = work("b", "y", 0, 1);
    expect(mergeMessages([a2], [a1, b]).map((m) => [m.id, m.revision])).toEqual([
      ["a", 2],
      ["b", 3],
    ]);
    expect(mergeMessages([a1, b], [a2])).toEqual([a2, b]);
  });
});
