/**
 * Processed and failed counts per queue, summed in memory and added to
 * daily_stats by one statement every few seconds (and at shutdown), so no
 * row is written per task.
 */
import { addStats, type StatsDelta } from '../broker/servers.js';
import type { Db } from '../broker/db.js';

export class StatsCollector {
  readonly #db: Db;
  #counts = new Map<string, StatsDelta>();

  constructor(db: Db) {
    this.#db = db;
  }

  #entry(queue: string): StatsDelta {
    let e = this.#counts.get(queue);
    if (!e) this.#counts.set(queue, (e = { queue, processed: 0, failed: 0 }));
    return e;
  }

  processed(queue: string): void {
    this.#entry(queue).processed++;
  }

  failed(queue: string): void {
    this.#entry(queue).failed++;
  }

  /** Writes the sums so far; on failure they are kept for the next flush. */
  async flush(): Promise<void> {
    if (this.#counts.size === 0) return;
    const batch = this.#counts;
    this.#counts = new Map();
    try {
      await addStats(this.#db, [...batch.values()]);
    } catch (err) {
      for (const d of batch.values()) {
        const e = this.#entry(d.queue);
        e.processed += d.processed;
        e.failed += d.failed;
      }
      throw err;
    }
  }
}
