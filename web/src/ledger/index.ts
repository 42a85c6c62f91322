// The ledger view (W2): opened from the detail panel's `ledger-open` button.
export { CostChart, type CostChartProps } from "./CostChart";
export { LedgerView, type LedgerViewProps } from "./LedgerView";
