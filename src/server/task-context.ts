/**
 * The TaskContext a handler runs with: what it knows of its task, and what it
 * may do about it while its lease holds. Every write it makes carries the
 * lease's token, and with it the lines ctx.log() kept since the last write:
 * writeResult and progress (one statement each), the transaction that
 * completes the task with the handler's own writes, the dependencies'
 * results. A write the database fences off loses the lease: the handler is
 * aborted, and nothing more is written.
 */
import type { AnyTransaction, Db } from '../broker/db.js';
import { dependencyResults } from '../broker/dependencies.js';
import { completeHeld, lockLease, writeProgress, writeResult, type LeaseKey, type WithLines } from '../broker/leases.js';
import type { ClaimedRow } from '../broker/claim.js';
import { durableTransaction } from '../broker/transaction.js';
import type { Logger } from '../internal/logger.js';
import { attemptOf } from '../model/attempt.js';
import { FailedPreconditionError, LeaseExpiredError } from '../model/errors.js';
import { logLine, progressJson } from '../model/following.js';
import { encodePayload } from '../model/payload.js';
import type { TaskContext } from './handler.js';
import { leaseKey, type Lease } from './lease.js';
import { taskFields, type Outcomes } from './outcomes.js';

export class TaskContexts {
  readonly #db: Db;
  readonly #logger: Logger;
  /** Counts and logs the writes fenced off. */
  readonly #outcomes: Outcomes;
  readonly #leaseDuration: number;

  constructor(db: Db, logger: Logger, outcomes: Outcomes, leaseDuration: number) {
    this.#db = db;
    this.#logger = logger;
    this.#outcomes = outcomes;
    this.#leaseDuration = leaseDuration;
  }

  /** The handler's context for one run. Its signal and logger are made when first read: most handlers use neither. */
  make(row: ClaimedRow, lease: Lease): TaskContext {
    return new RunContext(this, row, lease);
  }

  /** The logger of one run: the server's, with the task's fields. */
  loggerFor(row: ClaimedRow): Logger {
    return this.#logger.child({ task: taskFields(row) });
  }

  /** Keeps a ctx.log() line with the lease, to go with its next write; refused once the lease is lost. */
  log(lease: Lease, attempt: number, message: string): void {
    const line = logLine(message);
    if (lease.abortReason instanceof LeaseExpiredError) throw lease.abortReason;
    lease.log(attempt, line);
  }

  dependencyResults(row: ClaimedRow): Promise<Map<string, unknown>> {
    return dependencyResults(this.#db, row.seq);
  }

  async writeResult(lease: Lease, data: unknown): Promise<void> {
    const encoded = encodePayload(data, 'result');
    await this.#fencedWrite(lease, 'result', (l) => writeResult(this.#db, l, encoded.json, encoded.bytes));
  }

  async progress(lease: Lease, value: unknown): Promise<void> {
    const json = progressJson(value);
    await this.#fencedWrite(lease, 'progress', (l) => writeProgress(this.#db, l, json));
  }

  /** A write of the handler's while it runs, with the lease's log lines: refused once the handler was aborted, and fenced. */
  async #fencedWrite(lease: Lease, what: string, write: (l: LeaseKey & WithLines) => Promise<boolean>): Promise<void> {
    if (lease.abortReason) throw lease.abortReason;
    // It would wait, on another connection, for the task's row that the open ctx.transaction holds,
    // while that transaction waits for it: until PostgreSQL ends the idle transaction a lease later.
    if (lease.state === 'transaction') throw writeInTransaction(what === 'result' ? 'writeResult' : 'progress');
    const lines = lease.takeLogs();
    let held: boolean;
    const sent = write({ ...leaseKey(lease), lines });
    if (lines !== undefined) lease.carriesLogs(sent);
    try {
      held = await sent;
    } catch (err) {
      lease.putBackLogs(lines);
      throw err;
    }
    if (!held) {
      // The database says another holds the task, or no one: the handler is aborted, and nothing more is written.
      this.#outcomes.fenced(lease, what);
      lease.lose();
      throw new LeaseExpiredError();
    }
  }

  async transaction<T>(row: ClaimedRow, lease: Lease, fn: (trx: AnyTransaction) => Promise<T>): Promise<T> {
    lease.beginTransaction();
    let committed = false;
    try {
      // No heartbeat takes this lease's lines from here; one under way lands them before the completion can commit.
      const landing = lease.linesLanding;
      if (landing) await landing;
      const result = await durableTransaction(
        this.#db,
        async (trx) => {
          const value = await fn(trx);
          if (!(await completeHeld(this.#db, trx, { ...leaseKey(lease), lines: lease.takeLogs(), keep: row.retention_ms > 0 }))) throw new LeaseExpiredError();
          return value;
        },
        this.#leaseDuration,
        async (trx) => {
          if (!(await lockLease(this.#db, trx, lease))) throw new LeaseExpiredError();
        },
      );
      committed = true;
      return result;
    } catch (err) {
      // Once the lease is lost, a failed transaction failed for that, whatever ended it
      // (PostgreSQL ends a session idle in a transaction for a lease's length): say so.
      const lost = err instanceof LeaseExpiredError ? err : lease.abortReason instanceof LeaseExpiredError ? new LeaseExpiredError({ cause: err }) : undefined;
      if (lost) {
        this.#outcomes.fenced(lease, 'transaction');
        lease.lose();
        throw lost;
      }
      throw err;
    } finally {
      lease.endTransaction(committed);
    }
  }
}

/** What ctx.writeResult() or ctx.progress() throws inside ctx.transaction (runTask throws it too). */
export function writeInTransaction(method: 'writeResult' | 'progress'): FailedPreconditionError {
  return new FailedPreconditionError(`ctx.${method}() inside ctx.transaction would wait for the task, which the transaction holds: call it before`);
}

/**
 * One run's TaskContext: a class rather than an object literal with getters and
 * closures, which cost about 1.4 KB of garbage per task. The methods are own
 * arrow functions, so a handler may still take them off the context
 * (`const { log } = ctx`).
 */
class RunContext implements TaskContext {
  readonly taskId: string;
  readonly queue: string;
  readonly retryCount: number;
  readonly maxRetry: number;
  readonly attempt: number;
  readonly #contexts: TaskContexts;
  readonly #row: ClaimedRow;
  readonly #lease: Lease;
  #logger: Logger | undefined;

  constructor(contexts: TaskContexts, row: ClaimedRow, lease: Lease) {
    this.#contexts = contexts;
    this.#row = row;
    this.#lease = lease;
    this.taskId = row.id;
    this.queue = row.queue;
    this.retryCount = row.retried;
    this.maxRetry = row.max_retry;
    this.attempt = attemptOf(row.retried);
  }

  get signal(): AbortSignal {
    return this.#lease.signal;
  }

  get logger(): Logger {
    return (this.#logger ??= this.#contexts.loggerFor(this.#row));
  }

  writeResult = (data: unknown): Promise<void> => this.#contexts.writeResult(this.#lease, data);
  progress = (value: number | Record<string, unknown>): Promise<void> => this.#contexts.progress(this.#lease, value);
  log = (message: string): void => this.#contexts.log(this.#lease, this.attempt, message);
  dependencyResults = (): Promise<Map<string, unknown>> => this.#contexts.dependencyResults(this.#row);
  transaction = <T>(fn: (trx: AnyTransaction) => Promise<T>): Promise<T> => this.#contexts.transaction(this.#row, this.#lease, fn);
}
