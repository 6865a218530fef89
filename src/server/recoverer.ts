/**
 * The recoverer (asynq's recoverer.go, on the database clock): takes active
 * tasks whose lease expired more than `recoverCutoff` ago and retries them
 * with "task lease expired", or archives them when their retries are spent.
 * The cutoff absorbs clock skew and slow heartbeats, as asynq's 30 s does.
 * Every server runs one; SKIP LOCKED makes sure each task is recovered once.
 */
import { recoverExpired } from '../broker/maintenance.js';
import type { Db } from '../broker/db.js';
import { LeaseExpiredError } from '../errors.js';
import type { Logger } from '../logger.js';
import { decodePayload } from '../payload.js';
import { safeRetryDelay, warnInvalidRetryDelay } from '../retry.js';
import { Task } from '../task.js';
import type { StatsCollector } from './stats.js';
import { Ticker } from './ticker.js';

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

  /** Recovers every expired lease, in batches. */
  async runOnce(): Promise<{ retried: number; archived: number }> {
    const total = { retried: 0, archived: 0 };
    const err = new LeaseExpiredError();
    for (;;) {
      const counts = { retried: 0, archived: 0 };
      const queues: string[] = [];
      const implausible: { queue: string; id: string; owner: string }[] = [];
      const archived: { task: { id: string; type: string; queue: string }; retried: number; maxRetry: number }[] = [];
      const done = await recoverExpired(this.#db, { cutoffMs: this.#cfg.recoverCutoff, leaseMs: this.#cfg.leaseDuration, limit: BATCH }, (t) => {
        queues.push(t.queue);
        if (t.implausible) implausible.push({ queue: t.queue, id: t.id, owner: t.lease_owner });
        if (t.retried >= t.max_retry) {
          archived.push({ task: { id: t.id, type: t.type, queue: t.queue }, retried: t.retried, maxRetry: t.max_retry });
          return { archive: true, delayMs: 0 };
        }
        const task = Task.restore(t.type, decodePayload(t.payload, t.payload_bytes), t.headers);
        const retryDelay = this.#cfg.retryDelay;
        return {
          archive: false,
          delayMs: safeRetryDelay(retryDelay && (() => retryDelay(t.retried, err, task)), t.retried, (value) =>
            warnInvalidRetryDelay(this.#logger, t.type, value),
          ),
        };
      });
      if (implausible.length > 0) {
        this.#logger.warn(
          { tasks: implausible.length, sample: implausible.slice(0, 5) },
          'recovered leases that ran out impossibly far in the future: a clock or data problem, not a dead worker',
        );
      }
      for (const a of archived.slice(0, Math.max(0, ARCHIVED_LINES - total.archived))) {
        this.#logger.error({ ...a, reason: 'retries-exhausted', err: { type: err.name, message: err.message } }, 'task archived');
      }
      counts.retried = done.retried;
      counts.archived = done.archived;
      for (const q of queues) {
        this.#stats.processed(q);
        this.#stats.failed(q);
      }
      total.retried += counts.retried;
      total.archived += counts.archived;
      if (counts.retried + counts.archived < BATCH) break;
    }
    this.counters.retried += total.retried;
    this.counters.archived += total.archived;
    // An expired lease is a failed attempt whose worker died or stalled: worth a warning.
    if (total.retried + total.archived > 0) this.#logger.warn(total, 'recovered tasks with expired leases');
    return total;
  }
}
