// Batches items (stream frames) and hands them over once per animation frame, so a fast stream costs one render
// per frame, not one per event. A timer backs the animation frame up (hidden tabs get no animation frames).
// Must not do: drop or reorder items.

export interface Scheduler {
  frame: (callback: () => void) => number;
  cancelFrame: (handle: number) => void;
  timer: (callback: () => void, ms: number) => ReturnType<typeof setTimeout>;
  cancelTimer: (handle: ReturnType<typeof setTimeout>) => void;
}

const browserScheduler = (): Scheduler => ({
  frame: (callback) => (typeof requestAnimationFrame === "function" ? requestAnimationFrame(callback) : -1),
  cancelFrame: (handle) => {
    if (handle >= 0 && typeof cancelAnimationFrame === "function") cancelAnimationFrame(handle);
  },
  timer: (callback, ms) => setTimeout(callback, ms),
  cancelTimer: (handle) => clearTimeout(handle),
});

/** Collects items and calls `flush` with all of them at the next animation frame (or after `maxDelayMs`). */
export class FrameBatcher<T> {
  private items: T[] = [];
  private frameHandle: number | null = null;
  private timerHandle: ReturnType<typeof setTimeout> | null = null;
  private readonly scheduler: Scheduler;

  constructor(
    private readonly flush: (items: T[]) => void,
    private readonly maxDelayMs = 200,
    scheduler?: Scheduler,
  ) {
    this.scheduler = scheduler ?? browserScheduler();
  }

  /** Queue one item; the flush is scheduled if it is not already. */
  push(item: T): void {
    this.items.push(item);
    if (this.frameHandle === null && this.timerHandle === null) {
      this.frameHandle = this.scheduler.frame(() => this.run());
      this.timerHandle = this.scheduler.timer(() => this.run(), this.maxDelayMs);
    }
  }

  /** Hand over what is queued now. */
  run(): void {
    if (this.frameHandle !== null) this.scheduler.cancelFrame(this.frameHandle);
    if (this.timerHandle !== null) this.scheduler.cancelTimer(this.timerHandle);
    this.frameHandle = null;
    this.timerHandle = null;
    if (this.items.length === 0) return;
    const items = this.items;
    this.items = [];
    this.flush(items);
  }

  /** Drop what is queued and cancel the schedule (the visit ended). */
  cancel(): void {
    if (this.frameHandle !== null) this.scheduler.cancelFrame(this.frameHandle);
    if (this.timerHandle !== null) this.scheduler.cancelTimer(this.timerHandle);
    this.frameHandle = null;
    this.timerHandle = null;
    this.items = [];
  }
}
