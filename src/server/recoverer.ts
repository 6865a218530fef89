/**
 * The recoverer (asynq's recoverer.go, on the database clock): takes active
 * tasks whose lease expired more than `recoverCutoff` ago and retries them
 * with "task lease expired", or archives them when their retries are spent.
 * The cutoff absorbs clock skew and slow heartbeats, as asynq's 30 s does.
 * Every server runs one. Each pass reads the expired leases, decides in no
 * transaction (the retry policy is user code), and writes each decision only
 * if the task is still active under the same lease: of two recoverers, the
 * second finds the row moved and writes nothing, so each task is recovered once.
 *
 * A task's payload and headers are read only to hand them to a `retryDelay`
 * of the user's (asynq's default formula needs neither), and then in batches
 * of at most INPUTS_BATCH_BYTES (one task at least), each released before the
 * next: expired tasks of every queue are recovered, and how large they are
 * must not decide whether a worker of any queue stays up.
 * An active state row without inputs (written outside the library; nothing
 * can run it, and it holds a slot of its queue) is deleted once its lease
 * expired.
 */
import { dropOrphans, findExpired, loadInputs, recoverLeases, type ExpiredLease, type Recovery } from '../broker/maintenance.js';
import type { Db } from '../broker/db.js';
import { maxAttemptsOf } from '../model/attempt.js';
import { LeaseExpiredError } from '../model/errors.js';
import type { Logger } from '../internal/logger.js';
import { decodePayload } from '../model/payload.js';
import { taskFields } from './outcomes.js';
import { defaultRetryDelay, retryDelayFor } from './retry.js';
import { Task } from '../model/task.js';
import type { StatsCollector } from './stats.js';
import { Ticker } from '../internal/ticker.js';

const BATCH = 100;
/** Tasks archived by one pass that get a line each; the rest are only counted. */
const ARCHIVED_LINES = 20;
/** Most bytes of payloads and headers (as received) one read for a retryDelay brings; a larger task comes alone. */
export const INPUTS_BATCH_BYTES = 4 * 1024 * 1024;

/** An expired lease of a task with inputs: one the recoverer retries or archives. */
type ExpiredTask = ExpiredLease & { id: string; type: string; max_retry: number };

export interface RecovererConfig {
  recoverInterval: number;
  recoverCutoff: number;
  leaseDuration: number;
  retryDelay: ((retried: number, err: Error, task: Task) => number) | undefined;
}

export class Recoverer {
  readonly #db: Db;
  readonly #logger: Logger;
  readonly #cfg: RecovererConfig;
  readonly #stats: StatsCollector;
  readonly #ticker: Ticker;
  /** Tasks recovered by this server since it started. */
  readonly counters = { retried: 0, archived: 0 };

  constructor(db: Db, logger: Logger, cfg: RecovererConfig, stats: StatsCollector) {
    this.#db = db;
    this.#logger = logger;
    this.#cfg = cfg;
    this.#stats = stats;
    this.#ticker = new Ticker(logger, async () => void (await this.runOnce()), { interval: () => cfg.recoverInterval, immediate: true });
  }

  start(): void {
    this.#ticker.start();
  }

  stop(): Promise<void> {
    return this.#ticker.stop();
  }

  /**
   * Recovers every expired lease, in batches: select, decide (the retry
   * policy runs here, in no transaction), then a write that applies each
   * decision only if the task is still active under that lease.
   */
  async runOnce(): Promise<{ retried: number; archived: number }> {
    const total = { retried: 0, archived: 0 };
    const err = new LeaseExpiredError();
    const bounds = { cutoffMs: this.#cfg.recoverCutoff, leaseMs: this.#cfg.leaseDuration };
    for (;;) {
      const expired = await findExpired(this.#db, bounds, BATCH, this.#cfg.retryDelay !== undefined);
      if (expired.length === 0) break;
      await this.#dropOrphans(
        expired.filter((t) => t.id === null),
        bounds,
      );
      const tasks = expired.filter((t): t is ExpiredTask => t.id !== null);
      const recoveries = await this.#decide(tasks, err);
      const moved = new Map((await recoverLeases(this.#db, recoveries, bounds)).map((r) => [r.seq, r.archived]));
      const implausible: { queue: string; id: string; owner: string }[] = [];
      for (const t of tasks) {
        const archived = moved.get(t.seq);
        if (archived === undefined) continue; // extended meanwhile, or another recoverer took it
        this.#stats.processed(t.queue);
        this.#stats.failed(t.queue);
        if (t.implausible) implausible.push({ queue: t.queue, id: t.id, owner: t.lease_owner });
        if (archived) {
          if (total.archived < ARCHIVED_LINES) {
            this.#logger.error(
              {
                task: taskFields(t),
                maxAttempts: maxAttemptsOf(t.max_retry),
                retried: t.retried,
                maxRetry: t.max_retry,
                reason: 'retries-exhausted',
                err: { type: err.name, message: err.message },
              },
              'task archived',
            );
          }
          total.archived++;
        } else {
          total.retried++;
        }
      }
      if (implausible.length > 0) {
        this.#logger.warn(
          { tasks: implausible.length, sample: implausible.slice(0, 5) },
          'recovered leases that ran out impossibly far in the future: a clock or data problem, not a dead worker',
        );
      }
      if (expired.length < BATCH) break;
    }
    this.counters.retried += total.retried;
    this.counters.archived += total.archived;
    // An expired lease is a failed attempt whose worker died or stalled: worth a warning.
    if (total.retried + total.archived > 0) this.#logger.warn(total, 'recovered tasks with expired leases');
    return total;
  }

  /**
   * Archive once the retries are spent; else retry after the configured
   * delay. Only a retryDelay of the user's is handed the task: its payload and
   * headers are read then, in batches bounded by bytes.
   */
  async #decide(tasks: readonly ExpiredTask[], err: Error): Promise<Recovery[]> {
    const decided: Recovery[] = [];
    const waiting: ExpiredTask[] = [];
    for (const t of tasks) {
      const r = { seq: t.seq, token: t.lease_token, archive: true, delayMs: 0 };
      if (t.retried >= t.max_retry) decided.push(r);
      else if (this.#cfg.retryDelay === undefined) decided.push({ ...r, archive: false, delayMs: defaultRetryDelay(t.retried) });
      else waiting.push(t);
    }
    for (const batch of byteBatches(waiting)) {
      const inputs = new Map(
        (
          await loadInputs(
            this.#db,
            batch.map((t) => t.seq),
          )
        ).map((i) => [i.seq, i]),
      );
      for (const t of batch) {
        const i = inputs.get(t.seq);
        if (i === undefined) continue; // deleted meanwhile: nothing to recover
        const task = Task.restore(t.type, decodePayload(i.payload, i.payload_bytes), i.headers);
        decided.push({ seq: t.seq, token: t.lease_token, archive: false, delayMs: retryDelayFor(this.#cfg.retryDelay, t.retried, err, task, this.#logger) });
      }
    }
    return decided;
  }

  /** Deletes expired active state rows without inputs, and says so: it is data written outside the library. */
  async #dropOrphans(orphans: readonly ExpiredLease[], bounds: { cutoffMs: number; leaseMs: number }): Promise<void> {
    if (orphans.length === 0) return;
    const dropped = await dropOrphans(
      this.#db,
      orphans.map((t) => ({ seq: t.seq, token: t.lease_token })),
      bounds,
    );
    if (dropped.length === 0) return;
    const queues = [...new Set(orphans.filter((t) => dropped.includes(t.seq)).map((t) => t.queue))];
    this.#logger.error(
      { tasks: dropped.length, queues, seqs: dropped.slice(0, 5) },
      'deleted active task states that have no task inputs (written outside the library): nothing could run them',
    );
  }
}

/** Consecutive runs of tasks whose payloads and headers together stay within INPUTS_BATCH_BYTES, one task at least. */
function byteBatches<T extends { input_bytes: number | null }>(tasks: readonly T[]): T[][] {
  const batches: T[][] = [];
  let current: T[] = [];
  let bytes = 0;
  for (const t of tasks) {
    const size = t.input_bytes ?? 0;
    if (current.length > 0 && bytes + size > INPUTS_BATCH_BYTES) {
      batches.push(current);
      current = [];
      bytes = 0;
    }
    current.push(t);
    bytes += size;
  }
  if (current.length > 0) batches.push(current);
  return batches;
}
