/**
 * One claimed task's lease, as the worker holding it sees it: one state
 * machine, changed only through its methods.
 *
 * The database decides who holds a lease; this object decides when the worker
 * stops trusting its own. After every successful extension it arms a timer
 * for `trustMs` from when that extension was *sent* (monotonic clock): if no
 * later extension succeeds by then, the handler is aborted with
 * LeaseExpiredError before any other server can have claimed the task.
 * Inside ctx.transaction too: the transaction's row lock keeps the task only
 * while its session lives, and a worker cut off from the database cannot see
 * whether it still does (nor has it the lock before its BEGIN got through).
 *
 *   held ──beginTransaction──▶ transaction ──endTransaction──▶ held | committed
 *   lost (the trust ran out during the transaction) ──endTransaction(committed)──▶ committed
 *   held ──settle──▶ settled                      (the outcome is being written)
 *   held | transaction | settled ──lose──▶ lost   (heartbeat missed it, trust timer)
 *   any ──release──▶ released                     (the processor is done with it)
 *
 * The heartbeater extends `held` and `settled` leases (a `transaction` lease
 * is row-locked by its own transaction; a `committed` one is finished) and
 * reports the rows it missed; only the processor begins, ends, settles and
 * releases.
 */
import type { ClockTimer, DatabaseClock } from '../internal/clock.js';
import { FailedPreconditionError, LeaseExpiredError } from '../model/errors.js';
import type { LeaseKey, LogLines } from '../broker/leases.js';
import { LogBuffer } from './log-buffer.js';

/** The lease as the broker's fenced writes take it: a plain object, to which a write adds its own fields. */
export const leaseKey = (l: Lease): LeaseKey => ({ queue: l.queue, id: l.id, seq: l.seq, token: l.token });

export type LeaseState = 'held' | 'transaction' | 'committed' | 'settled' | 'lost' | 'released';

export class Lease implements LeaseKey {
  readonly queue: string;
  readonly id: string;
  readonly seq: string;
  readonly token: string;
  #state: LeaseState = 'held';
  /** Why the handler was aborted; undefined while it may run. */
  #abortReason: Error | undefined;
  /** Made when a handler first reads ctx.signal: most never do, and each costs an EventTarget. */
  #controller: AbortController | undefined;
  #onAbort: ((reason: Error) => void) | undefined;
  #trustTimer: ClockTimer | undefined;
  readonly #trustMs: number;
  readonly #clock: DatabaseClock;
  /** ctx.log()'s lines that no write has carried yet; made at the first line (most handlers log none). */
  #logs: LogBuffer | undefined;
  /** Settles once every write that carries lines of this lease and leaves the task active has ended. */
  #linesLanding: Promise<void> | undefined;
  /** Resolves the promise transactionEnding gave out; undefined while no ctx.transaction is open. */
  #endTransaction: (() => void) | undefined;
  #transactionEnding: Promise<void> | undefined;

  /** `claimSentAt`: when the claim was sent, on `clock` (its now()). */
  constructor(key: LeaseKey, trustMs: number, claimSentAt: number, clock: DatabaseClock) {
    this.queue = key.queue;
    this.id = key.id;
    this.seq = key.seq;
    this.token = key.token;
    this.#trustMs = trustMs;
    this.#clock = clock;
    this.extended(claimSentAt);
  }

  get state(): LeaseState {
    return this.#state;
  }

  /** The database no longer gives this worker the task: write nothing more about it. */
  get lost(): boolean {
    return this.#state === 'lost';
  }

  /** Whether the heartbeater should extend it. */
  get heartbeats(): boolean {
    return this.#state === 'held' || this.#state === 'settled';
  }

  // --- log lines (they ride on the lease's writes) ---

  log(attempt: number, message: string): void {
    (this.#logs ??= new LogBuffer(this.#clock)).add(attempt, message);
  }

  /** The lines for the write about to be sent; undefined when there are none. */
  takeLogs(): LogLines | undefined {
    return this.#logs?.take();
  }

  /**
   * `write` carries lines takeLogs() gave it and leaves the task active (a
   * heartbeat, ctx.progress(), ctx.writeResult()): the write that ends the
   * attempt waits for it (linesLanding). The database keeps the lines of an
   * active task only, and a heartbeat that took the last lines just before
   * the handler returned could otherwise reach it after the completion.
   */
  carriesLogs(write: Promise<unknown>): void {
    const ended = write.then(
      () => {},
      () => {},
    );
    const earlier = this.#linesLanding;
    const landing: Promise<void> = (earlier ? Promise.all([earlier, ended]) : ended).then(() => {
      if (this.#linesLanding === landing) this.#linesLanding = undefined;
    });
    this.#linesLanding = landing;
  }

  /** Settles when the writes carriesLogs() was given have ended; undefined when none is under way (the common case: no await). */
  get linesLanding(): Promise<void> | undefined {
    return this.#linesLanding;
  }

  /** Lines a failed write took: sent again with the next one. */
  putBackLogs(lines: LogLines | undefined): void {
    if (lines !== undefined) (this.#logs ??= new LogBuffer(this.#clock)).putBack(lines);
  }

  // --- abort ---

  get signal(): AbortSignal {
    if (this.#controller === undefined) {
      this.#controller = new AbortController();
      if (this.#abortReason) this.#controller.abort(this.#abortReason);
    }
    return this.#controller.signal;
  }

  get abortReason(): Error | undefined {
    return this.#abortReason;
  }

  /** Called once, with the reason, when the handler is aborted (the processor stops waiting for it). */
  onAbort(fn: ((reason: Error) => void) | undefined): void {
    this.#onAbort = fn;
  }

  abort(reason: Error): void {
    if (this.#abortReason) return;
    this.#abortReason = reason;
    this.#controller?.abort(reason);
    this.#onAbort?.(reason);
  }

  // --- transitions ---

  /** An extension sent at `sentAt` (the clock's now()) succeeded. */
  extended(sentAt: number): void {
    if (this.#state === 'released' || this.#state === 'lost') return;
    this.#trustTimer?.cancel();
    const now = this.#clock.now();
    // A monotonic clock that stepped back (a broken VM clock source, a faked clock) would
    // stretch the trust by the step: the worker cannot tell how long it really waited, so
    // the lease is lost, never extended.
    if (now < sentAt) return this.lose();
    const remaining = sentAt + this.#trustMs - now;
    // Already past: lost now, not on a timer — the handler of a claim that came back this
    // late must not start in the meantime.
    if (remaining <= 0) return this.lose();
    this.#trustTimer = this.#clock.setTimeout(() => this.lose(), remaining, true);
  }

  /**
   * A heartbeat did not find the row. A held lease is lost; a settled one may
   * have just raced its outcome's write, whose own fencing decides. True when
   * this lost the lease.
   */
  missed(): boolean {
    if (this.#state !== 'held') return false;
    this.lose();
    return true;
  }

  /** The lease is gone: abort the handler, and drop every later write. */
  lose(): void {
    if (this.#state === 'released' || this.#state === 'lost' || this.#state === 'committed') return;
    this.#state = 'lost';
    this.#trustTimer?.cancel();
    this.abort(new LeaseExpiredError());
  }

  /** ctx.transaction is about to lock the row. */
  beginTransaction(): void {
    if (this.#state === 'committed') throw new FailedPreconditionError('the task was already completed by ctx.transaction');
    if (this.#state === 'transaction') throw new FailedPreconditionError('a ctx.transaction of this task is still open');
    if (this.#state === 'settled') throw new FailedPreconditionError('the handler has already returned');
    if (this.#state !== 'held') throw new LeaseExpiredError();
    this.#state = 'transaction';
    this.#transactionEnding = new Promise((resolve) => (this.#endTransaction = resolve));
  }

  /** Settles when the open ctx.transaction ends; undefined when none is open. */
  get transactionEnding(): Promise<void> | undefined {
    return this.#transactionEnding;
  }

  /**
   * ctx.transaction ended: it committed the completion, or it did not (and the lease is still held,
   * unless lost). A commit stands even if the trust timer gave the lease up meanwhile (a handler
   * that blocked its event loop): the transaction held the row locked from its fenced start, so the
   * commit is the database's word that the lease held to the end.
   */
  endTransaction(committed: boolean): void {
    if (committed && (this.#state === 'transaction' || this.#state === 'lost')) {
      this.#state = 'committed';
      this.#trustTimer?.cancel();
    } else if (this.#state === 'transaction') this.#state = 'held';
    this.#endTransaction?.();
    this.#endTransaction = this.#transactionEnding = undefined;
  }

  /** The handler returned or threw: its outcome is being written. */
  settle(): void {
    if (this.#state === 'held') this.#state = 'settled';
  }

  release(): void {
    this.#state = 'released';
    this.#onAbort = undefined;
    this.#trustTimer?.cancel();
  }
}
