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

/** Options of a Server, each with its default. Durations are milliseconds. */
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
  /** Called for every failed attempt. @defaultValue none */
  errorHandler?: (err: Error, task: Task) => void;
  /** Called every healthCheckInterval with the database ping's error, or null. @defaultValue none */
  healthCheck?: (err: Error | null) => void;
  /** How often healthCheck is called. @defaultValue 15 s */
  healthCheckInterval?: number;
  /** How long shutdown waits for running handlers before giving their tasks back. @defaultValue 8 s */
  shutdownTimeout?: number;
  /** Longest sleep of the forwarder between checks for due tasks. @defaultValue 5 s */
  delayedTaskCheckInterval?: number;
  /** A group closes when no task joined it for this long; at least 100 ms. @defaultValue 1 min */
  groupGracePeriod?: number;
  /** A group closes when its oldest task has waited this long; 0: no limit. @defaultValue 0 */
  groupMaxDelay?: number;
  /** A group closes when this many of its tasks wait; 0: no limit. @defaultValue 0 */
  groupMaxSize?: number;
  /**
   * Turns a closed group into one task. It may be async: it runs holding no
   * lock and no connection, and its task commits only together with the
   * removal of exactly these members (if one was moved or deleted meanwhile,
   * the group is aggregated again at the next check).
   * @defaultValue none: this server aggregates no group
   */
  groupAggregator?: (group: string, tasks: Task[]) => Task | Promise<Task>;
  /**
   * How often the janitor deletes completed tasks past their retention and unique locks past
   * their TTL, and trims each queue's archive and the daily stats. @defaultValue 8 s
   */
  janitorInterval?: number;
  /** The janitor deletes in batches of this many. @defaultValue 100 */
  janitorBatchSize?: number;
  /** Poll for work this often when no notification came. @defaultValue 1 s */
  taskCheckInterval?: number;
  /** How long a claim or a heartbeat holds a task. @defaultValue 30 s */
  leaseDuration?: number;
  /** Must be below leaseDuration / 2. @defaultValue 5 s, or leaseDuration / 6 when that is shorter */
  heartbeatInterval?: number;
  /** How often the recoverer looks for tasks whose lease expired. @defaultValue 1 min */
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

/** A duration option: its default when not given, else a duration of at least `min` ms. */
const duration =
  (key: ServerOption, def: number, min = 0) =>
  (x: unknown): number =>
    x === undefined ? def : v.duration(x, key, min, v.MAX_TIMER_MS, ConfigError);

/** A callback option: a function, or undefined when not given. */
const callback =
  <F>(key: ServerOption) =>
  (x: unknown): F | undefined =>
    x === undefined ? undefined : v.func<F>(x, key, ConfigError);

/** An integer option in [min, max], `def` when not given. */
const integer =
  (key: ServerOption, def: number, min: number, max: number) =>
  (x: unknown): number =>
    x === undefined ? def : v.integer(x, key, min, max, ConfigError);

const leaseDuration = duration('leaseDuration', 30_000, 100);

/**
 * Each option's rule, the one place it is checked and defaulted: the value
 * given (undefined when not) and the whole config (for the rules that depend
 * on another option) in, the resolved value out. The compiler holds this
 * table to ServerConfig: an option without its rule, or a rule without its
 * option, does not build; the known keys and ResolvedServerConfig are the
 * table's.
 */
const SERVER_RULES = {
  concurrency: integer('concurrency', availableParallelism(), 1, 10_000),
  prefetch: (x: unknown): number | null => (x === undefined ? null : v.integer(x, 'prefetch', 0, 10_000, ConfigError)),
  queues: (x: unknown): Readonly<Record<string, number>> => Object.freeze(x === undefined ? { default: 1 } : validateQueues(x)),
  strictPriority: (x: unknown) => (x === undefined ? false : v.boolean(x, 'strictPriority', ConfigError)),
  retryDelay: callback<(retried: number, err: Error, task: Task) => number>('retryDelay'),
  isFailure: (x: unknown) => callback<(err: Error) => boolean>('isFailure')(x) ?? (() => true),
  errorHandler: callback<(err: Error, task: Task) => void>('errorHandler'),
  healthCheck: callback<(err: Error | null) => void>('healthCheck'),
  healthCheckInterval: duration('healthCheckInterval', 15_000, 10),
  shutdownTimeout: duration('shutdownTimeout', 8_000),
  delayedTaskCheckInterval: duration('delayedTaskCheckInterval', 5_000, 10),
  groupGracePeriod: (x: unknown) => {
    const ms = duration('groupGracePeriod', 60_000)(x);
    if (x !== undefined && ms < 100) throw new ConfigError('groupGracePeriod', `must be at least 100 ms (got ${ms})`);
    return ms;
  },
  groupMaxDelay: duration('groupMaxDelay', 0),
  groupMaxSize: integer('groupMaxSize', 0, 0, 1_000_000),
  groupAggregator: callback<(group: string, tasks: Task[]) => Task | Promise<Task>>('groupAggregator'),
  janitorInterval: duration('janitorInterval', 8_000, 10),
  janitorBatchSize: integer('janitorBatchSize', 100, 1, 10_000),
  taskCheckInterval: duration('taskCheckInterval', 1_000, 10),
  leaseDuration,
  heartbeatInterval: (x: unknown, c: ServerConfig): number => {
    const lease = leaseDuration(c.leaseDuration);
    const ms = duration('heartbeatInterval', Math.min(5_000, lease / 6), 10)(x);
    if (ms >= lease / 2) throw new ConfigError('heartbeatInterval', `(${ms} ms) must be below leaseDuration / 2 (${lease / 2} ms)`);
    return ms;
  },
  recoverInterval: duration('recoverInterval', 60_000, 10),
  recoverCutoff: duration('recoverCutoff', 30_000),
  listenConnectionString: (x: unknown, c: ServerConfig) => validateListenConnectionString(x, c),
} satisfies { readonly [K in ServerOption]-?: (value: unknown, config: ServerConfig) => unknown };

const KEYS: readonly string[] = [...CONNECTION_OPTION_KEYS, ...Object.keys(SERVER_RULES)];

/**
 * ServerConfig resolved and frozen: every server option as its rule resolved
 * it (to its default when not given), and the connection options are the
 * Db's, but for the resolved logger.
 */
export type ResolvedServerConfig = { readonly [K in ServerOption]: ReturnType<(typeof SERVER_RULES)[K]> } & {
  readonly logger: Logger;
  /** How long after a successful extension was sent the worker still trusts its lease. */
  readonly leaseTrust: number;
};

/** A connection string for LISTEN: a postgres:// URL or key=value pairs, never shown with its password. */
function validateListenConnectionString(cs: unknown, c: ServerConfig): string | undefined {
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
  const resolved: Record<string, unknown> = { logger: resolveLogger(c) };
  for (const [key, rule] of Object.entries(SERVER_RULES) as [ServerOption, (x: unknown, c: ServerConfig) => unknown][]) resolved[key] = rule(c[key], c);
  const lease = resolved.leaseDuration as number;
  // The worker stops trusting its lease a margin before it expires, so it aborts
  // before the database could hand the task to anyone else (River's trust window).
  resolved.leaseTrust = lease - Math.min(Math.max(1000, lease / 6), lease / 3);
  return Object.freeze(resolved) as ResolvedServerConfig;
}
