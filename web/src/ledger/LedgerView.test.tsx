import { afterEach, describe, expect, it } from "vitest";
import { HttpError } from "../detail/http";
import { FakeApi, type Mounted, mount } from "../detail/testing";
import { trailFixture } from "./fixtures";
import { LedgerView } from "./LedgerView";
import { treeFromTrail } from "./trail";

let view: Mounted | null = null;
afterEach(() => {
  view?.unmount();
  view = null;
});

describe("LedgerView", () => {
  it("shows calls, totals, the trail with unresolved attempts, and a labelled chart (today's trail route)", async () => {
    const api = new FakeApi().on("GET", "/v1/ledger?task_id=t1", () => trailFixture());
    view = await mount(<LedgerView taskId="t1" api={api} />);
    expect(api.calls.map((c) => c.path)).toEqual(["/v1/ledger/tree?task_id=t1", "/v1/ledger?task_id=t1"]);
    const calls = view.byTestId("ledger-call");
    expect(calls.map((r) => [r.dataset["callId"], r.dataset["tokens"], r.dataset["usd"]])).toEqual([
      ["call-0", "300", "0.003"],
      ["call-1", "55", "0.0005"],
    ]);
    expect(view.one("ledger-total-tokens").dataset["tokens"]).toBe("355");
    expect(view.one("ledger-total-usd").dataset["usd"]).toBe("0.0035");
    expect(view.one("ledger-total-usd").textContent).toContain("$0.0035");
    const attempts = view.byTestId("ledger-attempt");
    expect(attempts).toHaveLength(6);
    const unresolved = attempts.filter((a) => a.dataset["resolved"] === "false");
    expect(unresolved.map((a) => a.dataset["attemptId"])).toEqual(["att-exec-1"]);
    expect(unresolved[0]?.textContent).toContain("unresolved");
    const chart = view.one("ledger-chart");
    expect(chart.tagName.toLowerCase()).toBe("svg");
    expect(chart.querySelector("title")?.textContent).toBe("Cost over time of this task");
    expect(chart.querySelector("desc")?.textContent).toContain("$0.0035 in total");
    expect(chart.querySelectorAll("circle")).toHaveLength(3);
  });

  it("uses the tree route and the conversation's series when the server has them", async () => {
    const tree = treeFromTrail(trailFixture());
    const api = new FakeApi()
      .on("GET", "/v1/ledger/tree?task_id=t1", () => tree)
      .on("GET", "/v1/ledger/series?conversation_id=c1", () => ({
        conversation_id: "c1",
        points: [
          { at: "2026-12-01T18:00:00Z", task_id: "t0", call_id: "x", input_tokens: 10, output_tokens: 1, cost_usd: 0.01 },
          { at: "2026-12-01T19:00:03Z", task_id: "t1", call_id: "call-0", input_tokens: 100, output_tokens: 20, cost_usd: 0.001 },
        ],
      }));
    view = await mount(<LedgerView taskId="t1" conversationId="c1" api={api} />);
    expect(api.calls.map((c) => c.path)).toEqual(["/v1/ledger/tree?task_id=t1", "/v1/ledger/series?conversation_id=c1"]);
    const chart = view.one("ledger-chart");
    expect(chart.querySelector("title")?.textContent).toBe("Cost over time in this conversation");
    expect(chart.querySelectorAll("circle")).toHaveLength(2);
    expect(chart.querySelector("desc")?.textContent).toContain("$0.011 in total; this task's 1 marked with filled dots.");
    expect([...chart.querySelectorAll("circle")].map((c) => c.getAttribute("class"))).toEqual(["w2-dot other", "w2-dot"]);
  });

  it("shows an error it could not load, and an empty chart for a Task without calls", async () => {
    const failing = new FakeApi().on("GET", "/v1/ledger/tree?task_id=t1", () => {
      throw new HttpError(0, "network", "down");
    });
    view = await mount(<LedgerView taskId="t1" api={failing} />);
    expect(view.root.querySelector('[role="alert"]')?.textContent).toContain("Could not reach the server");
    view.unmount();
    const empty = new FakeApi().on("GET", "/v1/ledger?task_id=t1", () => ({ lanes: [], events: [], usage: { input_tokens: 0, output_tokens: 0, cost_usd: 0 } }));
    view = await mount(<LedgerView taskId="t1" api={empty} />);
    expect(view.byTestId("ledger-call")).toHaveLength(0);
    expect(view.one("ledger-total-usd").dataset["usd"]).toBe("0");
    expect(view.one("ledger-chart").querySelector("desc")?.textContent).toBe("No cost recorded yet.");
  });
});
