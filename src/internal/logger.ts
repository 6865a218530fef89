/**
 * What pgasynq logs with, and the default it logs with when nobody says.
 *
 * As asynq does, the library logs by default: a pino logger at `info`, as
 * JSON lines on stderr, written synchronously (a line is on its way before
 * the call returns, so nothing is lost when the process exits, and no worker
 * thread or transport is ever started). `logLevel` picks its level,
 * `logger: false` silences the library, and any pino-shaped logger replaces
 * it. Every component logs through its own child (`{ component: 'processor' }`);
 * messages are lower-case constants, data goes in fields, errors under `err`,
 * and payloads are never logged.
 */
import { performance } from 'node:perf_hooks';
import pino from 'pino';
import { ConfigError } from '../model/errors.js';

/** The logger pgasynq writes to: anything pino-shaped. */
export interface Logger {
  debug(obj: object, msg?: string): void;
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
  child(bindings: object): Logger;
}

/** Levels of the default logger, from the most to the least verbose. */
export type LogLevel = 'debug' | 'info' | 'warn' | 'error';
export const LOG_LEVELS: readonly LogLevel[] = ['debug', 'info', 'warn', 'error'];
export const LOG_LEVEL_DEFAULT: LogLevel = 'info';

const noop = (): void => {};

export const silentLogger: Logger = {
  debug: noop,
  info: noop,
  warn: noop,
  error: noop,
  child: () => silentLogger,
};

/** One synchronous stderr destination for every default logger of the process, made on first use. */
let stderr: pino.DestinationStream | undefined;
const defaults = new Map<LogLevel, Logger>();

/**
 * The default logger at `level`: pino, JSON lines on stderr (fd 2) written
 * synchronously, `name: "pgasynq"` on every line. One per level per process.
 */
export function defaultLogger(level: LogLevel = LOG_LEVEL_DEFAULT): Logger {
  let logger = defaults.get(level);
  if (logger === undefined) {
    stderr ??= pino.destination({ fd: 2, sync: true });
    logger = pino({ name: 'pgasynq', level }, stderr);
    defaults.set(level, logger);
  }
  return logger;
}

const METHODS = ['debug', 'info', 'warn', 'error', 'child'] as const;

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value === 'string') return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value);
  return typeof value === 'object' ? 'an object without them' : String(value);
}

/**
 * The logger of a class from its options, validated: `logger` (a pino-shaped
 * logger, or false for silence) and `logLevel` (the default logger's level).
 * Throws ConfigError naming the option: a logger without the five methods, a
 * level outside LOG_LEVELS, or a level with a logger of the caller's own
 * (whose level is the caller's to set).
 */
export function resolveLogger(opts: { logger?: unknown; logLevel?: unknown }): Logger {
  const { logger, logLevel } = opts;
  if (logLevel !== undefined && !(LOG_LEVELS as readonly unknown[]).includes(logLevel)) {
    throw new ConfigError('logLevel', `must be one of ${LOG_LEVELS.map((l) => `"${l}"`).join(', ')} (got ${describe(logLevel)})`);
  }
  if (logger === undefined) return defaultLogger((logLevel as LogLevel | undefined) ?? LOG_LEVEL_DEFAULT);
  if (logger === false) return silentLogger;
  if (typeof logger !== 'object' || logger === null || !METHODS.every((m) => typeof (logger as Record<string, unknown>)[m] === 'function')) {
    throw new ConfigError('logger', `must be a pino-shaped logger (with ${METHODS.join(', ')} methods) or false (got ${describe(logger)})`);
  }
  if (logLevel !== undefined) {
    throw new ConfigError('logLevel', 'sets the level of the default logger only: set the level on the logger you pass');
  }
  return logger as Logger;
}

/** The first delay between two lines of one run of failures, and the longest. */
const FIRST_GAP_MS = 1000;
const MAX_GAP_MS = 5 * 60_000;

/**
 * Rate-limited logging of a run of failures that repeat while something is
 * down (a database, a listener connection): the first failure is logged at
 * once, later ones at most once per gap, the gap doubling from 1 s to 5 min;
 * the first success after failures is logged once at `info`. Lines carry
 * `failures` (in this run) and `downMs` (since its first failure).
 */
export class FailureRun {
  readonly #log: Logger;
  readonly #level: 'warn' | 'error';
  readonly #message: string;
  readonly #recovered: string;
  /** Failures since the last success. */
  #failures = 0;
  /** Failures of the whole run, across the moments it stopped. */
  #total = 0;
  #since = 0;
  #lastLine = Number.NEGATIVE_INFINITY;
  #gap = FIRST_GAP_MS;
  /** When the last success ended a stretch of failures. */
  #endedAt = Number.NEGATIVE_INFINITY;
  /** A failure line was written that no recovery line has answered yet. */
  #open = false;

  constructor(log: Logger, message: string, recovered: string, level: 'warn' | 'error' = 'warn') {
    this.#log = log;
    this.#message = message;
    this.#recovered = recovered;
    this.#level = level;
  }

  /** True while failures have been seen and no success since. */
  get failing(): boolean {
    return this.#failures > 0;
  }

  /**
   * Counts a failure; logs it if it is the first of the run or the gap has
   * passed. Failures that start again within the gap of a success belong to
   * the same run (a database that refuses some connections and takes others
   * succeeds and fails by turns): they keep its gap, so such flapping logs a
   * line per gap, not one per turn.
   */
  failed(err: unknown, fields: object = {}): void {
    const now = performance.now();
    if (this.#failures === 0 && now - this.#endedAt >= this.#gap) {
      this.#since = now;
      this.#gap = FIRST_GAP_MS;
      this.#lastLine = Number.NEGATIVE_INFINITY;
      this.#total = 0;
    }
    this.#failures++;
    this.#total++;
    if (now - this.#lastLine < this.#gap) return;
    if (this.#lastLine !== Number.NEGATIVE_INFINITY) this.#gap = Math.min(this.#gap * 2, MAX_GAP_MS);
    this.#lastLine = now;
    this.#open = true;
    this.#log[this.#level]({ ...fields, err, failures: this.#total, downMs: Math.round(now - this.#since) }, this.#message);
  }

  /** Ends a stretch of failures; one `info` line if a failure line since the last one says so. */
  succeeded(fields: object = {}): void {
    if (this.#failures === 0) return;
    this.#failures = 0;
    this.#endedAt = performance.now();
    if (!this.#open) return;
    this.#open = false;
    this.#log.info({ ...fields, failures: this.#total, downMs: Math.round(this.#endedAt - this.#since) }, this.#recovered);
  }
}
