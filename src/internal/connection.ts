/**
 * What every class that talks to the database accepts: ConnectionOptions and
 * the list of its keys. Declared here, below the broker, because the fronts,
 * the CLI and the dashboard take it too, and they reach the broker only
 * through the library's classes.
 */
import type pg from 'pg';
import type { DatabaseClock } from './clock.js';
import type { EmbeddedDatabase } from './embedded-database.js';
import type { Logger, LogLevel } from './logger.js';

/** Options every class that talks to the database accepts. */
export interface ConnectionOptions {
  /** Falls back to DATABASE_URL. @defaultValue `process.env.DATABASE_URL` */
  connectionString?: string;
  /**
   * A pool of yours: borrowed, never ended by pgasynq.
   * @defaultValue none: a pool of pgasynq's own on `connectionString`, ended by close()
   */
  pool?: pg.Pool;
  /** The schema that holds pgasynq's tables. @defaultValue 'pgasynq' */
  schema?: string;
  /**
   * Any pino-shaped logger (it needs debug, info, warn, error and child), or
   * false to silence pgasynq. Payloads are never logged.
   * @defaultValue a pino logger at `logLevel`, JSON lines on stderr, written synchronously
   */
  logger?: Logger | false;
  /**
   * The level of the default logger; with a `logger` of your own, set its level instead.
   * @defaultValue 'info'
   */
  logLevel?: LogLevel;
  /** An in-process database from createEmbeddedDatabase(), instead of a server. @defaultValue none */
  embedded?: EmbeddedDatabase;
  /**
   * Plan the hottest statements (claim, enqueue, …) once per connection as
   * named prepared statements. Set false behind a transaction-pooling proxy
   * that does not track them (pgbouncer before 1.21, or without
   * max_prepared_statements): each statement is then planned on every call.
   * @defaultValue true
   */
  preparedStatements?: boolean;
  /** @internal Tests only: a clock shared by the Client, Server, Scheduler and Inspector of a test, moved forward instead of sleeping. */
  clock?: DatabaseClock;
}

/** The options of ConnectionOptions, for the classes that refuse unknown option names. */
export const CONNECTION_OPTION_KEYS = [
  'connectionString',
  'pool',
  'schema',
  'logger',
  'logLevel',
  'embedded',
  'preparedStatements',
  'clock',
] as const satisfies readonly (keyof ConnectionOptions)[];
