/**
 * The forwarder: makes due scheduled and retry tasks pending (or aggregating,
 * for a grouped task). Instead of asynq's fixed 5 s poll it sleeps until the
 * earliest due task, and is woken when a delayed task is enqueued;
 * `delayedTaskCheckInterval` caps the sleep in case a notification is lost.
 */
import { forwardDue, nextDueIn } from '../broker/maintenance.js';
import type { Db } from '../broker/db.js';
import type { Logger } from '../internal/logger.js';
import { Ticker } from '../internal/ticker.js';

const BATCH = 1000;

export class Forwarder {
  readonly #db: Db;
  readonly #ticker: Ticker;

  constructor(db: Db, logger: Logger, opts: { delayedTaskCheckInterval: number }) {
    this.#db = db;
    this.#ticker = new Ticker(logger, () => this.runOnce(), { interval: () => opts.delayedTaskCheckInterval, immediate: true });
  }

  start(): void {
    this.#ticker.start();
  }

  /** A delayed task was enqueued: its due time may be sooner than the current sleep. */
  wake(): void {
    this.#ticker.wake();
  }

  stop(): Promise<void> {
    return this.#ticker.stop();
  }

  /** Forwards every due task; resolves to the ms until the next one is due. */
  async runOnce(): Promise<number | undefined> {
    while ((await forwardDue(this.#db, BATCH)) === BATCH);
    const next = await nextDueIn(this.#db);
    return next === null ? undefined : Math.max(0, next);
  }
}
