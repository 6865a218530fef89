/**
 * The janitor: every `janitorInterval` it deletes completed tasks past their
 * retention and unique locks past their TTL, trims each queue's archive to
 * asynq's bounds (10,000 tasks, 90 days) and drops daily stats older than
 * 90 days. Deletes go in batches of `janitorBatchSize`, so no statement holds
 * many locks or runs long.
 */
import { deleteExpiredCompleted, deleteExpiredLocks, trimArchive } from '../broker/maintenance.js';
import { trimStats } from '../broker/servers.js';
import type { Db } from '../broker/db.js';
import type { Logger } from '../internal/logger.js';
import { Ticker } from '../internal/ticker.js';

const STATS_DAYS = 90;

export class Janitor {
  readonly #db: Db;
  readonly #batch: number;
  readonly #ticker: Ticker;

  constructor(db: Db, logger: Logger, opts: { janitorInterval: number; janitorBatchSize: number }) {
    this.#db = db;
    this.#batch = opts.janitorBatchSize;
    this.#ticker = new Ticker(logger, async () => void (await this.runOnce()), { interval: () => opts.janitorInterval });
  }

  start(): void {
    this.#ticker.start();
  }

  stop(): Promise<void> {
    return this.#ticker.stop();
  }

  async runOnce(): Promise<{ completed: number; locks: number; archived: number }> {
    const drain = async (step: () => Promise<number>) => {
      let total = 0;
      for (let n = this.#batch; n === this.#batch; total += n) n = await step();
      return total;
    };
    const completed = await drain(() => deleteExpiredCompleted(this.#db, this.#batch));
    const locks = await drain(() => deleteExpiredLocks(this.#db, this.#batch));
    const archived = await drain(() => trimArchive(this.#db, this.#batch));
    await trimStats(this.#db, STATS_DAYS);
    return { completed, locks, archived };
  }
}
