/**
 * The aggregator: closes task groups of the server's queues and turns each
 * into one task, with the user's groupAggregator. It runs only when
 * groupAggregator is configured. It checks at least every second (every
 * groupGracePeriod when that is shorter), and sooner when a waiting group is
 * due to close by its grace period or max delay; a group that reached
 * groupMaxSize closes at the next check.
 *
 * asynq runs at most 3 aggregation checks at once and tolerates an aggregate
 * enqueued twice; here groups are closed one after another, each in one
 * transaction (src/broker/aggregation.ts), so neither happens.
 */
import { closeGroup, readyGroups, type GroupRules } from '../broker/aggregation.js';
import type { Db } from '../broker/db.js';
import { coerceError } from '../errors.js';
import type { Logger } from '../logger.js';
import { decodePayload } from '../payload.js';
import { Task, toRecord } from '../task.js';
import { Ticker } from './ticker.js';

export interface AggregatorOptions {
  queues: string[];
  groupGracePeriod: number;
  groupMaxDelay: number;
  groupMaxSize: number;
  groupAggregator: (group: string, tasks: Task[]) => Task | Promise<Task>;
}

const MAX_CHECK_INTERVAL_MS = 1000;

export class Aggregator {
  readonly #db: Db;
  readonly #log: Logger;
  readonly #opts: AggregatorOptions;
  readonly #rules: GroupRules;
  readonly #ticker: Ticker;
  /** Consecutive failures per group, so a group whose aggregator keeps throwing logs now and then, not every check. */
  readonly #failures = new Map<string, number>();

  constructor(db: Db, logger: Logger, opts: AggregatorOptions) {
    this.#db = db;
    this.#log = logger;
    this.#opts = opts;
    this.#rules = { gracePeriodMs: opts.groupGracePeriod, maxDelayMs: opts.groupMaxDelay, maxSize: opts.groupMaxSize };
    const interval = Math.min(MAX_CHECK_INTERVAL_MS, opts.groupGracePeriod);
    this.#ticker = new Ticker(logger, () => this.runOnce(), { interval: () => interval });
  }

  start(): void {
    this.#ticker.start();
  }

  stop(): Promise<void> {
    return this.#ticker.stop();
  }

  /**
   * Closes every group that is ready; resolves to the ms until the next
   * waiting group will be (0 when a full group may have more members ready).
   */
  async runOnce(): Promise<number | undefined> {
    const { ready, nextInMs } = await readyGroups(this.#db, this.#opts.queues, this.#rules);
    let full = false;
    for (const { queue, group } of ready) {
      const key = JSON.stringify([queue, group]);
      try {
        const n = await closeGroup(this.#db, queue, group, this.#rules, async (members) => {
          const tasks = members.map((m) => Task.restore(m.type, decodePayload(m.payload, m.payload_bytes), m.headers));
          const result = await this.#opts.groupAggregator(group, tasks);
          if (!(result instanceof Task)) throw new TypeError(`groupAggregator must return a Task (got ${result === null ? 'null' : typeof result})`);
          // asynq: the aggregate's own options, with the group's queue forced.
          return toRecord(result, { queue });
        });
        this.#failures.delete(key);
        if (n > 0) this.#log.debug({ queue, group, members: n }, 'group aggregated');
        if (this.#rules.maxSize > 0 && n === this.#rules.maxSize) full = true;
      } catch (thrown) {
        const failures = (this.#failures.get(key) ?? 0) + 1;
        this.#failures.set(key, failures);
        if (failures === 1 || failures % 10 === 0) {
          this.#log.error({ err: coerceError(thrown), queue, group, failures }, 'aggregation failed; the members stay aggregating');
        }
      }
    }
    if (full) return 0;
    return nextInMs === null ? undefined : nextInMs;
  }
}
