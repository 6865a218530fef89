/**
 * The horizon watch: every `healthCheckInterval`, looks for a transaction
 * that has held back vacuum's horizon for a minute or more (a forgotten
 * BEGIN, a long report, a stuck prepared transaction) and names it in one
 * warning, then says when it has gone. While one is held, dead row versions
 * pile up in the task tables: the claim cursor keeps claims fast, but the
 * tables and indexes grow, and nothing in pgasynq can end another session's
 * transaction — its owner must.
 */
import type { Db } from '../broker/db.js';
import { oldestHorizonHolder, type HorizonHolder } from '../broker/horizon.js';
import type { Logger } from '../internal/logger.js';
import { Ticker } from '../internal/ticker.js';

/** How long a snapshot may be held before it is worth a warning (database clock). */
export const HORIZON_WARN_AFTER_MS = 60_000;

export class HorizonWatch {
  readonly #ticker: Ticker;
  /** The holder last warned about, until it is gone. */
  #warned: { key: string; holder: HorizonHolder } | undefined;

  constructor(db: Db, logger: Logger, interval: number) {
    this.#ticker = new Ticker(
      logger,
      async () => {
        const holder = await oldestHorizonHolder(db, HORIZON_WARN_AFTER_MS);
        const key = holder && `${holder.kind}:${holder.pid ?? holder.name}:${holder.since.getTime()}`;
        if (key === this.#warned?.key) return;
        if (this.#warned) {
          const gone = this.#warned.holder;
          logger.info({ pid: gone.pid, kind: gone.kind, name: gone.name }, 'the transaction holding back vacuum has ended');
        }
        this.#warned = holder && key ? { key, holder } : undefined;
        if (holder) {
          logger.warn(
            { pid: holder.pid, kind: holder.kind, name: holder.name, state: holder.state, heldSeconds: Math.round(holder.heldMs / 1000) },
            `xmin horizon held by ${holder.pid === null ? `${holder.kind} "${holder.name}"` : `pid ${holder.pid}`} for ${Math.round(holder.heldMs / 1000)} s: ` +
              'dead tasks cannot be vacuumed until that transaction ends',
          );
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
