/**
 * Scheduler and PeriodicTaskManager: periodic tasks, enqueued exactly once
 * per tick however many schedulers run the same entries.
 *
 * How a tick is enqueued (see src/broker/scheduler.ts for the statement):
 *
 *   - Due-ness is decided on the database clock. Each pass of the loop reads
 *     clock_timestamp() (through Db.clockTimestamp(), so a test's clock moves
 *     it) and, for every entry, computes the latest tick at or before it; the
 *     insert of the tick's event is also guarded by `tick_at <= now()`. The host clock only times the sleeps in between
 *     (a monotonic measure of how long ago the database time was read).
 *   - A due tick is one transaction: insert (entry_id, tick_at) into
 *     scheduler_events ON CONFLICT DO NOTHING, and only if that inserted a
 *     row, enqueue the task. Every scheduler tries every tick; exactly one
 *     wins. No leader election.
 *   - Catch-up after downtime: each entry remembers the last tick handled (on
 *     start, the latest tick recorded in scheduler_events by anyone). When
 *     several ticks were missed — all schedulers down, the database away, the
 *     process stalled — only the most recent missed tick is enqueued, once;
 *     the older ones are skipped. An entry with no history at all starts with
 *     its next tick (registering never replays the past).
 *   - Entry ids are derived from the spec, the zone, the task type, payload
 *     and options, so every scheduler that registers the same entry gets the
 *     same id and competes for the same events.
 *
 * Modes: new → active (start) → closed (shutdown). register/unregister work in
 * new and active; start and shutdown are each allowed once.
 */
import { randomUUID } from 'node:crypto';
import { runUntilTerminated } from './internal/signals.js';
import { hostname } from 'node:os';
import { Db } from './broker/db.js';
import { CONNECTION_OPTION_KEYS, type ConnectionOptions } from './internal/connection.js';
import { isTransientConnectionError } from './internal/db-errors.js';
import { databaseNow, deleteEntries, deleteExpiredEntries, enqueueTick, lastTicks, upsertEntries, type TickOutcome } from './broker/scheduler.js';
import { validateZone } from './model/cron.js';
import { prepareEntry, type Entry } from './cron-entry.js';
import { ClientClosedError, ConfigError, ValidationError, coerceError } from './model/errors.js';
import { resolveLogger, type Logger } from './internal/logger.js';
import { Ticker } from './internal/ticker.js';
import { Task, toRecord, type EnqueueOptions } from './model/task.js';
import * as v from './model/validate.js';

export { InvalidCronSpecError } from './model/cron.js';

/** Options of a Scheduler. Durations are milliseconds. */
export interface SchedulerOptions extends ConnectionOptions {
  /** IANA time zone specs without a CRON_TZ= prefix are evaluated in. @defaultValue 'UTC' */
  location?: string;
  /**
   * How often the scheduler refreshes its entries in scheduler_entries; an
   * entry no scheduler refreshed for twice this long expires. @defaultValue 10 s
   */
  heartbeatInterval?: number;
}

const SCHEDULER_KEYS = [...CONNECTION_OPTION_KEYS, 'location', 'heartbeatInterval'] as const;
export const SCHEDULER_HEARTBEAT_DEFAULT_MS = 10_000;
/** A sleep is cut this much later than computed, so the wake-up lands after the tick, not 1 ms before. */
const WAKE_MARGIN_MS = 2;
const NOT_DUE_RETRY_MS = 50;

export type SchedulerStatus = 'new' | 'active' | 'closed';

/** @internal shared with PeriodicTaskManager */
export function resolveSchedulerOptions(input: unknown): { location: string; heartbeatInterval: number; logger: Logger } {
  const o = v.plainObject(input ?? {}, 'options', ConfigError);
  v.knownKeys(o, SCHEDULER_KEYS, 'options', ConfigError);
  return {
    location: o.location === undefined ? 'UTC' : validateZone(o.location, 'location', ConfigError),
    heartbeatInterval:
      o.heartbeatInterval === undefined
        ? SCHEDULER_HEARTBEAT_DEFAULT_MS
        : v.duration(o.heartbeatInterval, 'heartbeatInterval', 10, v.MAX_TIMER_MS, ConfigError),
    logger: resolveLogger(o),
  };
}

/**
 * Enqueues tasks on cron schedules. Run as many schedulers as you like, on
 * as many hosts: each tick of each entry is enqueued once in all.
 *
 * @example
 * const scheduler = new Scheduler({ location: 'Europe/Berlin' });
 * scheduler.register('0 9 * * MON-FRI', new Task('report:daily'), { queue: 'low' });
 * scheduler.register('@every 30s', new Task('metrics:flush'));
 * await scheduler.run(); // until SIGTERM or SIGINT
 */
export class Scheduler {
  /** host:pid:uuid, as asynq's; the registry records which scheduler refreshed an entry last. */
  readonly id = `${hostname()}:${process.pid}:${randomUUID()}`;
  readonly #db: Db;
  readonly #log: Logger;
  readonly #location: string;
  readonly #heartbeatInterval: number;
  readonly #entries = new Map<string, Entry>();
  /** Unregistered ids whose registry rows are yet to be removed (by the heartbeat). */
  readonly #removed = new Set<string>();
  readonly #loop: Ticker;
  readonly #heartbeat: Ticker;
  #status: SchedulerStatus = 'new';
  #starting = false;
  #shutdown: Promise<void> | undefined;

  constructor(opts: SchedulerOptions = {}) {
    const o = resolveSchedulerOptions(opts);
    this.#location = o.location;
    this.#heartbeatInterval = o.heartbeatInterval;
    this.#log = o.logger.child({ component: 'scheduler' });
    this.#db = new Db(opts, `pgasynq:scheduler:${process.pid}`, { logger: o.logger, health: true });
    this.#loop = new Ticker(this.#log, () => this.runOnce(), { interval: () => this.#heartbeatInterval, immediate: true });
    this.#heartbeat = new Ticker(this.#log, () => this.beat(), { interval: () => this.#heartbeatInterval });
  }

  get status(): SchedulerStatus {
    return this.#status;
  }

  /**
   * Adds a periodic task and returns its entry id, derived from the spec, the
   * zone, the task and the options: registering the same entry again (here
   * or in another scheduler) gives the same id. Validation is synchronous: a
   * spec or zone that does not parse, a spec over 256 characters, a bad
   * option is a ValidationError naming it.
   */
  register(cronspec: string, task: Task, opts?: EnqueueOptions): string {
    this.#checkOpen();
    const entry = prepareEntry(this.#location, cronspec, task, opts);
    this.#removed.delete(entry.id);
    if (!this.#entries.has(entry.id)) {
      this.#entries.set(entry.id, entry);
      this.#log.debug({ entryId: entry.id, spec: entry.schedule.spec, type: task.type }, 'entry registered');
      if (this.#status === 'active') {
        this.#loop.wake();
        this.#heartbeat.wake();
      }
    }
    return entry.id;
  }

  /** Removes an entry: no more ticks from this scheduler. Its history is kept. */
  unregister(entryId: string): void {
    this.#checkOpen();
    if (!this.#entries.delete(entryId)) throw new ValidationError('entryId', `is not registered with this scheduler (got ${v.describeValue(entryId)})`);
    this.#removed.add(entryId);
    if (this.#status === 'active') this.#heartbeat.wake();
  }

  /** Ids of the registered entries. */
  entryIds(): string[] {
    return [...this.#entries.keys()];
  }

  /**
   * Registers the entries in the database, then runs the schedule.
   *
   * Rejects with FailedPreconditionError when the schema is not migrated, and
   * with DatabaseUnavailableError when the database cannot be used for a
   * reason waiting will not fix (unknown database, role or host, failed
   * authentication). A database that is only unreachable does not make it
   * reject: the scheduler starts, logs a warning, and retries registering and
   * ticking in the background until the database answers.
   */
  async start(): Promise<void> {
    this.#checkOpen();
    if (this.#status === 'active' || this.#starting) throw new ValidationError('scheduler', 'is already running');
    this.#starting = true;
    let registered = true;
    try {
      await this.beat();
    } catch (err) {
      // Unreachable: the Db's health log has said so, and the loops retry.
      if (!isTransientConnectionError(err)) throw err;
      registered = false;
    } finally {
      this.#starting = false;
    }
    this.#checkOpen(); // shut down while starting
    this.#status = 'active';
    // Not registered yet: the heartbeat tries at once, then with backoff, instead of after a whole interval.
    if (!registered) this.#heartbeat.wake();
    this.#loop.start();
    this.#heartbeat.start();
    this.#log.info(
      { schedulerId: this.id, schema: this.#db.schema, database: this.#db.target, entries: this.#entries.size, location: this.#location },
      'scheduler started',
    );
  }

  /** Starts, then shuts down on SIGTERM or SIGINT; resolves after the shutdown. */
  async run(): Promise<void> {
    await runUntilTerminated(
      () => this.start(),
      () => this.shutdown(),
    );
  }

  /**
   * Stops the schedule (a tick being enqueued finishes first), removes this
   * scheduler's entries from the registry unless another scheduler refreshed
   * them since, and closes the pool if the scheduler created it. History is kept.
   */
  shutdown(): Promise<void> {
    this.#shutdown ??= this.#doShutdown();
    return this.#shutdown;
  }

  async #doShutdown(): Promise<void> {
    const wasActive = this.#status === 'active';
    this.#status = 'closed';
    if (wasActive) {
      await Promise.all([this.#loop.stop(), this.#heartbeat.stop()]);
      const ids = [...this.#entries.keys(), ...this.#removed];
      await deleteEntries(this.#db, this.id, ids).catch((err: unknown) => this.#log.warn({ err }, 'could not remove the entries'));
    }
    await this.#db.close();
    if (wasActive) this.#log.info({ schedulerId: this.id }, 'scheduler stopped');
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.shutdown();
  }

  #checkOpen(): void {
    if (this.#status === 'closed') throw new ClientClosedError('scheduler');
  }

  /**
   * One pass: reads the database clock, enqueues every entry's due tick (the
   * latest at or before that clock, if not handled yet), and returns the ms
   * until the next tick of any entry.
   * @internal
   */
  async runOnce(): Promise<number | undefined> {
    if (this.#entries.size === 0) return undefined;
    const unloaded = [...this.#entries.values()].filter((e) => e.cursor === null);
    const before = performance.now();
    const { now, last } =
      unloaded.length > 0
        ? await lastTicks(
            this.#db,
            unloaded.map((e) => e.id),
          )
        : { now: await databaseNow(this.#db), last: new Map<string, Date>() };
    // The moment `now` was read, on the monotonic clock (half the round trip).
    const readAt = (before + performance.now()) / 2;
    for (const e of unloaded) {
      if (e.cursor !== null) continue;
      e.cursor = last.get(e.id) ?? now;
      e.nextDue = e.schedule.next(e.cursor);
    }

    const entries = [...this.#entries.values()];
    const results = await Promise.allSettled(entries.map((e) => this.#fire(e, now)));
    const failed = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed.length > 0) throw coerceError(failed[0]?.reason);

    let soonest = Number.POSITIVE_INFINITY;
    for (const e of this.#entries.values()) {
      if (e.nextDue !== null) soonest = Math.min(soonest, e.nextDue.getTime() - now.getTime());
    }
    if (!Number.isFinite(soonest)) return undefined;
    // A tick the database did not see due yet (its clock went back?) is retried soon, not in a spin.
    const floor = results.some((r) => r.status === 'fulfilled' && r.value === 'not-due') ? NOT_DUE_RETRY_MS : 0;
    return Math.max(floor, soonest - (performance.now() - readAt) + WAKE_MARGIN_MS);
  }

  /**
   * Enqueues the entry's latest tick at or before `now` unless it was
   * handled: normally its next due tick, or, when several were missed, only
   * the most recent (the catch-up policy). Database errors reject.
   */
  async #fire(e: Entry, now: Date): Promise<TickOutcome['kind'] | 'idle'> {
    if (e.cursor === null || e.nextDue === null || e.nextDue > now) return 'idle';
    let tick = e.nextDue;
    let after = e.schedule.next(tick);
    if (after !== null && after <= now) {
      tick = e.schedule.latest(now) ?? tick; // missed ticks before this one are skipped
      after = e.schedule.next(tick);
    }
    const handled = () => {
      e.cursor = tick;
      e.nextDue = after;
    };
    let record;
    try {
      record = toRecord(e.task, e.overrides);
    } catch (err) {
      // Valid at register, invalid now (a deadline that has passed): this tick can never be enqueued.
      this.#log.error({ err, entryId: e.id, tickAt: tick }, 'periodic task is no longer valid; tick skipped');
      handled();
      return 'idle';
    }
    let outcome: TickOutcome;
    try {
      outcome = await enqueueTick(this.#db, { entryId: e.id, tickAt: tick, nextRunAt: after, record });
    } catch (err) {
      this.#log.error({ err, entryId: e.id, tickAt: tick }, 'could not enqueue the tick');
      throw err;
    }
    switch (outcome.kind) {
      case 'not-due':
        return outcome.kind; // the next pass tries again
      case 'enqueued':
        this.#log.debug({ entryId: e.id, tickAt: tick, taskId: outcome.taskId }, 'tick enqueued');
        break;
      case 'conflict':
        this.#log.warn(
          { err: outcome.error, entryId: e.id, tickAt: tick, taskId: outcome.taskId },
          'tick recorded without a new task: it conflicts with an existing task',
        );
        break;
      case 'taken':
        break;
    }
    handled();
    return outcome.kind;
  }

  /**
   * Refreshes this scheduler's entries in the registry (with their next run
   * time on the database clock), removes the unregistered ones and the
   * registry rows that expired.
   * @internal
   */
  async beat(): Promise<void> {
    const entries = [...this.#entries.values()];
    const removed = [...this.#removed];
    if (entries.length > 0) {
      const now = await databaseNow(this.#db);
      await upsertEntries(
        this.#db,
        this.id,
        entries.map((e) => ({ ...e.row, nextRunAt: e.nextDue !== null && e.nextDue > now ? e.nextDue : e.schedule.next(now) })),
        2 * this.#heartbeatInterval,
      );
    }
    if (removed.length > 0) {
      await deleteEntries(this.#db, this.id, removed);
      for (const id of removed) this.#removed.delete(id);
    }
    await deleteExpiredEntries(this.#db);
  }
}
