/**
 * The outcome of each attempt, written with one fenced write per task:
 * completions and failures go in batches (batcher.ts), a give-back at
 * shutdown on its own. Each write matches the task's row only while this
 * worker's lease holds (broker/leases.ts); a write that matches nothing is a
 * fenced write, counted and logged, and the outcome is dropped.
 */
import type { ClaimedRow } from '../broker/claim.js';
import { complete, fail, requeue, snooze, type Completion, type Failure, type LeaseKey, type Snoozed } from '../broker/leases.js';
import type { Db } from '../broker/db.js';
import { backoffMs } from '../internal/backoff.js';
import type { Logger } from '../internal/logger.js';
import { isRevokeTask, isSkipRetry, LeaseExpiredError, ServerClosedError, TaskCanceledError, TaskTimeoutError } from '../model/errors.js';
import { attemptOf, maxAttemptsOf } from '../model/attempt.js';
import { snoozeOf } from '../model/snooze.js';
import { errorSummary, lastErrorText, retryDelayFor } from './retry.js';
import type { Task } from '../model/task.js';
import { Batcher } from './batcher.js';
import { leaseKey, type Lease } from './lease.js';
import type { StatsCollector } from './stats.js';

/** How a handler ended: null when it returned. */
export type Outcome = { error: Error | null };

/** What of the server's config an outcome reads: the user's policies that decide what a failure means, and a bound on one wait. */
export interface OutcomePolicies {
  /** How long an outcome waits for a ctx.transaction still open when the handler was given up on. */
  leaseDuration: number;
  retryDelay: ((retried: number, err: Error, task: Task) => number) | undefined;
  isFailure: (err: Error) => boolean;
  errorHandler: ((err: Error, task: Task) => void) | undefined;
}

/** The processor's counters this writes to. */
export interface OutcomeCounters {
  fencedWrites: number;
  leasesLost: number;
}

/** The tasks a fenced batch write reached, by seq (a task's key across queues). */
const seqSet = (rows: readonly LeaseKey[]) => new Set(rows.map((r) => r.seq));

/**
 * A task as log lines name it, never its payload: ctx.logger's bindings and
 * every line the worker writes about one run, so `task.attempt` is the same
 * number (1-based, see model/attempt.ts) on all of them.
 */
export const taskFields = (row: Pick<ClaimedRow, 'id' | 'type' | 'queue' | 'retried'>) => ({
  id: row.id,
  type: row.type,
  queue: row.queue,
  attempt: attemptOf(row.retried),
});

/** Whether a failed run sends its task to the archive: SkipRetry, or its retries spent (else to retry). */
export const archivesTask = (error: Error, retried: number, maxRetry: number): boolean => isSkipRetry(error) || retried >= maxRetry;

/** How a failed run ended, as its attempt record says: a timeout or deadline, a cancellation, or any other error. */
export function failureOutcome(error: Error): Failure['outcome'] {
  if (error instanceof TaskTimeoutError) return 'timeout';
  if (error instanceof TaskCanceledError) return 'canceled';
  return 'failed';
}

export class Outcomes {
  readonly #db: Db;
  readonly #logger: Logger;
  readonly #cfg: OutcomePolicies;
  readonly #stats: StatsCollector;
  readonly #counters: OutcomeCounters;
  readonly #completer: Batcher<Completion, Set<string>>;
  readonly #failer: Batcher<Failure, Set<string>>;
  readonly #snoozer: Batcher<Snoozed, Set<string>>;

  constructor(db: Db, logger: Logger, cfg: OutcomePolicies, stats: StatsCollector, counters: OutcomeCounters) {
    this.#db = db;
    this.#logger = logger;
    this.#cfg = cfg;
    this.#stats = stats;
    this.#counters = counters;
    this.#completer = new Batcher(async (items) => seqSet(await complete(db, items)));
    this.#failer = new Batcher(async (items) => seqSet(await fail(db, items)));
    this.#snoozer = new Batcher(async (items) => seqSet(await snooze(db, items)));
  }

  /**
   * What became of one attempt, written once: completed (or deleted), sent to
   * retry or the archive, snoozed, given back at shutdown, or nothing when the lease
   * was lost (the recoverer owns the task then) or ctx.transaction already
   * completed it. Counts it in the stats and logs a failure, never its payload.
   */
  async record(row: ClaimedRow, lease: Lease, task: Task, { error }: Outcome): Promise<void> {
    const { queue } = row;
    // The handler was given up on (its lease's trust ran out while it blocked or was frozen, a timeout)
    // with its ctx.transaction open: that transaction's end decides, since its commit completes the task.
    const ending = lease.transactionEnding;
    if (ending) await this.#within(ending, this.#cfg.leaseDuration);
    if (lease.state === 'committed') {
      this.#stats.processed(queue);
      // Losing the lease's trust during a transaction that then committed is no failure of the handler's.
      if (error && !(error instanceof LeaseExpiredError && error === lease.abortReason))
        this.#logger.warn({ err: errorSummary(error), task: taskFields(row) }, 'handler failed after its transaction committed; the task stays completed');
      return;
    }
    const shutdown = error instanceof ServerClosedError && lease.abortReason === error;
    // A snooze is no failure: no errorHandler, no stats, no retry used.
    const snoozed = error ? snoozeOf(error) : undefined;
    if (error && !shutdown && !snoozed && this.#cfg.errorHandler) {
      try {
        this.#cfg.errorHandler(error, task);
      } catch (err) {
        this.#logger.error({ err }, 'errorHandler threw');
      }
    }
    // The writes that carry earlier lines land first (see Lease.carriesLogs).
    const landing = lease.linesLanding;
    if (landing) await landing;
    if (lease.lost) return this.#dropped(lease, row);
    // The lines ctx.log() kept since the last write go with this one (taken once: a retried write sends them again).
    const lines = lease.takeLogs();
    if (shutdown) {
      const item = { ...leaseKey(lease), lines };
      await this.#write(lease, 'requeue', async () => seqSet(await requeue(this.#db, [item])));
      return;
    }
    if (snoozed) {
      const item = { ...leaseKey(lease), lines, delayMs: snoozed.delayMs };
      if (await this.#write(lease, 'snooze', () => this.#snoozer.add(item))) {
        this.#logger.debug({ task: taskFields(row), delayMs: snoozed.delayMs }, 'task snoozed');
      }
      return;
    }
    if (!error || isRevokeTask(error)) {
      // RevokeTask is asynq's markAsDone: counted as processed, deleted even with retention.
      // Spelt out rather than spread from leaseKey(): this runs for every task.
      const item: Completion = { queue: lease.queue, id: lease.id, seq: lease.seq, token: lease.token, lines, keep: !error && row.retention_ms > 0 };
      if (await this.#write(lease, 'complete', () => this.#completer.add(item))) {
        this.#stats.processed(queue);
      }
      return;
    }
    const archive = archivesTask(error, row.retried, row.max_retry);
    const counts = archive || this.#countsAsFailure(error);
    const delayMs = archive ? 0 : retryDelayFor(this.#cfg.retryDelay, row.retried, error, task, this.#logger);
    const failure: Failure = { ...leaseKey(lease), lines, archive, counts, delayMs, error: lastErrorText(error), outcome: failureOutcome(error) };
    if (!(await this.#write(lease, archive ? 'archive' : 'retry', () => this.#failer.add(failure)))) return;
    if (counts) {
      this.#stats.processed(queue);
      this.#stats.failed(queue);
    }
    // One line per failed attempt, never the payload: what failed, which attempt of how many
    // (task.attempt of maxAttempts, both 1-based like ctx.attempt), and what comes next. A
    // failure that does not count is retried as the same attempt number.
    // retried/maxRetry as ctx.retryCount/ctx.maxRetry saw them in this attempt: retries spent before it.
    const fields = {
      task: taskFields(row),
      maxAttempts: maxAttemptsOf(row.max_retry),
      retried: row.retried,
      maxRetry: row.max_retry,
      err: errorSummary(error),
    };
    if (archive) this.#logger.error({ ...fields, reason: isSkipRetry(error) ? 'skip-retry' : 'retries-exhausted' }, 'task archived');
    else this.#logger.warn({ ...fields, counted: counts, retryInMs: Math.round(delayMs) }, 'task failed; will retry');
  }

  #countsAsFailure(err: Error): boolean {
    try {
      return this.#cfg.isFailure(err);
    } catch (thrown) {
      this.#logger.error({ err: thrown }, 'isFailure threw; counting the error as a failure');
      return true;
    }
  }

  /**
   * Runs one fenced write, retrying database errors with backoff while the
   * lease is still trusted (asynq's syncer). False when the write was fenced
   * off or could not be made in time: the recoverer then owns the task.
   */
  async #write(lease: Lease, what: string, write: () => Promise<Set<string>>): Promise<boolean> {
    for (let attempt = 0; ; attempt++) {
      try {
        if ((await write()).has(lease.seq)) return true;
        this.fenced(lease, what);
        return false;
      } catch (err) {
        if (lease.lost) {
          // The trust ran out before the write could land: the recoverer owns the task now.
          this.#dropped(lease);
          return false;
        }
        if (attempt === 0) this.#logger.warn({ err, task: { id: lease.id, queue: lease.queue } }, `${what} failed; retrying while the lease holds`);
        await this.#db.clock.sleep(backoffMs(attempt, 50, 2000));
      }
    }
  }

  /** Counts and logs a lease lost before its attempt's outcome was written (`row`: when it is at hand, for the attempt number). */
  #dropped(lease: Lease, row?: ClaimedRow): void {
    this.#counters.leasesLost++;
    this.#logger.warn({ task: row ? taskFields(row) : { id: lease.id, queue: lease.queue } }, 'lease lost; the outcome of this attempt is dropped');
  }

  /** Counts and logs a fenced write: the lease was gone when it reached the database. */
  fenced(lease: Lease, what: string): void {
    this.#counters.fencedWrites++;
    this.#logger.warn({ task: { id: lease.id, queue: lease.queue }, write: what }, 'fenced write rejected: the lease is no longer held');
  }

  /** Settles when `promise` does, or after `ms` on the clock, whichever comes first. */
  #within(promise: Promise<void>, ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = this.#db.clock.setTimeout(resolve, ms);
      void promise.then(() => {
        timer.cancel();
        resolve();
      });
    });
  }

  /** Resolves once every batched write has been flushed. */
  async flushed(): Promise<void> {
    await Promise.all([this.#completer.drained(), this.#failer.drained(), this.#snoozer.drained()]);
  }
}
