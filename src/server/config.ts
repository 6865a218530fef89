/**
 * ServerConfig: every option with its default, validated at construction and
 * then frozen. Each mirrors an asynq option; durations are milliseconds.
 */
import { availableParallelism } from 'node:os';
import { checkConnectionString } from '../broker/db.js';
import { CONNECTION_OPTION_KEYS, type ConnectionOptions } from '../internal/connection.js';
import { ConfigError } from '../model/errors.js';
import { resolveLogger, type Logger } from '../internal/logger.js';
import type { Task } from '../model/task.js';
import * as v from '../model/validate.js';

export interface ServerConfig extends ConnectionOptions {
  /** Tasks run at once. @defaultValue os.availableParallelism() */
  concurrency?: number;
  /**
   * Tasks claimed ahead of free slots and held leased until a slot frees
   * (graphile-worker's local queue). With many short tasks a claim then
   * brings a batch rather than the few slots that happen to be free. Held
   * tasks count as active (their leases are heartbeated), start in claim
   * order, and go back to pending at once on stop or shutdown without using
   * a retry. Unset, it adapts: about what the server starts in two claim
   * round trips (at most 50 × concurrency and 1,000), none when tasks take
   * longer than a round trip; a number fixes it, 0 turns it off (a held task
   * waits for this server's slots while another server may be idle).
   * @defaultValue adaptive (unset; the start line logs `"prefetch":null`)
   */
  prefetch?: number;
  /** Queues to serve, with priority weights. @defaultValue { default: 1 } */
  queues?: Record<string, number>;
  /** Always take higher-priority queues first, rather than weighted-random order. @defaultValue false */
  strictPriority?: boolean;
  /** Delay before the next attempt. @defaultValue asynq's n⁴ + 15 + rand(30)·(n + 1) s */
  retryDelay?: (retried: number, err: Error, task: Task) => number;
  /** False: the error does not use up a retry (the task is still retried). @defaultValue every error counts */
  isFailure?: (err: Error) => boolean;
  /** Called for every failed attempt. */
  errorHandler?: (err: Error, task: Task) => void;
  /** Called every healthCheckInterval with the database ping's error, or null. */
  healthCheck?: (err: Error | null) => void;
  /** @defaultValue 15 s */
  healthCheckInterval?: number;
  /** How long shutdown waits for running handlers before giving their tasks back. @defaultValue 8 s */
  shutdownTimeout?: number;
  /** Longest sleep of the forwarder between checks for due tasks. @defaultValue 5 s */
  delayedTaskCheckInterval?: number;
  /** @defaultValue 1 min */
  groupGracePeriod?: number;
  /** 0: no limit. */
  groupMaxDelay?: number;
  /** 0: no limit. */
  groupMaxSize?: number;
  /**
   * Turns a closed group into one task. It may be async: it runs holding no
   * lock and no connection, and its task commits only together with the
   * removal of exactly these members (if one was moved or deleted meanwhile,
   * the group is aggregated again at the next check).
   */
  groupAggregator?: (group: string, tasks: Task[]) => Task | Promise<Task>;
  /** @defaultValue 8 s */
  janitorInterval?: number;
  /** @defaultValue 100 */
  janitorBatchSize?: number;
  /** Poll for work this often when no notification came. @defaultValue 1 s */
  taskCheckInterval?: number;
  /** How long a claim or a heartbeat holds a task. @defaultValue 30 s */
  leaseDuration?: number;
  /** Must be below leaseDuration / 2. @defaultValue 5 s */
  heartbeatInterval?: number;
  /** @defaultValue 1 min */
  recoverInterval?: number;
  /** How long past its expiry a lease must be before it is recovered (skew allowance; 0: none). @defaultValue 30 s */
  recoverCutoff?: number;
  /**
   * A connection string used only for LISTEN (wake-ups on new work), when
   * `connectionString` goes through a transaction-pooling proxy such as
   * pgbouncer with pool_mode=transaction, where LISTEN cannot work: point it
   * at PostgreSQL directly, or at a session-mode pool. Without it the server
   * probes its own connection at start; if LISTEN does not work there it
   * logs one warning and polls every taskCheckInterval. Not with `embedded`.
   * @defaultValue the pool's own connection settings
   */
  listenConnectionString?: string;
}

/** The options ServerConfig adds to the connection's. */
type ServerOption = Exclude<keyof ServerConfig, keyof ConnectionOptions>;

/**
 * Every ServerConfig option beyond the connection's, for knownKeys(): the
 * compiler refuses this object if it misses an option of ServerConfig or
 * names one that is not there, so the list cannot fall behind the interface.
 */
const SERVER_OPTIONS = {
  listenConnectionString: true,
  concurrency: true,
  prefetch: true,
  queues: true,
  strictPriority: true,
  retryDelay: true,
  isFailure: true,
  errorHandler: true,
  healthCheck: true,
  healthCheckInterval: true,
  shutdownTimeout: true,
  delayedTaskCheckInterval: true,
  groupGracePeriod: true,
  groupMaxDelay: true,
  groupMaxSize: true,
  groupAggregator: true,
  janitorInterval: true,
  janitorBatchSize: true,
  taskCheckInterval: true,
  leaseDuration: true,
  heartbeatInterval: true,
  recoverInterval: true,
  recoverCutoff: true,
} as const satisfies { readonly [K in ServerOption]-?: true };

const KEYS: readonly string[] = [...CONNECTION_OPTION_KEYS, ...Object.keys(SERVER_OPTIONS)];

/** The options without a default: resolved, they stay undefined when not given. */
type NoDefault = 'retryDelay' | 'errorHandler' | 'healthCheck' | 'groupAggregator' | 'listenConnectionString';

/**
 * ServerConfig resolved and frozen: every server option set, to its default
 * when not given (but NoDefault's), in ServerConfig's type; the connection
 * options are the Db's, but for the resolved logger.
 */
export type ResolvedServerConfig = {
  readonly [K in Exclude<ServerOption, NoDefault | 'prefetch' | 'queues'>]-?: NonNullable<ServerConfig[K]>;
} & {
  readonly [K in NoDefault]: ServerConfig[K];
} & {
  readonly logger: Logger;
  /** null: adaptive (server/prefetch.ts). */
  readonly prefetch: number | null;
  readonly queues: Readonly<Record<string, number>>;
  /** How long after a successful extension was sent the worker still trusts its lease. */
  readonly leaseTrust: number;
};

/** A connection string for LISTEN: a postgres:// URL or key=value pairs, never shown with its password. */
function validateListenConnectionString(c: ServerConfig): string | undefined {
  const cs: unknown = c.listenConnectionString;
  if (cs === undefined) return undefined;
  if (typeof cs !== 'string' || cs.trim() === '') throw new ConfigError('listenConnectionString', 'must be a non-empty connection string');
  checkConnectionString(cs, 'listenConnectionString');
  if (c.embedded !== undefined) throw new ConfigError('listenConnectionString', 'cannot be used with embedded (it listens in process)');
  return cs;
}

function validateQueues(input: unknown): Record<string, number> {
  const q = v.plainObject(input, 'queues', ConfigError);
  const names = Object.keys(q);
  if (names.length === 0) throw new ConfigError('queues', 'must name at least one queue');
  const out: Record<string, number> = {};
  for (const name of names) {
    v.queueName(name, `queues key "${name}"`);
    out[name] = v.integer(q[name], `queues.${name}`, 1, 1_000_000, ConfigError);
  }
  return out;
}

export function resolveServerConfig(input: ServerConfig): ResolvedServerConfig {
  const c = v.plainObject(input, 'config', ConfigError) as ServerConfig;
  v.knownKeys(c as Record<string, unknown>, KEYS, 'config', ConfigError);
  const dur = (key: keyof ServerConfig, def: number, min = 0) => (c[key] === undefined ? def : v.duration(c[key], key, min, v.MAX_TIMER_MS, ConfigError));
  const fn = <F>(key: keyof ServerConfig): F | undefined => (c[key] === undefined ? undefined : v.func<F>(c[key], key, ConfigError));

  const leaseDuration = dur('leaseDuration', 30_000, 100);
  const heartbeatInterval = dur('heartbeatInterval', Math.min(5_000, leaseDuration / 6), 10);
  if (heartbeatInterval >= leaseDuration / 2) {
    throw new ConfigError('heartbeatInterval', `(${heartbeatInterval} ms) must be below leaseDuration / 2 (${leaseDuration / 2} ms)`);
  }
  // The worker stops trusting its lease a margin before it expires, so it aborts
  // before the database could hand the task to anyone else (River's trust window).
  const margin = Math.min(Math.max(1000, leaseDuration / 6), leaseDuration / 3);
  const gracePeriod = dur('groupGracePeriod', 60_000);
  if (c.groupGracePeriod !== undefined && gracePeriod < 100) throw new ConfigError('groupGracePeriod', `must be at least 100 ms (got ${gracePeriod})`);

  return Object.freeze({
    logger: resolveLogger(c),
    concurrency: c.concurrency === undefined ? availableParallelism() : v.integer(c.concurrency, 'concurrency', 1, 10_000, ConfigError),
    prefetch: c.prefetch === undefined ? null : v.integer(c.prefetch, 'prefetch', 0, 10_000, ConfigError),
    queues: Object.freeze(c.queues === undefined ? { default: 1 } : validateQueues(c.queues)),
    strictPriority: c.strictPriority === undefined ? false : v.boolean(c.strictPriority, 'strictPriority', ConfigError),
    retryDelay: fn<ResolvedServerConfig['retryDelay']>('retryDelay'),
    isFailure: fn<(err: Error) => boolean>('isFailure') ?? (() => true),
    errorHandler: fn<ResolvedServerConfig['errorHandler']>('errorHandler'),
    healthCheck: fn<ResolvedServerConfig['healthCheck']>('healthCheck'),
    healthCheckInterval: dur('healthCheckInterval', 15_000, 10),
    shutdownTimeout: dur('shutdownTimeout', 8_000),
    delayedTaskCheckInterval: dur('delayedTaskCheckInterval', 5_000, 10),
    groupGracePeriod: gracePeriod,
    groupMaxDelay: dur('groupMaxDelay', 0),
    groupMaxSize: c.groupMaxSize === undefined ? 0 : v.integer(c.groupMaxSize, 'groupMaxSize', 0, 1_000_000, ConfigError),
    groupAggregator: fn<ResolvedServerConfig['groupAggregator']>('groupAggregator'),
    janitorInterval: dur('janitorInterval', 8_000, 10),
    janitorBatchSize: c.janitorBatchSize === undefined ? 100 : v.integer(c.janitorBatchSize, 'janitorBatchSize', 1, 10_000, ConfigError),
    taskCheckInterval: dur('taskCheckInterval', 1_000, 10),
    leaseDuration,
    heartbeatInterval,
    leaseTrust: leaseDuration - margin,
    recoverInterval: dur('recoverInterval', 60_000, 10),
    recoverCutoff: dur('recoverCutoff', 30_000),
    listenConnectionString: validateListenConnectionString(c),
  });
}
