/**
 * <ReadOnlyOptions>: the options of a closed confirm or gate as text, the chosen one marked (in words, not colour
 * alone). Must not do: offer any control.
 */

import type { JSX } from "preact";

export interface ReadOnlyOptionsProps {
  readonly options: readonly { readonly value: string; readonly label: string }[];
  readonly chosen: string | null;
}

/** The options list of a terminal card (`card-options`; each `li` has `data-value` and `data-chosen`). */
export function ReadOnlyOptions({ options, chosen }: ReadOnlyOptionsProps): JSX.Element {
  return (
    <ul class="w2-options" data-testid="card-options" aria-label="Options">
      {options.map((option) => {
        const picked = option.value === chosen;
        return (
          <li key={option.value} data-value={option.value} data-chosen={picked ? "true" : "false"} class={picked ? "w2-chosen" : ""}>
            {picked ? "✓ " : ""}
            {option.label}
            {picked ? <span class="w2-visually-hidden"> (chosen)</span> : null}
          </li>
        );
      })}
    </ul>
  );
}
