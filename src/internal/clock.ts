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

/** The timers due in one whole millisecond of real time, and the one Node timer that fires them. */
interface Bucket {
  /** The millisecond of performance.now(): every timer in it is due at or before this. */
  due: number;
  handle: NodeJS.Timeout;
  timers: Set<Timer>;
}

class Timer implements ClockTimer {
  /** When it comes due on the clock (advance() fires it once the clock reaches this). */
  readonly due: number;
  readonly #fn: () => void;
  readonly #bucket: Bucket;
  readonly #buckets: Map<number, Bucket>;

  constructor(due: number, fn: () => void, bucket: Bucket, buckets: Map<number, Bucket>) {
    this.due = due;
    this.#fn = fn;
    this.#bucket = bucket;
    this.#buckets = buckets;
  }

  cancel(): void {
    if (this.#bucket.timers.delete(this)) this.#dropIfEmpty();
  }

  /** Fires unless cancelled (by an earlier timer, say). */
  fire(): void {
    if (!this.#bucket.timers.delete(this)) return;
    this.#dropIfEmpty();
    this.#fn();
  }

  #dropIfEmpty(): void {
    const bucket = this.#bucket;
    if (bucket.timers.size > 0) return;
    clearTimeout(bucket.handle);
    if (this.#buckets.get(bucket.due) === bucket) this.#buckets.delete(bucket.due);
  }
}

export class DatabaseClock {
  #offsetMs = 0;
  /**
   * The timers not yet fired or cancelled, by the whole millisecond of real time
   * they are due in, referenced and unreferenced apart. Node's timers fire on whole
   * milliseconds anyway, and timers set together share one: a claim's leases,
   * the timeouts of the tasks started in one turn. (A Node timer per task was a
   * tenth of the worker's garbage.) Real time, not this clock's: a timer set after
   * an advance() must not join one set before it, whose Node timer fires later.
   */
  readonly #buckets = [new Map<number, Bucket>(), new Map<number, Bucket>()] as const;

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
   * advance(), in the millisecond it comes due. `unref`: the timer alone does
   * not keep the process alive.
   */
  setTimeout(fn: () => void, ms: number, unref = false): ClockTimer {
    const real = performance.now();
    const delay = Math.max(0, ms);
    const ms1 = Math.ceil(real + delay);
    const buckets = this.#buckets[unref ? 1 : 0];
    let bucket = buckets.get(ms1);
    if (bucket === undefined) {
      const handle = setTimeout(() => this.#fire(buckets, ms1), ms1 - real);
      if (unref) handle.unref();
      bucket = { due: ms1, handle, timers: new Set() };
      buckets.set(ms1, bucket);
    }
    const timer = new Timer(real + this.#offsetMs + delay, fn, bucket, buckets);
    bucket.timers.add(timer);
    return timer;
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
    const due = this.#buckets.flatMap((buckets) => [...buckets.values()].flatMap((b) => [...b.timers].filter((t) => t.due <= now)));
    // In their order; one that an earlier one cancelled does not fire.
    for (const t of due.sort((a, b) => a.due - b.due)) t.fire();
  }

  /**
   * A bucket's Node timer: every timer in it is due (its millisecond has come). The
   * bucket leaves the map first: a timer that one of these callbacks sets for the same
   * millisecond goes into a new bucket with a Node timer of its own, never into this
   * one, whose timer has already fired.
   */
  #fire(buckets: Map<number, Bucket>, ms1: number): void {
    const bucket = buckets.get(ms1);
    if (bucket === undefined) return;
    buckets.delete(ms1);
    for (const timer of [...bucket.timers]) timer.fire();
  }
}
