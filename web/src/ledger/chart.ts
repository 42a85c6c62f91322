/**
 * Geometry of the cost-over-time chart (pure): a step line of the cumulative USD, one dot per attempt that reported
 * usage, two ticks per axis, and the sentence the SVG's <desc> says.
 * Must not do: I/O, read the clock, or render.
 */

import { type CostPoint, formatUsd } from "./trail";

export interface ChartDot {
  readonly x: number;
  readonly y: number;
  readonly label: string;
  /** The point belongs to the highlighted Task. */
  readonly highlighted: boolean;
}

export interface ChartGeometry {
  readonly width: number;
  readonly height: number;
  readonly line: string;
  readonly dots: readonly ChartDot[];
  readonly xTicks: readonly { x: number; label: string }[];
  readonly yTicks: readonly { y: number; label: string }[];
  readonly plot: { readonly left: number; readonly right: number; readonly top: number; readonly bottom: number };
  readonly description: string;
}

export interface ChartSize {
  readonly width: number;
  readonly height: number;
}

const PAD = { left: 66, right: 10, top: 10, bottom: 22 };

/** hh:mm:ss in UTC-independent local form (the caller's locale decides the zone). */
export function clockText(t: number): string {
  const d = new Date(t);
  const two = (n: number) => String(n).padStart(2, "0");
  return `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
}

const round = (n: number) => Math.round(n * 100) / 100;

/** The chart of `series` (sorted by time, as `costOverTime` returns it) in a `size` viewBox. */
export function chartGeometry(
  series: readonly CostPoint[],
  size: ChartSize = { width: 320, height: 120 },
  highlightTaskId: string | null = null,
): ChartGeometry {
  const plot = { left: PAD.left, right: size.width - PAD.right, top: PAD.top, bottom: size.height - PAD.bottom };
  const first = series[0];
  const last = series[series.length - 1];
  if (!first || !last) {
    return { width: size.width, height: size.height, line: "", dots: [], xTicks: [], yTicks: [], plot, description: "No cost recorded yet." };
  }
  const span = last.t - first.t;
  const max = last.cumulative > 0 ? last.cumulative : 1;
  const x = (t: number) => round(span > 0 ? plot.left + ((t - first.t) / span) * (plot.right - plot.left) : (plot.left + plot.right) / 2);
  const y = (usd: number) => round(plot.bottom - (usd / max) * (plot.bottom - plot.top));
  const parts = [`M${x(first.t)},${y(0)}`];
  for (const point of series) parts.push(`H${x(point.t)}`, `V${y(point.cumulative)}`);
  if (span > 0) parts.push(`H${round(plot.right)}`);
  const dots = series.map((p) => ({
    x: x(p.t),
    y: y(p.cumulative),
    label: `${clockText(p.t)}: +${formatUsd(p.usd)}${highlightTaskId !== null && p.taskId === highlightTaskId ? " (this task)" : ""}, ${formatUsd(p.cumulative)} so far`,
    highlighted: highlightTaskId !== null && p.taskId === highlightTaskId,
  }));
  const xTicks = span > 0 ? [{ x: plot.left, label: clockText(first.t) }, { x: plot.right, label: clockText(last.t) }] : [{ x: x(first.t), label: clockText(first.t) }];
  const yTicks = [
    { y: plot.bottom, label: "$0" },
    { y: plot.top, label: formatUsd(last.cumulative) },
  ];
  const count = series.length;
  const description =
    `Cumulative cost over time: ${count} ${count === 1 ? "call step" : "call steps"} reported usage` +
    (span > 0 ? ` between ${clockText(first.t)} and ${clockText(last.t)}` : ` at ${clockText(first.t)}`) +
    `, ${formatUsd(last.cumulative)} in total` +
    (highlightTaskId !== null && series.some((p) => p.taskId !== highlightTaskId)
      ? `; this task's ${series.filter((p) => p.taskId === highlightTaskId).length} marked with filled dots.`
      : ".");
  return { width: size.width, height: size.height, line: parts.join(" "), dots, xTicks, yTicks, plot, description };
}
