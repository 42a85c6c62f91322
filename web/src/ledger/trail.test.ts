// @vitest-environment node
import { describe, expect, it } from "vitest";
import { chartGeometry } from "./chart";
import { trailFixture } from "./fixtures";
import { actionStatus, callRows, costOverTime, formatTokens, formatUsd, laneAttempts, seriesFromTree, totals, treeFromTrail } from "./trail";

describe("treeFromTrail", () => {
  it("rebuilds lanes → turns → actions → attempts from today's GET /v1/ledger", () => {
    const tree = treeFromTrail(trailFixture());
    expect(tree.lanes.map((l) => l.id)).toEqual(["lane-0", "lane-1"]);
    const [done, cut] = tree.lanes;
    expect(done?.turns).toHaveLength(1);
    const actions = done?.turns[0]?.actions ?? [];
    expect(actions.map((a) => [a.type, a.status, a.attempts.map((t) => t.id)])).toEqual([
      ["tool_call", "completed", ["att-exec-0"]],
      ["model_call", "completed", ["att-model-1"]],
      ["tool_call", "completed", ["att-tool-1"]],
      ["model_call", "completed", ["att-model-2"]],
    ]);
    expect(actions[0]?.name).toBe("harness:assistant");
    expect(actions[1]?.parent_action_id).toBe(actions[0]?.id);
    expect(done?.turns[0]?.status).toBe("completed");
    const unresolved = laneAttempts(cut ?? done!).filter((a) => !a.resolved);
    expect(unresolved.map((a) => [a.id, a.status, a.attempt_no])).toEqual([["att-exec-1", "requested", 1]]);
    expect(cut?.turns[0]?.status).toBe("running");
  });

  it("reads each attempt's usage, times and error", () => {
    const tree = treeFromTrail(trailFixture());
    const model = laneAttempts(tree.lanes[0]!).find((a) => a.id === "att-model-2");
    expect(model).toMatchObject({
      status: "completed",
      resolved: true,
      usage: { input_tokens: 150, output_tokens: 30, cost_usd: 0.002 },
      requested_at: "2026-12-01T19:00:07.000Z",
      ended_at: "2026-12-01T19:00:07.000Z",
    });
    const trail = trailFixture();
    const failed = treeFromTrail({
      ...trail,
      events: [
        ...trail.events,
        { lane_id: "lane-1", seq: 99, subject_id: "att-exec-1", event_type: "attempt.failed", occurred_at: "2026-12-01T19:00:09Z", payload: { error: { code: "interrupted", message: "crash" }, usage: null, usage_estimated: true } },
      ],
      unresolved_attempts: [],
    });
    const exec = laneAttempts(failed.lanes[1]!).find((a) => a.id === "att-exec-1");
    expect(exec).toMatchObject({ status: "failed", resolved: true, usage: null, usage_estimated: true, error: { code: "interrupted" } });
  });

  it("survives an empty trail and a lane without turn events", () => {
    expect(treeFromTrail({ lanes: [], events: [] })).toEqual({ lanes: [], usage: null });
    const bare = treeFromTrail({
      lanes: [{ id: "l" }],
      events: [{ lane_id: "l", seq: 1, subject_id: "a", event_type: "attempt.requested", occurred_at: "x", payload: {} }],
    });
    expect(bare.lanes[0]?.turns[0]?.actions[0]?.attempts[0]?.status).toBe("requested");
  });
});

describe("actionStatus", () => {
  it("lets the attempts decide for a child action the tree still calls running", () => {
    const attempt = { id: "a", attempt_no: 1, status: "completed" as const, resolved: true, requested_at: null, ended_at: null, usage: null, usage_estimated: false, error: null };
    const action = { id: "x", type: "model_call", name: "m", parent_action_id: "e", status: "running" as const, attempts: [attempt] };
    expect(actionStatus(action)).toBe("completed");
    expect(actionStatus({ ...action, attempts: [{ ...attempt, status: "failed" }] })).toBe("failed");
    expect(actionStatus({ ...action, attempts: [{ ...attempt, status: "requested", resolved: false }] })).toBe("running");
    expect(actionStatus({ ...action, attempts: [] })).toBe("running");
    expect(actionStatus({ ...action, status: "failed" })).toBe("failed");
  });
});

describe("calls, totals and the series", () => {
  it("sums tokens and USD per call, and totals from the server's roll-up", () => {
    const tree = treeFromTrail(trailFixture());
    const rows = callRows(tree);
    expect(rows.map((r) => [r.label, r.tokens, r.usd, r.attempts, r.unresolved])).toEqual([
      ["assistant · work/0", 300, 0.003, 4, 0],
      ["assistant · work/1", 55, 0.0005, 2, 1],
    ]);
    expect(totals(tree, rows)).toEqual({ inputTokens: 300, outputTokens: 55, tokens: 355, usd: 0.0035, estimated: false });
    expect(totals({ ...tree, usage: null }, rows)).toEqual({ inputTokens: 300, outputTokens: 55, tokens: 355, usd: 0.0035, estimated: false });
  });

  it("turns usage points into a cumulative line over time", () => {
    const series = costOverTime(seriesFromTree(treeFromTrail(trailFixture())));
    expect(series.map((p) => p.cumulative)).toEqual([0.001, 0.0015, 0.0035]);
    expect(series.map((p) => p.t)).toEqual([...series.map((p) => p.t)].sort((a, b) => a - b));
    expect(costOverTime([{ at: "bad", input_tokens: 1, output_tokens: 1, cost_usd: 1 }])).toEqual([]);
  });

  it("formats money and tokens", () => {
    expect(formatUsd(0)).toBe("$0.00");
    expect(formatUsd(1.234)).toBe("$1.23");
    expect(formatUsd(0.0035)).toBe("$0.0035");
    expect(formatUsd(0.5)).toBe("$0.50");
    expect(formatUsd(0.011)).toBe("$0.011");
    expect(formatUsd(0.0000001)).toBe("<$0.000001");
    expect(formatTokens(12345)).toBe("12,345");
  });
});

describe("chartGeometry", () => {
  it("draws a rising step line inside the plot, with dots and a description", () => {
    const series = costOverTime(seriesFromTree(treeFromTrail(trailFixture())));
    const chart = chartGeometry(series, { width: 320, height: 120 });
    expect(chart.line.startsWith(`M${chart.plot.left},${chart.plot.bottom}`)).toBe(true);
    expect(chart.dots).toHaveLength(3);
    const ys = chart.dots.map((d) => d.y);
    expect(ys).toEqual([...ys].sort((a, b) => b - a)); // cumulative: never goes down (y grows downwards)
    expect(chart.dots.at(-1)?.y).toBe(chart.plot.top);
    for (const dot of chart.dots) {
      expect(dot.x).toBeGreaterThanOrEqual(chart.plot.left);
      expect(dot.x).toBeLessThanOrEqual(chart.plot.right);
    }
    expect(chart.description).toContain("$0.0035 in total");
  });

  it("handles no points and a single point", () => {
    expect(chartGeometry([]).description).toBe("No cost recorded yet.");
    const one = chartGeometry([{ t: 0, usd: 0.5, cumulative: 0.5, taskId: null }]);
    expect(one.dots).toHaveLength(1);
    expect(one.line).not.toContain("NaN");
  });
});
