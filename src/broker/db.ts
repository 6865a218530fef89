/**
 * Connection setup: the pool, the Kysely instance over it, and the quoted
 * schema that every statement of the broker is written against.
 */
import { createHash } from 'node:crypto';
import { Kysely, PostgresDialect, sql, type RawBuilder, type Transaction } from 'kysely';
import pg from 'pg';
import { ConfigError } from '../model/errors.js';
import { CHANNEL_SUFFIXES, DEFAULT_SCHEMA, MAX_IDENTIFIER_BYTES, schemaName } from '../model/validate.js';
import { FailureRun, silentLogger, type Logger } from '../internal/logger.js';
import { isTransientConnectionError, mapDbError } from '../internal/db-errors.js';
import { EmbeddedDatabase, type EmbeddedClient } from '../internal/embedded-database.js';
import { redactConnectionString } from '../internal/redact.js';
import type { ConnectionOptions } from '../internal/connection.js';
import { DatabaseClock } from '../internal/clock.js';
import { followClock } from './session-clock.js';
import { preparingPool } from './preparing-pool.js';

/** How many texts one named statement may take before run() stops preparing its new ones. */
const MAX_STATEMENT_FORMS = 4;

/**
 * A Kysely transaction over any tables: pgasynq's statements are raw `sql`
 * templates over tables it does not declare to Kysely, and ctx.transaction
 * hands the same transaction to the user's code, typed by the user's tables.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type AnyTransaction = Transaction<any>;
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type AnyKysely = Kysely<any>;

/** A transaction the caller holds open: Kysely's, or a pg (or embedded) client inside BEGIN. */
export type Transactional = AnyTransaction | pg.PoolClient | pg.Client | EmbeddedClient;

/** Whether pg will parse the URL: it percent-encodes spaces and stray % first, then uses WHATWG's URL (pg-connection-string). */
function parsesAsUrl(cs: string): boolean {
  let s = cs;
  try {
    if (/ |%[^a-f0-9]|%[a-f0-9][^a-f0-9]/i.test(s)) s = encodeURI(s).replace(/%25(\d\d)/g, '%$1');
  } catch {
    return false;
  }
  for (const candidate of [s, s.replace('@/', '@___DUMMY___/')]) {
    try {
      new URL(candidate, 'postgres://base');
      return true;
    } catch {
      // try the next form
    }
  }
  return false;
}

/**
 * Refuses a connection string that cannot work, with a message that never
 * holds a part of its password: every part quoted comes from the redacted
 * string (a password with an unencoded `/` once made the port look like its
 * first characters).
 */
export function checkConnectionString(cs: string, field: string): void {
  const shown = redactConnectionString(cs);
  if (!/^postgres(ql)?:\/\//.test(cs)) {
    if (!cs.includes('=')) throw new ConfigError(field, `must be a postgres:// URL or key=value pairs (got ${shown})`);
    return;
  }
  const port = /^postgres(?:ql)?:\/\/(?:[^/?#]*@)?(?:\[[^\]/]*\]|[^:/?#]*):([^/?#]*)/.exec(shown)?.[1];
  if (port !== undefined && port !== '' && (!/^\d{1,5}$/.test(port) || Number(port) > 65535)) {
    throw new ConfigError(field, `has an invalid port "${port}" (${shown})`);
  }
  if (!parsesAsUrl(cs)) {
    throw new ConfigError(
      field,
      `is not a valid URL (${shown}): percent-encode the user name and password (encodeURIComponent: / ? # become %2F %3F %23), or leave the password out and set PGPASSWORD`,
    );
  }
}

function resolveConnectionString(opts: ConnectionOptions): string {
  const cs = opts.connectionString ?? process.env.DATABASE_URL;
  if (cs === undefined || cs === '') {
    throw new ConfigError('connectionString', 'is not set: pass connectionString or pool, or set DATABASE_URL');
  }
  if (typeof cs !== 'string') throw new ConfigError('connectionString', `must be a string (got ${typeof cs})`);
  checkConnectionString(cs, 'connectionString');
  return cs;
}

/**
 * One schema on one pool. Statements name their tables through `table()`,
 * which quotes the validated schema once: queue names, types and ids are
 * always bind parameters, never SQL text.
 */
export class Db {
  readonly schema: string;
  readonly pool: pg.Pool;
  readonly kysely: AnyKysely;
  /** The clock behind now(): PostgreSQL's, or a test's moved forward. */
  readonly clock: DatabaseClock;
  /** Set when the database is the in-process one. */
  readonly embedded: EmbeddedDatabase | undefined;
  /** Channels: new pending tasks, new scheduled ones, cancellations, and tasks put below the claim cursors' floors. */
  readonly channels: { readonly [K in keyof typeof CHANNEL_SUFFIXES]: string };
  /** The server, for messages: "host:port/database" (never a user or password), or "embedded". */
  readonly target: string;
  /** The logger of whoever owns this Db. */
  readonly logger: Logger;
  readonly #ownsPool: boolean;
  readonly #prepare: boolean;
  /** Set for long-running owners (servers, schedulers): logs runs of connection failures and the recovery. */
  readonly #health: FailureRun | undefined;
  /** The text of each statement run() prepares, to its name on every connection. */
  readonly #prepared = new Map<string, string>();
  /** `pgasynq:<schema>:`, or the schema's digest in place of a name too long to leave room for the statement's. */
  readonly #statementPrefix: string;
  #closed = false;

  /**
   * `asyncCommit`: the pool's sessions commit without waiting for the WAL flush
   * (synchronous_commit = off). Only for a pool we create, and only for the
   * server, whose claims, completions and heartbeats may be lost in a PostgreSQL
   * crash without breaking at-least-once: a lost claim or completion re-runs the
   * task. durableTransaction() always waits for the flush.
   *
   * `durableCommit`: the pool's sessions commit waiting for the flush
   * (synchronous_commit = on) whatever the database or role default says: for
   * the Client, whose enqueue is acknowledged to the caller on COMMIT and must
   * survive a PostgreSQL crash after that (a database set to `off` would
   * otherwise lose the last acknowledged enqueues in a crash). A plain enqueue
   * is one autocommitted statement: a startup option costs nothing per call,
   * where SET LOCAL would cost a transaction and two round trips more. Only for
   * a pool we create: on a pool of yours, or in your transaction (`tx`), your
   * sessions' settings apply.
   *
   * `logger`: the owner's, already resolved. `health`: log connection failures
   * (first of a run at once, then with backoff) and the recovery, for owners
   * that retry in the background rather than reject to a caller.
   */
  constructor(
    opts: ConnectionOptions,
    applicationName = 'pgasynq',
    session: { asyncCommit?: boolean; durableCommit?: boolean; logger?: Logger; health?: boolean } = {},
  ) {
    this.schema = schemaName(opts.schema ?? DEFAULT_SCHEMA);
    if (opts.preparedStatements !== undefined && typeof opts.preparedStatements !== 'boolean') {
      throw new ConfigError('preparedStatements', `must be a boolean (got ${typeof opts.preparedStatements})`);
    }
    this.#prepare = opts.preparedStatements ?? true;
    if (opts.embedded !== undefined) {
      if (!(opts.embedded instanceof EmbeddedDatabase)) throw new ConfigError('embedded', 'must come from createEmbeddedDatabase()');
      this.embedded = opts.embedded;
      this.pool = opts.embedded.pool as unknown as pg.Pool;
      this.#ownsPool = false;
    } else if (opts.pool) {
      if (!isPool(opts.pool)) throw new ConfigError('pool', 'must be a pg.Pool (an object with connect(), query() and on())');
      this.pool = opts.pool;
      this.#ownsPool = false;
    } else {
      this.pool = new pg.Pool({
        connectionString: resolveConnectionString(opts),
        application_name: applicationName,
        max: 10,
        keepAlive: true,
        // A host that drops packets would otherwise hang a connect until the OS gives up.
        connectionTimeoutMillis: 10_000,
        ...(session.asyncCommit || session.durableCommit ? { options: startupOptions(session.asyncCommit ? 'off' : 'on') } : {}),
      });
      this.#ownsPool = true;
    }
    guardPool(this.pool, this.embedded === undefined);
    this.target = this.embedded ? 'embedded' : describeTarget(this.pool);
    this.logger = session.logger ?? silentLogger;
    this.#health = session.health
      ? new FailureRun(this.logger.child({ component: 'database' }), 'database unreachable; retrying in the background', 'database reachable again')
      : undefined;
    this.kysely = new Kysely({ dialect: new PostgresDialect({ pool: this.preparesStatements ? preparingPool(this.pool, this.#prepared) : this.pool }) });
    if (opts.clock !== undefined && !(opts.clock instanceof DatabaseClock)) throw new ConfigError('clock', 'must be a DatabaseClock');
    this.clock = opts.clock ?? new DatabaseClock();
    if (opts.clock !== undefined) followClock(this.pool, this.clock);
    // schemaName() keeps the schema short enough for every one of these to be an identifier.
    this.channels = Object.fromEntries(Object.entries(CHANNEL_SUFFIXES).map(([k, suffix]) => [k, this.schema + suffix])) as Db['channels'];
    this.#statementPrefix = statementPrefix(this.schema);
  }

  /**
   * The database's now() as the statements that decide by time use it:
   * PostgreSQL's own, unless a test moved this Db's clock forward.
   */
  now(): RawBuilder<Date> {
    return this.#shifted(sql<Date>`now()`);
  }

  /**
   * clock_timestamp() moved by the same offset: the database's time when the
   * expression is evaluated, not when the transaction began (the scheduler's
   * reading of the clock between sleeps).
   */
  clockTimestamp(): RawBuilder<Date> {
    return this.#shifted(sql<Date>`clock_timestamp()`);
  }

  /**
   * The shift the owner's task functions take (migration 0010 task_clock()):
   * this Db's offset in ms, 0 unless a test moved the clock. Those functions
   * decide time themselves and honour a shift for the owner only.
   */
  clockShift(): RawBuilder<number> {
    return sql<number>`${this.clock.offsetMs}::float8`;
  }

  /**
   * `base` as is, or moved forward by the test's offset. The offset is a bind
   * parameter: a statement has two texts at most (offset 0, and any other),
   * so a named prepared statement keeps its plan as the clock moves.
   */
  #shifted(base: RawBuilder<Date>): RawBuilder<Date> {
    const offset = this.clock.offsetMs;
    return offset === 0 ? base : sql<Date>`(${base} + ${offset}::float8 * interval '1 millisecond')`;
  }

  /** The schema-qualified name of one of our tables as text, for functions that take a name (pg_get_serial_sequence). */
  qualified(name: string): string {
    return `"${this.schema}".${name}`;
  }

  /** The schema-qualified name of one of our tables, quoted. */
  table(name: string): RawBuilder<unknown> {
    return sql.id(this.schema, name);
  }

  /**
   * Runs a statement on the pool, or on the caller's open transaction. A
   * `prepared` name makes it a named prepared statement on each connection:
   * planned once there instead of on every call (the claim's CTEs cost more to
   * plan than to run). Only for statements whose text never changes.
   */
  async run<R>(query: RawBuilder<R>, tx?: Transactional, name?: string): Promise<R[]> {
    try {
      const rows = await this.#run(query, tx, name);
      if (this.#health?.failing) this.#health.succeeded({ database: this.target });
      return rows;
    } catch (err) {
      throw this.failed(err);
    }
  }

  /**
   * What an error of a statement becomes (see db-errors.ts), after counting a
   * connection failure toward the health log. For statements sent around run().
   */
  failed(err: unknown): unknown {
    if (this.#health !== undefined && isTransientConnectionError(err)) this.#health.failed(err, { database: this.target });
    return mapDbError(err, this);
  }

  async #run<R>(query: RawBuilder<R>, tx?: Transactional, name?: string): Promise<R[]> {
    const prepared = this.preparesStatements ? name : undefined;
    if (tx !== undefined && isKyselyExecutor(tx)) {
      // Kysely sends the text alone; preparingPool() names it on the connection.
      if (prepared !== undefined) this.#statementName(query.compile(this.kysely).sql, prepared);
      return (await query.execute(tx)).rows;
    }
    if (prepared === undefined) {
      if (tx === undefined) return (await query.execute(this.kysely)).rows;
      const compiled = query.compile(this.kysely);
      return (await tx.query(compiled.sql, compiled.parameters as unknown[])).rows as R[];
    }
    const compiled = query.compile(this.kysely);
    const statement = { name: this.#statementName(compiled.sql, prepared), text: compiled.sql, values: compiled.parameters as unknown[] };
    const result = await (tx === undefined ? this.pool.query(statement) : (tx as pg.PoolClient).query(statement));
    return result.rows as R[];
  }

  /**
   * The prepared statement's name for this text: one per text, as pg requires of a name on a
   * connection. A statement whose text has another form (the clock moved by a test) gets
   * another name; past a few forms, a text goes unprepared, so that a statement whose text
   * varied by mistake cannot fill every session with prepared statements.
   */
  #statementName(text: string, base: string): string | undefined {
    const known = this.#prepared.get(text);
    if (known !== undefined) return known;
    const taken = new Set(this.#prepared.values());
    for (let n = 1; n <= MAX_STATEMENT_FORMS; n++) {
      const name = `${this.#statementPrefix}${base}${n === 1 ? '' : `:${n}`}`;
      // PostgreSQL would cut a longer name, and two statements cut to one name collide (42P05).
      if (Buffer.byteLength(name) > MAX_IDENTIFIER_BYTES)
        throw new Error(`pgasynq: prepared statement name "${name}" is longer than ${MAX_IDENTIFIER_BYTES} bytes`);
      if (taken.has(name)) continue;
      this.#prepared.set(text, name);
      return name;
    }
    return undefined;
  }

  /** Whether run() sends named statements as prepared ones (not on the embedded database, nor with preparedStatements: false). */
  get preparesStatements(): boolean {
    return this.#prepare && this.embedded === undefined;
  }

  /** One round trip to the database; rejects when it cannot be reached. */
  async ping(): Promise<void> {
    await this.run(sql`SELECT 1`);
  }

  get closed(): boolean {
    return this.#closed;
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#ownsPool) await this.pool.end();
  }
}

/**
 * The startup packet's `options` for a pool we create: the user's PGOPTIONS (pg reads it only
 * when no `options` is given, so it would be dropped) followed by our synchronous_commit, which
 * wins as the later `-c`. An `options` parameter in the connection string replaces all of this
 * (pg lets the connection string win): then that string's settings apply.
 */
function startupOptions(synchronousCommit: 'on' | 'off'): string {
  return [process.env.PGOPTIONS, `-c synchronous_commit=${synchronousCommit}`].filter((o) => o !== undefined && o.trim() !== '').join(' ');
}

/** The longest name run() gives a statement after the prefix: the longest name the broker uses, and a form's `:4`. */
const MAX_STATEMENT_SUFFIX = 20;

/**
 * What every prepared statement's name of this schema starts with. The schema
 * is in it when it leaves room for MAX_STATEMENT_SUFFIX more bytes (so names
 * read `pgasynq:jobs:claim` in pg_prepared_statements); a longer schema is
 * named by the first 16 hex digits of its SHA-256, which keeps the names of
 * two schemas on one connection apart.
 */
function statementPrefix(schema: string): string {
  const readable = `pgasynq:${schema}:`;
  if (readable.length + MAX_STATEMENT_SUFFIX <= MAX_IDENTIFIER_BYTES) return readable;
  return `pgasynq:${createHash('sha256').update(schema).digest('hex').slice(0, 16)}:`;
}

/** Whether `pool` has what Db uses of a pg.Pool (a plain `{}` would fail later as "pool.on is not a function"). */
function isPool(pool: unknown): boolean {
  const p = pool as Partial<Record<'connect' | 'query' | 'on', unknown>>;
  return typeof p === 'object' && typeof p.connect === 'function' && typeof p.query === 'function' && typeof p.on === 'function';
}

const GUARDED = Symbol('pgasynq.guarded');

/**
 * Keeps a lost connection from crashing the process, once per pool (a
 * borrowed pool may back many Clients and Servers: one listener each would
 * pile up). An idle client that loses its connection emits 'error' on the
 * pool; a checked-out client whose connection dies between two statements (a
 * transaction waiting on its caller: ctx.transaction, the recoverer's) emits
 * it on itself, where pg-pool does not listen. Swallowed: the next query on
 * that client fails, and the pool discards it.
 */
function guardPool(pool: pg.Pool & { [GUARDED]?: true }, clients: boolean): void {
  if (pool[GUARDED]) return;
  pool[GUARDED] = true;
  pool.on('error', () => {});
  if (clients) pool.on('connect', (client: pg.PoolClient) => void client.on('error', () => {}));
}

function isKyselyExecutor(tx: Transactional): tx is AnyTransaction {
  return typeof (tx as AnyTransaction).getExecutor === 'function';
}

/** A readable name of the server a pool connects to: "host:port/database", without user or password. */
function describeTarget(pool: pg.Pool): string {
  const o = (pool as { options?: pg.PoolConfig }).options ?? {};
  let host = o.host;
  let port: string | number | undefined = o.port;
  let database = o.database;
  const cs = o.connectionString;
  // As pg does, what the connection string says wins.
  if (cs !== undefined && /^postgres(?:ql)?:\/\//.test(cs)) {
    try {
      const url = new URL(cs);
      host = url.hostname || url.searchParams.get('host') || host;
      port = url.port || port;
      database = decodeURIComponent(url.pathname.slice(1)) || database;
    } catch {
      // a URL the driver will refuse anyway
    }
  } else if (cs !== undefined) {
    const kv = (key: string) => new RegExp(`(?:^|\\s)${key}\\s*=\\s*'?([^'\\s]*)`).exec(cs)?.[1] || undefined;
    host = kv('host') ?? host;
    port = kv('port') ?? port;
    database = kv('dbname') ?? database;
  }
  return `${host ?? process.env.PGHOST ?? 'localhost'}:${port ?? process.env.PGPORT ?? 5432}/${database ?? process.env.PGDATABASE ?? ''}`;
}
