/**
 * The processor: claims pending tasks (claimer.ts) into free worker slots, runs their
 * handlers with their context (task-context.ts), and hands each outcome to
 * outcomes.ts, which records it with one fenced write.
 *
 * Modes: idle → claiming (start) → draining (stopClaiming) → idle. Only the
 * claim loop adds to the server's lease table (lease-table.ts); only a
 * finished worker (or the give-back of held tasks at stop) removes an entry;
 * the heartbeater reads the table, extends those whose state asks for it and
 * reports the rows it missed (lease.ts: each lease is a state machine of its own).
 *
 * With prefetch (adaptive by default, see prefetch.ts), a claim may bring more
 * tasks than there are free slots: the extra ones wait in `#held`, leased and
 * heartbeated like running ones, and start the moment a slot frees, without a
 * round trip.
 */
import { setImmediate as nextTurn } from 'node:timers/promises';
import type { Db } from '../broker/db.js';
import type { ClaimedRow } from '../broker/claim.js';
import { requeue } from '../broker/leases.js';
import { LeaseExpiredError, ServerClosedError, TaskTimeoutError, coerceError } from '../model/errors.js';
import type { ClockTimer } from '../internal/clock.js';
import { isTransientConnectionError } from '../internal/db-errors.js';
import { FailureRun, type Logger } from '../internal/logger.js';
import type { Handler, TaskContext } from './handler.js';
import { decodePayload } from '../model/payload.js';
import { Task } from '../model/task.js';
import { MAX_TIMER_MS } from '../model/validate.js';
import { Lease } from './lease.js';
import { Outcomes, type Outcome, type OutcomePolicies } from './outcomes.js';
import { TaskContexts } from './task-context.js';
import { backoffMs } from '../internal/backoff.js';
import { Sleeper } from '../internal/sleeper.js';
import { Prefetch } from './prefetch.js';
import { Claimer } from './claimer.js';
import type { StatsCollector } from './stats.js';
import type { LeaseTable } from './lease-table.js';
import { traceProcess } from './tracing.js';

export interface ProcessorConfig extends OutcomePolicies {
  serverId: string;
  concurrency: number;
  /** Tasks claimed ahead of free slots, held leased until one frees; null: adaptive. */
  prefetch: number | null;
  queues: Readonly<Record<string, number>>;
  strictPriority: boolean;
  taskCheckInterval: number;
  leaseDuration: number;
  /** How long after a successful extension was sent the worker still trusts its lease. */
  leaseTrust: number;
  heartbeatInterval: number;
}

/** A handler that returned: one outcome shared by every such run. */
const SUCCEEDED: Outcome = Object.freeze({ error: null });

export class Processor {
  /** Leases of the tasks this server runs (held or running), and their counters. */
  readonly #leases: LeaseTable;
  /**
   * Called after a claim whose reply was slow (over a quarter of the heartbeat interval):
   * its leases' trust runs from the claim's send, and the regular beat could come too late.
   */
  readonly #onSlowClaim: () => void;
  readonly #db: Db;
  readonly #logger: Logger;
  readonly #cfg: ProcessorConfig;
  readonly #handler: Handler;
  /** Writes what became of each attempt. */
  readonly #outcomes: Outcomes;
  /** Makes each run's TaskContext. */
  readonly #contexts: TaskContexts;
  readonly #prefetch: Prefetch;
  readonly #claimer: Claimer;
  /** Handlers running now; a slot frees when its handler settles, before its outcome is written. */
  #running = 0;
  /** Claimed tasks waiting for a slot (prefetch), in claim order. */
  #held: { row: ClaimedRow; lease: Lease; claimedAt: number }[] = [];
  #claiming = false;
  #loop: Promise<void> | undefined;
  /** Woken by a notification or a freed slot: the loop claims again before sleeping. */
  readonly #sleeper = new Sleeper();
  #claimFailures = 0;
  /** Claim failures other than a lost database (the Db's health log reports those), rate-limited. */
  readonly #claimErrors: FailureRun;

  constructor(db: Db, logger: Logger, cfg: ProcessorConfig, handler: Handler, stats: StatsCollector, leases: LeaseTable, onSlowClaim: () => void) {
    this.#db = db;
    this.#leases = leases;
    this.#onSlowClaim = onSlowClaim;
    this.#logger = logger;
    this.#claimErrors = new FailureRun(logger, 'claim failed', 'claim succeeded again', 'error');
    this.#cfg = cfg;
    this.#handler = handler;
    // Adaptive prefetch holds at most what 50 rounds of every slot start, and never more than 1,000.
    this.#prefetch = new Prefetch(cfg.prefetch, cfg.concurrency, Math.min(1000, 50 * cfg.concurrency));
    this.#outcomes = new Outcomes(db, logger, cfg, stats, leases.counters);
    this.#contexts = new TaskContexts(db, logger, this.#outcomes, cfg.leaseDuration);
    this.#claimer = new Claimer(db, cfg);
  }

  start(): void {
    if (this.#claiming) return;
    this.#claiming = true;
    this.#loop = this.#claimLoop();
  }

  /** Tasks may have landed below the claim cursor's floors (a requeue): the next claim starts from the heads. */
  sweep(): void {
    this.#claimer.sweep();
    this.#poke();
  }

  /** New work may be waiting in `queue`. */
  notify(queue?: string): void {
    if (queue !== undefined && !(queue in this.#cfg.queues)) return;
    this.#poke();
  }

  #poke(): void {
    this.#sleeper.wake();
  }

  /**
   * Stops claiming; running tasks go on, held ones go back to pending.
   * Resolves once the claim loop has exited and the held tasks are back.
   */
  async stopClaiming(): Promise<void> {
    this.#claiming = false;
    this.#poke();
    await this.#loop;
    await this.#giveBackHeld();
  }

  /** Returns the held (never started) tasks to the front of pending. */
  async #giveBackHeld(): Promise<void> {
    await this.#giveBack(this.#held.splice(0).map((h) => h.lease));
  }

  /**
   * Returns never-started tasks to the front of pending without using a retry,
   * fenced by their lease tokens: a lease this worker no longer trusts may
   * still be its own in the database, and if it is not, nothing is written.
   */
  async #giveBack(leases: Lease[]): Promise<void> {
    if (leases.length === 0) return;
    let notGivenBack = leases.length;
    try {
      notGivenBack -= (await requeue(this.#db, leases)).length;
    } catch (err) {
      this.#logger.warn({ err, tasks: leases.length }, 'could not give back held tasks; the recoverer will');
    }
    // What was not given back is the recoverer's (or another worker's) now: each of those is a
    // lost lease, so every rescue of a task still matches a lease its worker counts as lost.
    this.#leases.counters.leasesLost += notGivenBack;
    for (const lease of leases) this.#forget(lease);
  }

  #forget(lease: Lease): void {
    lease.release();
    this.#leases.delete(lease);
  }

  /**
   * Waits up to `timeoutMs` for running tasks, then aborts the rest with
   * ServerClosedError and gives their leases back (requeue). Resolves within
   * `timeoutMs` plus `graceMs` even if a handler ignores its signal.
   */
  async drain(timeoutMs: number, graceMs = 1000): Promise<void> {
    await this.stopClaiming();
    if (await this.#idleWithin(timeoutMs)) return;
    this.#logger.warn(
      { tasks: this.#leases.size, shutdownTimeoutMs: timeoutMs },
      'shutdown timeout reached; aborting the running tasks, which go back to pending',
    );
    for (const lease of this.#leases.all()) lease.abort(new ServerClosedError());
    await this.#idleWithin(graceMs);
  }

  #idleWithin(ms: number): Promise<boolean> {
    return new Promise((resolve) => {
      const timer = this.#db.clock.setTimeout(() => {
        cancel();
        resolve(false);
      }, ms);
      const cancel = this.#leases.whenEmpty(() => {
        timer.cancel();
        resolve(true);
      });
    });
  }

  async #claimLoop(): Promise<void> {
    const { concurrency } = this.#cfg;
    while (this.#claiming) {
      const prefetch = this.#prefetch.count;
      const capacity = concurrency + prefetch;
      // Tasks whose outcome is still being written hold their leases too. Without a
      // cap on them, claims would outrun a database slower than the handlers, and
      // every heartbeat would extend a growing crowd of finished tasks.
      const free = Math.min(capacity - this.#running - this.#held.length, 2 * capacity - this.#leases.size);
      // Refill the held tasks once half of them have started: fewer, larger claims.
      if (free <= 0 || this.#held.length > prefetch / 2) {
        // Nothing to claim for: wait for a slot to free. A pending hint must not end
        // this wait at once, or the loop would spin and starve the event loop.
        await this.#sleep(this.#cfg.taskCheckInterval, true);
        continue;
      }
      this.#sleeper.clear();
      const sentAt = this.#db.clock.now();
      let rows: ClaimedRow[];
      let retryLimitedIn: number | undefined;
      let roundTrip: number;
      try {
        ({ rows, retryLimitedIn } = await this.#claimer.claim(free));
        roundTrip = this.#db.clock.now() - sentAt;
        this.#prefetch.claimed(roundTrip);
        this.#claimFailures = 0;
        this.#claimErrors.succeeded();
      } catch (err) {
        this.#claimFailures++;
        if (isTransientConnectionError(err)) this.#logger.debug({ err, failures: this.#claimFailures }, 'claim failed: database unreachable');
        else this.#claimErrors.failed(err);
        await this.#sleep(backoffMs(this.#claimFailures, 50, this.#cfg.taskCheckInterval));
        continue;
      }
      this.#leases.counters.claimed += rows.length;
      for (const row of rows) {
        const lease = new Lease({ queue: row.queue, id: row.id, seq: row.seq, token: row.lease_token }, this.#cfg.leaseTrust, sentAt, this.#db.clock);
        this.#leases.add(lease);
        this.#held.push({ row, lease, claimedAt: sentAt });
      }
      this.#dispatch();
      if (rows.length > 0 && roundTrip > this.#cfg.heartbeatInterval / 4) this.#onSlowClaim();
      if (rows.length < free) {
        // asynq sleeps interval/2 + rand[0, interval) when the queues are empty. A queue held
        // back by its limits is tried again sooner: another server's task may end at any time.
        const idle = this.#cfg.taskCheckInterval / 2 + Math.random() * this.#cfg.taskCheckInterval;
        await this.#sleep(retryLimitedIn === undefined ? idle : Math.min(idle, retryLimitedIn));
      } else {
        // Let the other workers that finish in this turn free their slots first: fewer, larger claims.
        await nextTurn();
      }
    }
  }

  /** Sleeps `ms`, less if a notification comes or a slot frees (unless `ignoreEarlierWake`, one that came before ends it at once). */
  #sleep(ms: number, ignoreEarlierWake = false): Promise<void> {
    return this.#claiming ? this.#sleeper.sleep(ms, ignoreEarlierWake) : Promise.resolve();
  }

  /** Starts held tasks in the free slots. */
  #dispatch(): void {
    while (this.#running < this.#cfg.concurrency && this.#held.length > 0) {
      const { row, lease, claimedAt } = this.#held.shift()!;
      // Its lease stopped being trusted before it started (a claim whose reply came late, a
      // stalled database while it was held): nothing has run, so give it back rather than
      // start a handler the recoverer may hand to another worker, or spend a retry on it.
      if (lease.lost) {
        void this.#giveBack([lease]);
        continue;
      }
      this.#running++;
      void this.#run(row, lease, claimedAt);
    }
  }

  async #run(row: ClaimedRow, lease: Lease, claimedAt: number): Promise<void> {
    const task = Task.restore(row.type, decodePayload(row.payload, row.payload_bytes), row.headers);
    const timers = this.#armTimeouts(row, lease, claimedAt);
    const startedAt = this.#db.clock.now();
    // traceProcess() waits for the tracing API's import when it has not loaded (start() loads
    // it first; this guards the wait): a trust that ran out meanwhile gives the task back unrun.
    let started = false;
    const outcome = await traceProcess(row, () => {
      started = !lease.lost;
      return started ? this.#invoke(task, this.#contexts.make(row, lease), lease) : Promise.resolve({ error: lease.abortReason ?? new LeaseExpiredError() });
    });
    // A handler that never ran says nothing of how long handlers run.
    if (started) this.#prefetch.ran(this.#db.clock.now() - startedAt);
    for (const t of timers) t.cancel();
    // The slot is free once the handler settled: a held task starts in it now, and the
    // next claim overlaps this outcome's write, which still holds (and heartbeats) the
    // lease until it lands.
    this.#running--;
    lease.settle();
    if (this.#claiming) this.#dispatch();
    this.#poke();
    if (!started) return this.#giveBack([lease]);
    try {
      await this.#outcomes.record(row, lease, task, outcome);
    } catch (err) {
      this.#logger.error({ err, task: { id: row.id, queue: row.queue } }, 'could not record the outcome; the recoverer will');
    } finally {
      this.#forget(lease);
      this.#poke();
    }
  }

  /**
   * Timeout and deadline, on the worker's monotonic timers. The timeout runs
   * from the handler's start; the deadline was measured on the database
   * clock at the claim, so the time the task was held counts against it.
   */
  #armTimeouts(row: ClaimedRow, lease: Lease, claimedAt: number): ClockTimer[] {
    const timers: ClockTimer[] = [];
    const after = (ms: number, message: string) => {
      if (ms <= 0) lease.abort(new TaskTimeoutError(message));
      else timers.push(this.#db.clock.setTimeout(() => lease.abort(new TaskTimeoutError(message)), Math.min(ms, MAX_TIMER_MS)));
    };
    if (row.timeout_ms > 0) after(row.timeout_ms, `task timeout of ${row.timeout_ms} ms exceeded`);
    if (row.deadline_in_ms !== null) after(row.deadline_in_ms - (this.#db.clock.now() - claimedAt), 'task deadline exceeded');
    return timers;
  }

  /**
   * Runs the handler; resolves with its outcome, or as soon as the signal aborts (asynq
   * does not wait either). Called once per task, so the handler runs at once, with no
   * promise chain before it.
   */
  #invoke(task: Task, ctx: TaskContext, lease: Lease): Promise<Outcome> {
    if (lease.abortReason) return Promise.resolve({ error: lease.abortReason });
    return new Promise<Outcome>((resolve) => {
      lease.onAbort((reason) => resolve({ error: reason }));
      const settle = (outcome: Outcome) => {
        lease.onAbort(undefined);
        resolve(outcome);
      };
      const failed = (thrown: unknown) => settle({ error: coerceError(thrown) });
      let running: unknown;
      try {
        running = this.#handler(task, ctx);
      } catch (thrown) {
        return failed(thrown);
      }
      Promise.resolve(running).then(() => settle(SUCCEEDED), failed);
    });
  }

  /** Resolves once every batched write has been flushed. */
  flushed(): Promise<void> {
    return this.#outcomes.flushed();
  }
}
