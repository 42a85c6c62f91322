// Generation tokens: a callback from an earlier visit (a conversation switched away from) never reaches a later one.
// Pure. Must not do: timers or I/O.

/** One visit's token: `current` stays true until a newer token is issued (or the visit is ended). */
export interface Generation {
  readonly id: number;
  readonly current: boolean;
  /** Aborted when this generation stops being current: pass it to fetches and streams of this visit. */
  readonly signal: AbortSignal;
  /** Wrap a callback so that it runs only while this generation is current (else it is dropped). */
  guard<A extends unknown[]>(callback: (...args: A) => void): (...args: A) => void;
}

/** Issues generation tokens; `next()` ends the previous one (its signal aborts, its guarded callbacks go quiet). */
export class Generations {
  private counter = 0;
  private active: { id: number; controller: AbortController } | null = null;

  /** End the current generation and start a new one. */
  next(): Generation {
    this.end();
    this.counter += 1;
    const id = this.counter;
    const controller = new AbortController();
    this.active = { id, controller };
    const isCurrent = (): boolean => this.active !== null && this.active.id === id;
    return {
      id,
      get current() {
        return isCurrent();
      },
      signal: controller.signal,
      guard:
        <A extends unknown[]>(callback: (...args: A) => void) =>
        (...args: A) => {
          if (isCurrent()) callback(...args);
        },
    };
  }

  /** End the current generation without starting another (e.g. on unmount). */
  end(): void {
    if (this.active !== null) {
      const { controller } = this.active;
      this.active = null;
      controller.abort();
    }
  }
}
