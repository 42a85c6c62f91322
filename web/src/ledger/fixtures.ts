// A ledger trail shaped like the engine writes it (src/loopd/server/engine/_trail.py), for the ledger tests.
import type { TrailBody } from "./trail";

const at = (s: number) => new Date(Date.UTC(2026, 11, 1, 19, 0, s)).toISOString();

type Ev = TrailBody["events"][number];
function lane(id: string, events: [string, string, number, Record<string, unknown>?][]): Ev[] {
  return events.map(([event_type, subject_id, s, payload], index) => ({
    lane_id: id,
    seq: index + 1,
    subject_id,
    event_type,
    occurred_at: at(s),
    payload: payload ?? {},
  }));
}

/** Two calls of one Task: `work/0` finished (two model calls, one tool call); `work/1` cut short (unresolved). */
export function trailFixture(): TrailBody {
  const done = lane("lane-0", [
    ["run.started", "call-0", 1, { effect_key: "work/0" }],
    ["turn.started", "turn-0", 1],
    ["action.started", "exec-0", 1, { target: "assistant" }],
    ["attempt.requested", "att-exec-0", 1, { mode: "start", replica: "r1" }],
    ["attempt.requested", "att-model-1", 3, { reported: true }],
    ["attempt.completed", "att-model-1", 3, { usage: { input_tokens: 100, output_tokens: 20, cost_usd: 0.001 } }],
    ["attempt.requested", "att-tool-1", 4, { input: { cmd: "ls" } }],
    ["attempt.completed", "att-tool-1", 5, { status: "completed" }],
    ["turn.loopd.gate_opened", "turn-0", 5, { gate_id: "g1" }],
    ["attempt.requested", "att-model-2", 7, { reported: true }],
    ["attempt.completed", "att-model-2", 7, { usage: { input_tokens: 150, output_tokens: 30, cost_usd: 0.002 } }],
    ["attempt.completed", "att-exec-0", 8, { phase: "succeeded" }],
    ["action.completed", "exec-0", 8, { phase: "succeeded" }],
    ["turn.completed", "turn-0", 8, { phase: "succeeded" }],
    ["run.completed", "call-0", 8, { phase: "succeeded" }],
  ]);
  const cut = lane("lane-1", [
    ["run.started", "call-1", 2, { effect_key: "work/1" }],
    ["turn.started", "turn-1", 2],
    ["action.started", "exec-1", 2, { target: "assistant" }],
    ["attempt.requested", "att-exec-1", 2, { mode: "start", replica: "r1" }],
    ["attempt.requested", "att-model-3", 6, { reported: true }],
    ["attempt.completed", "att-model-3", 6, { usage: { input_tokens: 50, output_tokens: 5, cost_usd: 0.0005 } }],
  ]);
  return {
    lanes: [
      { id: "lane-0", name: "main", task_id: "t1", conversation_id: "w1", harness_call_id: "call-0", attributes: { target: "assistant", effect_key: "work/0" }, created_at: at(1) },
      { id: "lane-1", name: "main", task_id: "t1", conversation_id: "w1", harness_call_id: "call-1", attributes: { target: "assistant", effect_key: "work/1" }, created_at: at(2) },
    ],
    events: [...done, ...cut],
    unresolved_attempts: [
      {
        attempt: { id: "att-exec-1", attempt_no: 1 },
        action: { id: "exec-1", type: "tool_call", name: "harness:assistant", parent_action_id: null },
      },
    ],
    usage: { input_tokens: 300, output_tokens: 55, cost_usd: 0.0035, completed_attempts: 4, estimated_attempts: 0, usage_estimated: false },
  };
}
