/**
 * The aggregator: closes task groups of the server's queues and turns each
 * into one task, with the user's groupAggregator. It runs only when
 * groupAggregator is configured. It checks at least every second (every
 * groupGracePeriod when that is shorter), and sooner when a waiting group is
 * due to close by its grace period or max delay; a group that reached
 * groupMaxSize closes at the next check.
 *
 * asynq runs at most 3 aggregation checks at once and tolerates an aggregate
 * enqueued twice; here groups are closed one after another, and an aggregate
 * commits only with the removal of exactly the members it was made from
 * (src/broker/aggregation.ts), so neither happens. Two servers may both run
 * the aggregator on a group at the same moment; only one result commits.
 */
import { commitGroup, groupToClose, readyGroups, type GroupRules } from '../broker/aggregation.js';
import type { Db } from '../broker/db.js';
import { coerceError, InvalidOptionError } from '../model/errors.js';
import { FailureRun, type Logger } from '../internal/logger.js';
import { decodePayload } from '../model/payload.js';
import { Task, toRecord } from '../model/task.js';
import { Ticker } from '../internal/ticker.js';
import { linkMembers } from './tracing.js';

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
  /** Failing groups, so a group whose aggregator keeps throwing logs now and then, not at every check. */
  readonly #failures = new Map<string, FailureRun>();

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
        const n = await this.#close(queue, group);
        this.#failures.get(key)?.succeeded();
        this.#failures.delete(key);
        if (n > 0) this.#log.debug({ queue, group, members: n }, 'group aggregated');
        if (this.#rules.maxSize > 0 && n === this.#rules.maxSize) full = true;
      } catch (thrown) {
        let run = this.#failures.get(key);
        if (run === undefined) {
          run = new FailureRun(this.#log.child({ queue, group }), 'aggregation failed; the members stay aggregating', 'aggregation succeeded again', 'error');
          this.#failures.set(key, run);
        }
        run.failed(coerceError(thrown));
      }
    }
    if (full) return 0;
    return nextInMs === null ? undefined : nextInMs;
  }

  /**
   * Closes one group: its members, the user's aggregator on them (in no
   * transaction: it may take its time), then the aggregate committed with the
   * members' removal. Resolves to how many members were aggregated; 0 when the
   * group did not close, or changed meanwhile (another server closed it, an
   * Inspector action moved a member), in which case the next check starts over.
   */
  async #close(queue: string, group: string): Promise<number> {
    const members = await groupToClose(this.#db, queue, group, this.#rules);
    if (members.length === 0) return 0;
    const tasks = members.map((m) => Task.restore(m.type, decodePayload(m.payload, m.payload_bytes), m.headers));
    const result = await this.#opts.groupAggregator(group, tasks);
    if (!(result instanceof Task)) throw new TypeError(`groupAggregator must return a Task (got ${result === null ? 'null' : typeof result})`);
    // asynq: the aggregate's own options, with the group's queue forced.
    const record = toRecord(result, { queue });
    if (record.dependsOn.length > 0) throw new InvalidOptionError('dependsOn', 'cannot be set on the task a groupAggregator returns');
    await linkMembers(record, members);
    const committed = await commitGroup(this.#db, queue, group, members, record);
    return committed ? members.length : 0;
  }
}
