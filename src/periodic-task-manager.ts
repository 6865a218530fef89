/**
 * PeriodicTaskManager (asynq's): a Scheduler whose entries follow a config
 * provider, synced every syncInterval.
 */
import { ConfigError, ValidationError, coerceError } from './model/errors.js';
import type { Logger } from './internal/logger.js';
import { prepareEntry } from './cron-entry.js';
import { Scheduler, resolveSchedulerOptions, type SchedulerOptions } from './scheduler.js';
import { Ticker } from './internal/ticker.js';
import { runUntilTerminated } from './internal/signals.js';
import type { EnqueueOptions, Task } from './model/task.js';
import * as v from './model/validate.js';

/** One periodic task as a config provider returns it. */
export interface PeriodicTaskConfig {
  /** When to enqueue, as Scheduler.register() takes it. */
  cronspec: string;
  /** The task to enqueue at each tick. */
  task: Task;
  /** Enqueue options, as Scheduler.register() takes them. @defaultValue none: the Task's own */
  opts?: EnqueueOptions;
}

/** Options of a PeriodicTaskManager: its config provider, its sync interval, and the Scheduler's options. */
export interface PeriodicTaskManagerOptions extends SchedulerOptions {
  /** Returns the periodic tasks wanted now; called at start and every syncInterval. */
  getConfigs: () => Promise<PeriodicTaskConfig[]> | PeriodicTaskConfig[];
  /** How often getConfigs is called after start. @defaultValue 3 min */
  syncInterval?: number;
}

export const SYNC_INTERVAL_DEFAULT_MS = 3 * 60_000;

/**
 * asynq's PeriodicTaskManager: a Scheduler whose entries follow a config
 * provider. Every syncInterval it asks the provider for the wanted entries
 * and registers the new ones and unregisters the ones gone (an entry whose
 * spec, task or options changed is a different entry: the old one goes, the
 * new one comes). A provider error or an invalid config skips that sync,
 * logged; at start it rejects instead.
 *
 * @example
 * const manager = new PeriodicTaskManager({
 *   getConfigs: async () => (await db.cronJobs()).map((j) => ({ cronspec: j.spec, task: new Task(j.type, j.payload) })),
 *   syncInterval: 60_000,
 * });
 * await manager.run();
 */
export class PeriodicTaskManager {
  readonly #scheduler: Scheduler;
  readonly #getConfigs: PeriodicTaskManagerOptions['getConfigs'];
  readonly #location: string;
  readonly #log: Logger;
  readonly #sync: Ticker;
  /** Ids of the entries the provider asked for: the ones a sync may remove (only sync touches it). */
  readonly #managed = new Set<string>();
  #shutdown: Promise<void> | undefined;

  constructor(opts: PeriodicTaskManagerOptions) {
    const o = v.plainObject(opts, 'options', ConfigError);
    const { getConfigs, syncInterval, ...schedulerOpts } = o as unknown as PeriodicTaskManagerOptions;
    this.#getConfigs = v.func(getConfigs, 'getConfigs', ConfigError);
    const interval = syncInterval === undefined ? SYNC_INTERVAL_DEFAULT_MS : v.duration(syncInterval, 'syncInterval', 10, v.MAX_TIMER_MS, ConfigError);
    const resolved = resolveSchedulerOptions(schedulerOpts);
    this.#location = resolved.location;
    // The scheduler gets the logger resolved here (so logLevel is not applied twice).
    const { logLevel: _level, ...rest } = schedulerOpts;
    this.#scheduler = new Scheduler({ ...rest, logger: resolved.logger });
    this.#log = resolved.logger.child({ component: 'periodic-task-manager' });
    this.#sync = new Ticker(
      this.#log,
      async () => {
        await this.sync().catch((err: unknown) => this.#log.error({ err }, 'sync failed; entries unchanged'));
      },
      { interval: () => interval },
    );
  }

  /** The scheduler the manager drives; entries registered on it directly are left alone by the syncs. */
  get scheduler(): Scheduler {
    return this.#scheduler;
  }

  /** Syncs once (rejecting if the provider fails or returns an invalid config), then starts the scheduler and the periodic sync. */
  async start(): Promise<void> {
    if (this.#scheduler.status !== 'new') throw new ValidationError('periodicTaskManager', `cannot start: it is ${this.#scheduler.status}`);
    try {
      await this.sync();
    } catch (err) {
      throw new ConfigError('getConfigs', `initial sync failed: ${coerceError(err).message}`);
    }
    await this.#scheduler.start();
    this.#sync.start();
  }

  /** Starts, then shuts down on SIGTERM or SIGINT; resolves after the shutdown. */
  async run(): Promise<void> {
    await runUntilTerminated(
      () => this.start(),
      () => this.shutdown(),
    );
  }

  /** Stops syncing, then shuts the scheduler down. */
  shutdown(): Promise<void> {
    this.#shutdown ??= (async () => {
      await this.#sync.stop();
      await this.#scheduler.shutdown();
    })();
    return this.#shutdown;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.shutdown();
  }

  /**
   * Asks the provider for the configs and makes the scheduler's entries
   * match: all of them valid, or nothing changes.
   * @internal
   */
  async sync(): Promise<{ added: number; removed: number }> {
    const configs = await this.#getConfigs();
    if (!Array.isArray(configs)) throw new ValidationError('getConfigs', 'must return an array of { cronspec, task, opts? }');
    const wanted = new Map<string, PeriodicTaskConfig>();
    configs.forEach((c, i) => {
      if (typeof c !== 'object' || c === null) throw new ValidationError(`configs[${i}]`, 'must be an object { cronspec, task, opts? }');
      try {
        wanted.set(prepareEntry(this.#location, c.cronspec, c.task, c.opts).id, c);
      } catch (err) {
        if (err instanceof ValidationError) throw new ValidationError(`configs[${i}].${err.field}`, err.rule);
        throw err;
      }
    });
    if (this.#scheduler.status === 'closed') return { added: 0, removed: 0 };
    let removed = 0;
    let added = 0;
    const registered = new Set(this.#scheduler.entryIds());
    for (const id of [...this.#managed]) {
      if (!wanted.has(id)) {
        if (registered.has(id)) this.#scheduler.unregister(id);
        this.#managed.delete(id);
        removed++;
      }
    }
    for (const [id, c] of wanted) {
      if (!this.#managed.has(id)) {
        this.#scheduler.register(c.cronspec, c.task, c.opts);
        this.#managed.add(id);
        added++;
      }
    }
    if (added + removed > 0) this.#log.info({ added, removed }, 'periodic tasks synced');
    return { added, removed };
  }
}
