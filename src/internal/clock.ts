/**
 * Time as pgasynq sees it: the database's now() for what the statements
 * decide (leases, due times, the recoverer's cutoff, retention, group grace
 * periods, cron ticks), and the process's monotonic clock for its own timers
 * (lease trust, task timeouts and deadlines, the heartbeat's pacing, the
 * claim's sweeps). Both move forward by one offset that only tests set: a
 * test that advances the clock sees leases run out, tasks come due and
 * timers fire without sleeping.
 */

import { performance } from 'node:perf_hooks';

/** A timer set on a clock (DatabaseClock.setTimeout). */
export interface ClockTimer {
  cancel(): void;
}

export class DatabaseClock {
  #offsetMs = 0;
  /** The timers not yet fired or cancelled, each with its due time on this clock. */
  readonly #timers = new Set<{ due: number; fire: () => void }>();

  /** How far ahead of PostgreSQL's now() the statements' now() is, in ms. */
  get offsetMs(): number {
    return this.#offsetMs;
  }

  /** The process's time in ms: performance.now() moved forward by the offset. */
  now(): number {
    return performance.now() + this.#offsetMs;
  }

  /**
   * Calls `fn` once `ms` of this clock's time has passed, in real time or by
   * advance(). `unref`: the timer alone does not keep the process alive.
   */
  setTimeout(fn: () => void, ms: number, unref = false): ClockTimer {
    const entry = { due: this.now() + ms, fire: () => (cancel(), fn()) };
    const handle = setTimeout(entry.fire, Math.max(0, ms));
    if (unref) handle.unref();
    const cancel = () => {
      clearTimeout(handle);
      this.#timers.delete(entry);
    };
    this.#timers.add(entry);
    return { cancel };
  }

  /** Resolves after `ms` of this clock's time. */
  sleep(ms: number): Promise<void> {
    return new Promise((resolve) => this.setTimeout(resolve, ms));
  }

  /** Moves the clock forward by `ms`: the statements' now(), now(), and the timers that came due fire. */
  advance(ms: number): void {
    if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`advance takes a finite number of ms ≥ 0 (got ${ms})`);
    this.#offsetMs += ms;
    const now = this.now();
    const due = [...this.#timers].filter((t) => t.due <= now).sort((a, b) => a.due - b.due);
    // In their order; one that an earlier one cancelled does not fire.
    for (const t of due) if (this.#timers.has(t)) t.fire();
  }
}
