/**
 * <LedgerView>: the ledger of one Task — totals (tokens, USD), a chart of cost over time for the conversation, one
 * row per harness call with its tokens and USD, and the trail (lanes → turns → actions → attempts) with unresolved
 * attempts highlighted.
 *
 * Reads `GET /v1/ledger/tree?task_id=` (falling back to `GET /v1/ledger?task_id=`, rebuilt by `treeFromTrail`, when
 * that route is missing) and, with `conversationId`, `GET /v1/ledger/series?conversation_id=` (falling back to the
 * Task's own attempts). Re-reads every `pollMs` while `running`, and on "Refresh".
 * Must not do: write anything.
 */

import type { JSX } from "preact";
import { useCallback, useEffect, useMemo, useRef, useState } from "preact/hooks";
import { type Api, HttpError, errorText, httpApi } from "../detail/http";
import "../detail/theme.css";
import { CostChart } from "./CostChart";
import "./ledger.css";
import {
  actionStatus,
  type AttemptNode,
  callRows,
  costOverTime,
  formatTokens,
  formatUsd,
  type LedgerTree,
  laneLabel,
  type SeriesPoint,
  seriesFromTree,
  totals,
  type TrailBody,
  treeFromTrail,
} from "./trail";

export interface LedgerViewProps {
  readonly taskId: string;
  /** The user conversation the Task was asked in (the chart covers all its Tasks); without it, the Task alone. */
  readonly conversationId?: string | null;
  readonly running?: boolean;
  readonly onClose?: () => void;
  readonly api?: Api;
  readonly pollMs?: number;
}

interface Loaded {
  readonly tree: LedgerTree;
  readonly points: readonly SeriesPoint[];
  readonly seriesScope: "conversation" | "task";
}

const enc = encodeURIComponent;

/** The tree from W3's route, or rebuilt from today's trail route when that one is missing (404). */
export async function loadTree(api: Api, taskId: string, signal?: AbortSignal): Promise<LedgerTree> {
  try {
    return await api.get<LedgerTree>(`/v1/ledger/tree?task_id=${enc(taskId)}`, signal);
  } catch (exc) {
    if (!(exc instanceof HttpError && (exc.status === 404 || exc.status === 405))) throw exc;
  }
  return treeFromTrail(await api.get<TrailBody>(`/v1/ledger?task_id=${enc(taskId)}`, signal));
}

async function loadAll(api: Api, taskId: string, conversationId: string | null | undefined, signal: AbortSignal): Promise<Loaded> {
  const tree = await loadTree(api, taskId, signal);
  if (conversationId) {
    try {
      const series = await api.get<{ points: SeriesPoint[] }>(`/v1/ledger/series?conversation_id=${enc(conversationId)}`, signal);
      if (Array.isArray(series.points)) return { tree, points: series.points, seriesScope: "conversation" };
    } catch (exc) {
      if (signal.aborted) throw exc;
      // route missing or refused: the Task's own attempts below
    }
  }
  return { tree, points: seriesFromTree(tree), seriesScope: "task" };
}

function when(iso: string | null): string {
  if (!iso) return "";
  const t = Date.parse(iso);
  return Number.isFinite(t) ? new Date(t).toLocaleTimeString() : "";
}

function AttemptItem({ attempt }: { attempt: AttemptNode }): JSX.Element {
  const usage = attempt.usage;
  return (
    <li
      class="w2-attempt"
      data-testid="ledger-attempt"
      data-resolved={attempt.resolved ? "true" : "false"}
      data-attempt-id={attempt.id}
    >
      Attempt{attempt.attempt_no !== null ? ` #${attempt.attempt_no}` : ""}:{" "}
      {attempt.resolved ? attempt.status : "unresolved — outcome unknown"}
      {usage && (
        <span>
          {" "}
          · {formatTokens(usage.input_tokens + usage.output_tokens)} tokens · {formatUsd(usage.cost_usd)}
          {attempt.usage_estimated ? " (estimated)" : ""}
        </span>
      )}
      {!usage && attempt.usage_estimated && <span> · usage unknown</span>}
      {attempt.error?.message && <span class="w2-muted"> · {attempt.error.message}</span>}
      {(attempt.ended_at || attempt.requested_at) && (
        <span class="w2-muted"> · {when(attempt.ended_at ?? attempt.requested_at)}</span>
      )}
    </li>
  );
}

/** The ledger view of one Task. */
export function LedgerView({ taskId, conversationId, running = false, onClose, api = httpApi, pollMs = 2000 }: LedgerViewProps): JSX.Element {
  const [loaded, setLoaded] = useState<Loaded | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [loading, setLoading] = useState(true);
  const visit = useRef<AbortController | null>(null);

  const reload = useCallback(() => {
    visit.current?.abort();
    const controller = new AbortController();
    visit.current = controller;
    setLoading(true);
    loadAll(api, taskId, conversationId, controller.signal)
      .then((next) => {
        if (controller.signal.aborted) return;
        setLoaded(next);
        setError(null);
      })
      .catch((exc: unknown) => {
        if (!controller.signal.aborted) setError(errorText(exc));
      })
      .finally(() => {
        if (!controller.signal.aborted) setLoading(false);
      });
  }, [api, taskId, conversationId]);

  useEffect(() => {
    setLoaded(null);
    setError(null);
    reload();
    return () => visit.current?.abort();
  }, [reload]);

  useEffect(() => {
    if (!running) return;
    const timer = setInterval(reload, pollMs);
    return () => clearInterval(timer);
  }, [running, reload, pollMs]);

  const rows = useMemo(() => (loaded ? callRows(loaded.tree) : []), [loaded]);
  const sum = useMemo(() => (loaded ? totals(loaded.tree, rows) : null), [loaded, rows]);
  const series = useMemo(() => (loaded ? costOverTime(loaded.points) : []), [loaded]);

  return (
    <section class="w2-ledger" data-testid="ledger-view" aria-labelledby="w2-ledger-title" aria-busy={loading ? "true" : "false"}>
      <header>
        <h2 id="w2-ledger-title">Ledger</h2>
        <button type="button" class="w2-button" onClick={reload} disabled={loading}>
          Refresh
        </button>
        {onClose && (
          <button type="button" class="w2-button" data-testid="ledger-close" onClick={onClose}>
            Back to work
          </button>
        )}
      </header>
      {error && (
        <p class="w2-error" role="alert">
          Could not load the ledger: {error}
        </p>
      )}
      {!loaded && !error && <p class="w2-muted">Loading the ledger…</p>}
      {loaded && sum && (
        <>
          <dl class="w2-totals">
            <div>
              <dt>Tokens</dt>
              <dd data-testid="ledger-total-tokens" data-tokens={String(sum.tokens)}>
                {formatTokens(sum.tokens)}
                <span class="w2-muted">
                  {" "}
                  ({formatTokens(sum.inputTokens)} in / {formatTokens(sum.outputTokens)} out)
                </span>
              </dd>
            </div>
            <div>
              <dt>Cost</dt>
              <dd data-testid="ledger-total-usd" data-usd={String(sum.usd)}>
                {formatUsd(sum.usd)}
                {sum.estimated ? " (includes estimates)" : ""}
              </dd>
            </div>
          </dl>
          <figure>
            <CostChart
              series={series}
              highlightTaskId={loaded.seriesScope === "conversation" ? taskId : null}
              title={loaded.seriesScope === "conversation" ? "Cost over time in this conversation" : "Cost over time of this task"}
            />
            <figcaption>
              {loaded.seriesScope === "conversation" ? "Cumulative cost of every task in this conversation (this task's steps filled)" : "Cumulative cost of this task"}
            </figcaption>
          </figure>
          <h3>Calls</h3>
          {rows.length === 0 ? (
            <p class="w2-muted">This task made no harness calls.</p>
          ) : (
            <div class="w2-table-wrap">
              <table>
                <caption>Tokens and cost per harness call</caption>
                <thead>
                  <tr>
                    <th scope="col">Call</th>
                    <th scope="col" class="num">Attempts</th>
                    <th scope="col" class="num">Tokens</th>
                    <th scope="col" class="num">USD</th>
                  </tr>
                </thead>
                <tbody>
                  {rows.map((row) => (
                    <tr key={row.laneId} data-testid="ledger-call" data-call-id={row.callId ?? ""} data-tokens={String(row.tokens)} data-usd={String(row.usd)}>
                      <th scope="row">{row.label}</th>
                      <td class="num">
                        {row.attempts}
                        {row.unresolved > 0 ? ` (${row.unresolved} unresolved)` : ""}
                      </td>
                      <td class="num">{formatTokens(row.tokens)}</td>
                      <td class="num">
                        {formatUsd(row.usd)}
                        {row.estimated ? "*" : ""}
                      </td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )}
          <h3>Trail</h3>
          <div class="w2-trail">
            <ol aria-label="Lanes">
              {loaded.tree.lanes.map((lane) => (
                <li key={lane.id} data-testid="ledger-lane">
                  <details open>
                    <summary>
                      Lane {lane.name}: {laneLabel(lane)}
                    </summary>
                    <ol aria-label="Turns">
                      {lane.turns.map((turn, index) => (
                        <li key={turn.id}>
                          Turn {index + 1} <span class="w2-muted">({turn.status})</span>
                          <ol aria-label="Actions">
                            {turn.actions.map((action) => (
                              <li key={action.id}>
                                {action.type}
                                {action.name ? ` ${action.name}` : ""} <span class="w2-muted">({actionStatus(action)})</span>
                                <ol aria-label="Attempts">
                                  {action.attempts.map((attempt) => (
                                    <AttemptItem key={attempt.id} attempt={attempt} />
                                  ))}
                                </ol>
                              </li>
                            ))}
                          </ol>
                        </li>
                      ))}
                    </ol>
                  </details>
                </li>
              ))}
            </ol>
          </div>
        </>
      )}
    </section>
  );
}
