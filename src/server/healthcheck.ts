/**
 * The healthchecker: only when the user gives a healthCheck function, every
 * `healthCheckInterval` it pings the database and passes the error (null
 * when healthy), as asynq's healthcheck.go does.
 */
import type { Db } from '../broker/db.js';
import { coerceError } from '../model/errors.js';
import type { Logger } from '../internal/logger.js';
import { Ticker } from '../internal/ticker.js';

export class Healthchecker {
  readonly #ticker: Ticker;

  constructor(db: Db, logger: Logger, check: (err: Error | null) => void, interval: number) {
    this.#ticker = new Ticker(
      logger,
      async () => {
        let error: Error | null = null;
        try {
          await db.ping();
        } catch (err) {
          error = coerceError(err);
        }
        try {
          check(error);
        } catch (err) {
          logger.error({ err }, 'healthCheck threw');
        }
      },
      { interval: () => interval },
    );
  }

  start(): void {
    this.#ticker.start();
  }

  stop(): Promise<void> {
    return this.#ticker.stop();
  }
}
