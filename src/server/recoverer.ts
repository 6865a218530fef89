/**
 * The recoverer (asynq's recoverer.go, on the database clock): takes active
 * tasks whose lease expired more than `recoverCutoff` ago and retries them
 * with "task lease expired", or archives them when their retries are spent.
 * The cutoff absorbs clock skew and slow heartbeats, as asynq's 30 s does.
 * Every server runs one. Each pass reads the expired leases, decides in no
 * transaction (the retry policy is user code), and writes each decision only
 * if the task is still active under the same lease: of two recoverers, the
 * second finds the row moved and writes nothing, so each task is recovered once.
 */
import { findExpired, recoverLeases, type ExpiredLease } from '../broker/maintenance.js';
import type { Db } from '../broker/db.js';
import { LeaseExpiredError } from '../model/errors.js';
import type { Logger } from '../internal/logger.js';
import { decodePayload } from '../model/payload.js';
import { retryDelayFor } from './retry.js';
import { Task } from '../model/task.js';
import type { StatsCollector } from './stats.js';
import { Ticker } from '../internal/ticker.js';

const BATCH = 100;
/** Tasks archived by one pass that get a line each; the rest are only counted. */
const ARCHIVED_LINES = 20;

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
      const expired = await findExpired(this.#db, bounds, BATCH);
      if (expired.length === 0) break;
      const recoveries = expired.map((t) => ({ seq: t.seq, token: t.lease_token, ...this.#decide(t, err) }));
      const moved = new Map((await recoverLeases(this.#db, recoveries, bounds)).map((r) => [r.seq, r.archived]));
      const implausible: { queue: string; id: string; owner: string }[] = [];
      for (const t of expired) {
        const archived = moved.get(t.seq);
        if (archived === undefined) continue; // extended meanwhile, or another recoverer took it
        this.#stats.processed(t.queue);
        this.#stats.failed(t.queue);
        if (t.implausible) implausible.push({ queue: t.queue, id: t.id, owner: t.lease_owner });
        if (archived) {
          if (total.archived < ARCHIVED_LINES) {
            this.#logger.error(
              {
                task: { id: t.id, type: t.type, queue: t.queue },
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

  /** Archive once the retries are spent; else retry after the configured delay. */
  #decide(t: ExpiredLease, err: Error): { archive: boolean; delayMs: number } {
    if (t.retried >= t.max_retry) return { archive: true, delayMs: 0 };
    const task = Task.restore(t.type, decodePayload(t.payload, t.payload_bytes), t.headers);
    return { archive: false, delayMs: retryDelayFor(this.#cfg.retryDelay, t.retried, err, task, this.#logger) };
  }
}
