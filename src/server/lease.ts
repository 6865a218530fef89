/**
 * One claimed task's lease, as the worker holding it sees it.
 *
 * The database decides who holds a lease; this object decides when the worker
 * stops trusting its own. After every successful extension it arms a timer
 * for `trustMs` from when that extension was *sent* (monotonic clock): if no
 * later extension succeeds by then, the handler is aborted with
 * LeaseExpiredError before any other server can have claimed the task.
 *
 * Modes: held → lost (heartbeat missed it, or the trust timer fired) or
 * released (the worker finished with it). Only the processor releases; the
 * heartbeater and the trust timer mark it lost.
 */
import { performance } from 'node:perf_hooks';
import { LeaseExpiredError } from '../errors.js';
import type { LeaseKey } from '../broker/leases.js';

export class Lease implements LeaseKey {
  readonly queue: string;
  readonly id: string;
  readonly seq: string;
  readonly token: string;
  readonly controller = new AbortController();
  /** The database no longer gives this worker the task: write nothing more about it. */
  lost = false;
  /** A ctx.transaction holds the row locked: the heartbeater leaves it alone. */
  inTransaction = false;
  /** ctx.transaction committed the completion: the processor writes nothing more. */
  completedInTransaction = false;
  /**
   * The handler has settled and its outcome is being written. A heartbeat that
   * misses the row now may just have raced that write; the write's own fencing
   * says whether the lease was lost.
   */
  settled = false;
  #released = false;
  #trustTimer: NodeJS.Timeout | undefined;
  readonly #trustMs: number;

  constructor(key: LeaseKey, trustMs: number, claimSentAt: number) {
    this.queue = key.queue;
    this.id = key.id;
    this.seq = key.seq;
    this.token = key.token;
    this.#trustMs = trustMs;
    this.extended(claimSentAt);
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  get key(): string {
    return `${this.queue}\0${this.id}`;
  }

  /** An extension sent at `sentAt` (performance.now()) succeeded. */
  extended(sentAt: number): void {
    if (this.#released || this.lost) return;
    clearTimeout(this.#trustTimer);
    const remaining = sentAt + this.#trustMs - performance.now();
    this.#trustTimer = setTimeout(() => this.lose(), Math.max(0, remaining));
    this.#trustTimer.unref();
  }

  /** The lease is gone: abort the handler, and drop every later write. */
  lose(): void {
    if (this.#released || this.lost) return;
    this.lost = true;
    clearTimeout(this.#trustTimer);
    this.abort(new LeaseExpiredError());
  }

  abort(reason: Error): void {
    if (!this.controller.signal.aborted) this.controller.abort(reason);
  }

  release(): void {
    this.#released = true;
    clearTimeout(this.#trustTimer);
  }
}
