/**
 * The ledger trail of a Task as a tree (lanes → turns → actions → attempts), per-call and total usage, and the
 * cost-over-time series. Pure.
 *
 * Two sources: `GET /v1/ledger/tree?task_id=` (W3's route: the tree as stored), or — when that route is missing —
 * `GET /v1/ledger?task_id=` (lanes + events + unresolved attempts + usage), from which `treeFromTrail` rebuilds the
 * same tree: turns and the lane's execution action from their events, each other attempt under an action of its
 * own, typed from its `attempt.requested` payload (`reported` → model_call, `input` → tool_call), or under the action
 * the unresolved-attempt list names.
 * Must not do: I/O, or read the clock.
 */

export interface UsageBody {
  readonly input_tokens: number;
  readonly output_tokens: number;
  readonly cost_usd: number;
}

export interface UsageTotalsBody extends UsageBody {
  readonly completed_attempts?: number;
  readonly estimated_attempts?: number;
  readonly usage_estimated?: boolean;
}

export type AttemptStatus = "requested" | "completed" | "failed";
export type EntityStatus = "running" | "completed" | "failed";

export interface AttemptNode {
  readonly id: string;
  readonly attempt_no: number | null;
  readonly status: AttemptStatus;
  readonly resolved: boolean;
  readonly requested_at: string | null;
  readonly ended_at: string | null;
  readonly usage: UsageBody | null;
  readonly usage_estimated: boolean;
  readonly error: { readonly code?: string; readonly message?: string } | null;
}

export interface ActionNode {
  readonly id: string;
  readonly type: string;
  readonly name: string | null;
  readonly parent_action_id: string | null;
  readonly effect_kind?: string;
  readonly idempotency?: string;
  readonly status: EntityStatus;
  readonly attempts: readonly AttemptNode[];
}

export interface TurnNode {
  readonly id: string;
  readonly status: EntityStatus;
  readonly actions: readonly ActionNode[];
}

export interface LaneNode {
  readonly id: string;
  readonly name: string;
  readonly task_id: string | null;
  readonly conversation_id: string | null;
  readonly harness_call_id: string | null;
  readonly attributes: Record<string, unknown>;
  readonly created_at: string | null;
  readonly turns: readonly TurnNode[];
}

/** `GET /v1/ledger/tree` (and what `treeFromTrail` builds). */
export interface LedgerTree {
  readonly task_id?: string;
  readonly lanes: readonly LaneNode[];
  readonly usage: UsageTotalsBody | null;
}

/** `GET /v1/ledger` (today's route). */
export interface TrailBody {
  readonly lanes: readonly {
    readonly id: string;
    readonly name?: string;
    readonly task_id?: string | null;
    readonly conversation_id?: string | null;
    readonly harness_call_id?: string | null;
    readonly attributes?: Record<string, unknown>;
    readonly created_at?: string | null;
  }[];
  readonly events: readonly {
    readonly lane_id: string;
    readonly seq: number;
    readonly subject_id: string;
    readonly event_type: string;
    readonly occurred_at: string;
    readonly payload: Record<string, unknown>;
  }[];
  readonly unresolved_attempts?: readonly {
    readonly attempt: { readonly id: string; readonly attempt_no?: number | null };
    readonly action: { readonly id: string; readonly type: string; readonly name?: string | null; readonly parent_action_id?: string | null };
  }[];
  readonly usage?: UsageTotalsBody | null;
}

/** `GET /v1/ledger/series`: one point per attempt that reported usage. */
export interface SeriesPoint {
  readonly at: string;
  readonly task_id?: string | null;
  readonly call_id?: string | null;
  readonly input_tokens: number;
  readonly output_tokens: number;
  readonly cost_usd: number;
  readonly usage_estimated?: boolean;
}

/** One row of the calls table: one lane = one harness call. */
export interface CallRow {
  readonly laneId: string;
  readonly callId: string | null;
  readonly label: string;
  readonly conversationId: string | null;
  readonly inputTokens: number;
  readonly outputTokens: number;
  readonly tokens: number;
  readonly usd: number;
  readonly estimated: boolean;
  readonly attempts: number;
  readonly unresolved: number;
}

export interface Totals {
  readonly inputTokens: number;
  readonly outputTokens: number;
  readonly tokens: number;
  readonly usd: number;
  readonly estimated: boolean;
}

/** A point of the cumulative cost line. */
export interface CostPoint {
  readonly t: number;
  readonly usd: number;
  readonly cumulative: number;
  /** The Task the point belongs to (null when the series does not say). */
  readonly taskId: string | null;
}

const num = (value: unknown): number => (typeof value === "number" && Number.isFinite(value) && value >= 0 ? value : 0);

/** A usage object from a payload, or null when it reports none. */
export function usageOf(value: unknown): UsageBody | null {
  if (typeof value !== "object" || value === null) return null;
  const usage = value as Record<string, unknown>;
  return { input_tokens: num(usage["input_tokens"]), output_tokens: num(usage["output_tokens"]), cost_usd: num(usage["cost_usd"]) };
}

const TERMINAL: Record<string, AttemptStatus> = { "attempt.completed": "completed", "attempt.failed": "failed" };

function entityStatus(ended: string | undefined): EntityStatus {
  return ended === undefined ? "running" : ended.endsWith(".completed") ? "completed" : "failed";
}

function guessType(payload: Record<string, unknown>): string {
  if (payload["reported"] === true) return "model_call";
  if ("input" in payload) return "tool_call";
  return "unknown";
}

/** Rebuild the tree from `GET /v1/ledger` (see the module notes). */
export function treeFromTrail(trail: TrailBody): LedgerTree {
  const unresolvedAction = new Map<string, NonNullable<TrailBody["unresolved_attempts"]>[number]["action"]>();
  const attemptNo = new Map<string, number | null>();
  for (const item of trail.unresolved_attempts ?? []) {
    unresolvedAction.set(item.attempt.id, item.action);
    attemptNo.set(item.attempt.id, item.attempt.attempt_no ?? null);
  }
  const lanes: LaneNode[] = trail.lanes.map((lane) => {
    const events = trail.events.filter((e) => e.lane_id === lane.id).sort((a, b) => a.seq - b.seq);
    const turnIds: string[] = [];
    const turnEnd = new Map<string, string>();
    const executionIds: string[] = [];
    const actionInfo = new Map<string, { end?: string; payload: Record<string, unknown> }>();
    const attempts = new Map<string, { requested?: (typeof events)[number]; ended?: (typeof events)[number] }>();
    const attemptOrder: string[] = [];
    for (const event of events) {
      const kind = event.event_type.split(".")[0];
      if (event.event_type === "turn.started") turnIds.push(event.subject_id);
      else if (kind === "turn" && (event.event_type === "turn.completed" || event.event_type === "turn.failed")) turnEnd.set(event.subject_id, event.event_type);
      else if (event.event_type === "action.started") {
        executionIds.push(event.subject_id);
        actionInfo.set(event.subject_id, { payload: event.payload });
      } else if (event.event_type === "action.completed" || event.event_type === "action.failed") {
        const info = actionInfo.get(event.subject_id) ?? { payload: {} };
        actionInfo.set(event.subject_id, { ...info, end: event.event_type });
      } else if (kind === "attempt") {
        let entry = attempts.get(event.subject_id);
        if (!entry) {
          entry = {};
          attempts.set(event.subject_id, entry);
          attemptOrder.push(event.subject_id);
        }
        if (event.event_type === "attempt.requested") entry.requested ??= event;
        else if (event.event_type in TERMINAL) entry.ended ??= event;
      }
    }
    const attemptNode = (id: string): AttemptNode => {
      const entry = attempts.get(id) ?? {};
      const ended = entry.ended;
      const payload = ended?.payload ?? {};
      const error = payload["error"];
      return {
        id,
        attempt_no: attemptNo.get(id) ?? null,
        status: ended ? (TERMINAL[ended.event_type] ?? "failed") : "requested",
        resolved: ended !== undefined,
        requested_at: entry.requested?.occurred_at ?? null,
        ended_at: ended?.occurred_at ?? null,
        usage: ended ? usageOf(payload["usage"]) : null,
        usage_estimated: payload["usage_estimated"] === true,
        error: typeof error === "object" && error !== null ? (error as AttemptNode["error"]) : null,
      };
    };
    const execution = executionIds[0] ?? null;
    const actions: ActionNode[] = executionIds.map((id) => ({
      id,
      type: "tool_call",
      name: typeof actionInfo.get(id)?.payload["target"] === "string" ? `harness:${String(actionInfo.get(id)?.payload["target"])}` : null,
      parent_action_id: null,
      status: entityStatus(actionInfo.get(id)?.end),
      attempts: [],
    }));
    const byId = new Map(actions.map((a) => [a.id, a] as const));
    const push = (action: ActionNode, attempt: AttemptNode) => {
      (action.attempts as AttemptNode[]).push(attempt);
    };
    for (const id of attemptOrder) {
      const node = attemptNode(id);
      const payload = attempts.get(id)?.requested?.payload ?? {};
      const known = unresolvedAction.get(id);
      if (known) {
        let action = byId.get(known.id);
        if (!action) {
          action = { id: known.id, type: known.type, name: known.name ?? null, parent_action_id: known.parent_action_id ?? null, status: "running", attempts: [] };
          byId.set(action.id, action);
          actions.push(action);
        }
        push(action, node);
      } else if ("mode" in payload && execution !== null) {
        push(byId.get(execution) as ActionNode, node);
      } else {
        const action: ActionNode = {
          id: `action-of-${id}`,
          type: guessType(payload),
          name: null,
          parent_action_id: execution,
          status: node.status === "requested" ? "running" : node.status,
          attempts: [node],
        };
        byId.set(action.id, action);
        actions.push(action);
      }
    }
    const turns: TurnNode[] =
      turnIds.length > 0
        ? turnIds.map((id, index) => ({ id, status: entityStatus(turnEnd.get(id)), actions: index === 0 ? actions : [] }))
        : actions.length > 0
          ? [{ id: `turn-of-${lane.id}`, status: "running", actions }]
          : [];
    return {
      id: lane.id,
      name: lane.name ?? "main",
      task_id: lane.task_id ?? null,
      conversation_id: lane.conversation_id ?? null,
      harness_call_id: lane.harness_call_id ?? null,
      attributes: lane.attributes ?? {},
      created_at: lane.created_at ?? null,
      turns,
    };
  });
  return { lanes, usage: trail.usage ?? null };
}

/** An action's status for people: a child action (a model or tool call) has no action events of its own, so while
 * the tree says `running` its attempts decide: all resolved → the last one's outcome. */
export function actionStatus(action: ActionNode): EntityStatus {
  if (action.status !== "running" || action.attempts.length === 0) return action.status;
  if (action.attempts.some((a) => !a.resolved)) return "running";
  const last = action.attempts[action.attempts.length - 1];
  return last?.status === "completed" ? "completed" : "failed";
}

/** Every attempt of a lane, in tree order. */
export function laneAttempts(lane: LaneNode): AttemptNode[] {
  return lane.turns.flatMap((turn) => turn.actions.flatMap((action) => [...action.attempts]));
}

/** A call's heading: its target and effect key when the lane's attributes name them. */
export function laneLabel(lane: LaneNode): string {
  const target = lane.attributes["target"];
  const effect = lane.attributes["effect_key"];
  const parts = [typeof target === "string" ? target : null, typeof effect === "string" ? effect : null].filter(Boolean);
  return parts.length > 0 ? parts.join(" · ") : (lane.harness_call_id ?? lane.name);
}

/** One row per call (lane): tokens and USD summed over its attempts' usage. */
export function callRows(tree: LedgerTree): CallRow[] {
  return tree.lanes.map((lane) => {
    const attempts = laneAttempts(lane);
    let input = 0;
    let output = 0;
    let usd = 0;
    let estimated = false;
    for (const attempt of attempts) {
      if (attempt.usage_estimated) estimated = true;
      if (attempt.usage) {
        input += attempt.usage.input_tokens;
        output += attempt.usage.output_tokens;
        usd += attempt.usage.cost_usd;
      }
    }
    return {
      laneId: lane.id,
      callId: lane.harness_call_id,
      label: laneLabel(lane),
      conversationId: lane.conversation_id,
      inputTokens: input,
      outputTokens: output,
      tokens: input + output,
      usd: roundUsd(usd),
      estimated,
      attempts: attempts.length,
      unresolved: attempts.filter((a) => !a.resolved).length,
    };
  });
}

/** Totals: the server's roll-up when it sent one, else the sum of the rows. */
export function totals(tree: LedgerTree, rows: readonly CallRow[] = callRows(tree)): Totals {
  if (tree.usage) {
    const u = tree.usage;
    return {
      inputTokens: num(u.input_tokens),
      outputTokens: num(u.output_tokens),
      tokens: num(u.input_tokens) + num(u.output_tokens),
      usd: roundUsd(num(u.cost_usd)),
      estimated: u.usage_estimated === true,
    };
  }
  const input = rows.reduce((s, r) => s + r.inputTokens, 0);
  const output = rows.reduce((s, r) => s + r.outputTokens, 0);
  return {
    inputTokens: input,
    outputTokens: output,
    tokens: input + output,
    usd: roundUsd(rows.reduce((s, r) => s + r.usd, 0)),
    estimated: rows.some((r) => r.estimated),
  };
}

/** USD rounded to 1e-10 (sums of floats stay readable). */
export function roundUsd(value: number): number {
  return Math.round(value * 1e10) / 1e10;
}

/** The series points of a tree's attempts that reported usage (the chart's fallback source). */
export function seriesFromTree(tree: LedgerTree): SeriesPoint[] {
  return tree.lanes.flatMap((lane) =>
    laneAttempts(lane).flatMap((attempt) =>
      attempt.usage && attempt.ended_at
        ? [{ at: attempt.ended_at, task_id: lane.task_id, call_id: lane.harness_call_id, ...attempt.usage, usage_estimated: attempt.usage_estimated }]
        : [],
    ),
  );
}

/** The cumulative cost over time: points sorted by time (unreadable times dropped), each with the running total. */
export function costOverTime(points: readonly SeriesPoint[]): CostPoint[] {
  const timed = points
    .map((p) => ({ t: Date.parse(p.at), usd: num(p.cost_usd), taskId: p.task_id ?? null }))
    .filter((p) => Number.isFinite(p.t))
    .sort((a, b) => a.t - b.t);
  let running = 0;
  return timed.map((p) => {
    running += p.usd;
    return { t: p.t, usd: p.usd, cumulative: roundUsd(running), taskId: p.taskId };
  });
}

/** USD for people: `$1.23`; below a dollar up to 6 decimals (`$0.50`, `$0.011`, `$0.000123`). */
export function formatUsd(value: number): string {
  if (value === 0) return "$0.00";
  if (value >= 1) return `$${value.toFixed(2)}`;
  if (value < 0.000001) return "<$0.000001";
  const text = value.toFixed(6).replace(/0+$/, "");
  return `$${text.length < 4 ? value.toFixed(2) : text}`;
}

/** Tokens for people: `12,345`. */
export function formatTokens(value: number): string {
  return Math.round(value).toLocaleString("en-US");
}
