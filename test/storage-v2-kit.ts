/**
 * What the storage v2 test files share (not a test file itself): an admin
 * pool, schemas of their own migrated to a given version, readers of the v2
 * tables and the queue_stats view, and servers, clients and LISTENs closed
 * after each test.
 */
import { after, afterEach, before } from 'node:test';
import pg from 'pg';
import { Client, Server, Task, migrate, type ServerConfig, type TaskContext } from '../src/index.js';
import { DATABASE_URL } from './helpers.js';

// The file's admin pool, made by setupStorageV2() (each test file is a process of its own).
let admin: pg.Pool;

/** Servers and clients a test started: closed after each test, even one that failed half-way. */
export const closers: (() => Promise<unknown>)[] = [];

/**
 * Registers a storage v2 file's hooks: the admin pool, the closers run after
 * each test, and its schemas (`name` with each of `suffixes`, and
 * TEST_SCHEMA_SUFFIX) dropped at the end. Returns the base of its schema names.
 */
export function setupStorageV2(name: string, suffixes: string[]): string {
  const base = `${name}${process.env.TEST_SCHEMA_SUFFIX ?? ''}`;
  before(() => {
    admin = new pg.Pool({ connectionString: DATABASE_URL, max: 4 });
  });
  after(async () => {
    for (const s of suffixes) await admin.query(`DROP SCHEMA IF EXISTS "${base}${s}" CASCADE`).catch(() => {});
    await admin.end();
  });
  afterEach(async () => {
    await Promise.all(closers.splice(0).map((c) => c().catch(() => {})));
  });
  return base;
}

/** Runs SQL with `{{schema}}` replaced by `schema`, on the admin pool. */
export const q = async <R extends pg.QueryResultRow = any>(schema: string, text: string, values?: unknown[]): Promise<R[]> =>
  (await admin.query<R>(text.replaceAll('{{schema}}', `"${schema}"`), values)).rows;

/** Drops `schema` and migrates it anew, to `to` or the latest version. */
export async function freshSchema(schema: string, to?: string): Promise<void> {
  await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  await migrate({ connectionString: DATABASE_URL, schema, logger: false, ...(to ? { to } : {}) });
}

/** Rows of each table of v2, and whether every task has both. */
export async function v2Tables(schema: string): Promise<{ inputs: number; states: number; view: number; orphans: number }> {
  const [r] = await q(
    schema,
    `SELECT (SELECT count(*)::int FROM {{schema}}.task_inputs) AS inputs, (SELECT count(*)::int FROM {{schema}}.task_states) AS states,
            (SELECT count(*)::int FROM {{schema}}.tasks) AS view,
            (SELECT count(*)::int FROM {{schema}}.task_inputs i FULL JOIN {{schema}}.task_states s USING (seq)
              WHERE i.seq IS NULL OR s.seq IS NULL OR i.queue <> s.queue) AS orphans`,
  );
  return r;
}

/** queue_stats, by queue. */
export async function stats(schema: string): Promise<Record<string, Record<string, number>>> {
  const rows = await q(
    schema,
    `SELECT queue, pending::int, active::int, scheduled::int, retry::int, archived::int, completed::int, aggregating::int, size::int
     FROM {{schema}}.queue_stats ORDER BY queue`,
  );
  return Object.fromEntries(rows.map(({ queue, ...counts }) => [queue, counts]));
}

export async function server(schema: string, handler: (t: Task, c: TaskContext) => unknown, config: ServerConfig = {}): Promise<Server> {
  const s = new Server({
    connectionString: DATABASE_URL,
    schema,
    logger: false,
    concurrency: 1,
    taskCheckInterval: 50,
    delayedTaskCheckInterval: 50,
    shutdownTimeout: 500,
    ...config,
  });
  closers.push(() => s.shutdown());
  await s.start(handler as never);
  return s;
}

export function client(schema: string): Client {
  const c = new Client({ connectionString: DATABASE_URL, schema, logger: false });
  closers.push(() => c.close());
  return c;
}
