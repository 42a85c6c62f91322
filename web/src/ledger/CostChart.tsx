/**
 * <CostChart>: the cumulative cost over time as an inline SVG (no chart library), with <title> and <desc> so a
 * screen reader gets the figures; each dot carries its own <title>.
 * Must not do: fetch anything (the caller passes the series).
 */

import type { JSX } from "preact";
import { useId } from "preact/hooks";
import { chartGeometry } from "./chart";
import type { CostPoint } from "./trail";

export interface CostChartProps {
  readonly series: readonly CostPoint[];
  readonly title?: string;
  readonly width?: number;
  readonly height?: number;
  /** Points of this Task are drawn filled, the conversation's other Tasks' hollow. */
  readonly highlightTaskId?: string | null;
}

/** The chart; an empty series still renders the <svg> with "No cost recorded yet." */
export function CostChart({ series, title = "Cost over time", width = 320, height = 120, highlightTaskId = null }: CostChartProps): JSX.Element {
  const chart = chartGeometry(series, { width, height }, highlightTaskId);
  const id = useId();
  const { plot } = chart;
  return (
    <svg
      data-testid="ledger-chart"
      class="w2-chart"
      viewBox={`0 0 ${width} ${height}`}
      role="img"
      aria-labelledby={`${id}-title ${id}-desc`}
      preserveAspectRatio="xMidYMid meet"
    >
      <title id={`${id}-title`}>{title}</title>
      <desc id={`${id}-desc`}>{chart.description}</desc>
      <line class="w2-axis" x1={plot.left} y1={plot.bottom} x2={plot.right} y2={plot.bottom} />
      <line class="w2-axis" x1={plot.left} y1={plot.top} x2={plot.left} y2={plot.bottom} />
      {chart.yTicks.map((tick) => (
        <text key={`y${tick.y}`} class="w2-tick" x={plot.left - 4} y={tick.y} text-anchor="end" dominant-baseline="middle">
          {tick.label}
        </text>
      ))}
      {chart.xTicks.map((tick, index) => (
        <text
          key={`x${index}`}
          class="w2-tick"
          x={tick.x}
          y={height - 6}
          text-anchor={chart.xTicks.length === 1 ? "middle" : index === 0 ? "start" : "end"}
        >
          {tick.label}
        </text>
      ))}
      {chart.line && <path class="w2-line" d={chart.line} fill="none" />}
      {chart.dots.map((dot, index) => (
        <circle key={index} class={highlightTaskId === null || dot.highlighted ? "w2-dot" : "w2-dot other"} cx={dot.x} cy={dot.y} r={3}>
          <title>{dot.label}</title>
        </circle>
      ))}
      {chart.dots.length === 0 && (
        <text class="w2-tick" x={(plot.left + plot.right) / 2} y={(plot.top + plot.bottom) / 2} text-anchor="middle">
          No cost recorded yet
        </text>
      )}
    </svg>
  );
}
