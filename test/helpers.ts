/**
 * Test support: every test file gets its own schema on the one test database,
 * so files run in parallel and the `schema` option is exercised everywhere.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { after, afterEach, before, beforeEach, test as nodeTest, type TestFn, type TestOptions } from 'node:test';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { Db } from '../src/broker/db.js';
import { Client, Inspector, Server, migrate, type Handler, type ServeMux, type ServerConfig, type Task, type TaskContext } from '../src/index.js';

export const DATABASE_URL = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/**
 * DATABASE_URL with some parts replaced: a DSN for another database, role,
 * password or port of the same server, whatever server the suite runs on
 * (the local one with trust auth, or an embedded one on a random port with
 * a password). `port` may be anything, even text URL would refuse.
 */
export function dsnWith(parts: { user?: string; password?: string; host?: string; port?: string | number; database?: string }): string {
  const url = new URL(DATABASE_URL);
  const user = parts.user ?? decodeURIComponent(url.username);
  const password = parts.password ?? decodeURIComponent(url.password);
  const auth = `${encodeURIComponent(user)}${password === '' ? '' : `:${encodeURIComponent(password)}`}@`;
  const port = parts.port ?? (url.port || '5432');
  const database = parts.database ?? decodeURIComponent(url.pathname.slice(1));
  return `postgres://${auth}${parts.host ?? url.hostname}:${port}/${encodeURIComponent(database)}${url.search}`;
}

export interface TestDb {
  connectionString: string;
  schema: string;
  /** A pool for the test's own SQL (assertions and setup). */
  pool: pg.Pool;
  /** Runs SQL with `{{schema}}` replaced by the test schema. */
  query<R extends pg.QueryResultRow = any>(text: string, values?: unknown[]): Promise<R[]>;
  close(): Promise<void>;
}

/** A TestDb on `name` (plus TEST_SCHEMA_SUFFIX) that connects nowhere yet: its schema is made by {@link recreateSchema}. */
function openTestDb(name: string): TestDb {
  // TEST_SCHEMA_SUFFIX lets several copies of one file run at once (stress runs).
  const schema = `${name}${process.env.TEST_SCHEMA_SUFFIX ?? ''}`;
  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 4 });
  return {
    connectionString: DATABASE_URL,
    schema,
    pool,
    async query(text, values) {
      return (await pool.query(text.replaceAll('{{schema}}', `"${schema}"`), values)).rows;
    },
    close: () => pool.end(),
  };
}

/** Drops and re-creates db's schema, migrated to the latest version. */
async function recreateSchema(db: TestDb): Promise<void> {
  await db.pool.query(`DROP SCHEMA IF EXISTS "${db.schema}" CASCADE`);
  await migrate({ connectionString: DATABASE_URL, schema: db.schema, logger: false });
}

/** Drops and re-creates `schema`, migrated to the latest version. */
export async function testDb(name: string): Promise<TestDb> {
  const db = openTestDb(name);
  await recreateSchema(db);
  return db;
}

/** Every shipped migration, in order: written out, so that a test fails when one is added or lost. */
export const MIGRATIONS = [
  '0001_initial',
  '0002_views',
  '0003_active_index',
  '0004_storage_v2',
  '0005_workflows',
  '0006_replace',
  '0007_flow_control',
  '0008_sql_enqueue',
  '0009_trust_boundary',
  '0010_worker_writes',
  '0011_clock_seam',
  '0012_transitions',
  '0013_following',
  '0014_hot_path_v3',
  '0015_bulk_enqueue',
  '0016_watch_events',
  '0017_claim_lease_tokens',
  '0018_event_pieces',
  '0019_awaited_enqueue',
];

/**
 * Empties db's schema between tests: every table of the library's but the
 * migrations' (read from the catalog, so a table a migration adds is emptied
 * too) and those in `keep`, and the test's own tables in `also`, in one
 * TRUNCATE. The file's own tables live in the schema as well: name them in
 * `keep` to keep them.
 */
export async function resetTables(db: TestDb, { also = [], keep = [] }: { also?: string[]; keep?: string[] } = {}): Promise<void> {
  const rows = await db.query<{ name: string }>(
    `SELECT c.relname AS name FROM pg_class c WHERE c.relnamespace = '{{schema}}'::regnamespace AND c.relkind IN ('r', 'p') AND c.relname <> 'migrations'`,
  );
  const tables = [...new Set([...rows.map((r) => r.name).filter((t) => !keep.includes(t)), ...also])];
  await db.query(`TRUNCATE ${tables.map((t) => `{{schema}}.${t}`).join(', ')}`);
}

/** How long a test may run before it fails: a test that hangs fails within a minute. */
export const TEST_TIMEOUT_MS = 60_000;

/** node:test's test(), with `defaultMs` as the timeout of every test that gives none of its own. */
export function testWithin(defaultMs: number): {
  (name: string, fn: TestFn): Promise<void>;
  (name: string, options: TestOptions, fn: TestFn): Promise<void>;
} {
  return (name: string, a: TestOptions | TestFn, b?: TestFn) =>
    typeof a === 'function' ? nodeTest(name, { timeout: defaultMs }, a) : nodeTest(name, { timeout: defaultMs, ...a }, b);
}

/**
 * The tests' test(): node:test's, timed out after TEST_TIMEOUT_MS unless a test
 * says otherwise (npm test gives each file as a whole 400 s, which is what
 * --test-timeout sets: it cannot time a test alone). Files whose tests spawn
 * processes one after another (the CLI's) use testWithin() with more.
 */
export const test = testWithin(TEST_TIMEOUT_MS);

/** What a test file shares: its database, a Client and an Inspector on it, and its servers. */
export interface TestFile {
  db: TestDb;
  client: Client;
  inspector: Inspector;
  broker: Db;
  /** Servers (and schedulers) a test started: shut down after each test, even one that failed half-way. */
  running: { shutdown(): Promise<void> }[];
  /** Starts a Server on db's schema, logging off, with the file's `server` config and a test's `config` on top; shut down after the test. */
  startServer: (handler: ServeMux | ((task: Task<any>, ctx: TaskContext) => unknown), config?: ServerConfig) => Promise<Server>;
  /** Empties the tables (see {@link resetTables}), as `tables` says. */
  reset: () => Promise<void>;
  /** Every column of task `id` in the tasks view; undefined when there is none. */
  taskRow: (id: string) => Promise<any>;
  /** Waits (as {@link waitFor}) until task `id` is in `state`, and returns its row then. */
  taskIn: (id: string, state: string, timeoutMs?: number) => Promise<any>;
}

/**
 * Registers a test file's hooks on schema `name`: made anew before its tests
 * (then `setup`), emptied before each test when `resetEach`, its servers shut
 * down after each test, everything closed after (`teardown` first). Client,
 * Inspector and Db exist from the start, so that a file destructures them at
 * its top; none connects before a test uses it. `server` is read at each start.
 */
export function setupDb(
  name: string,
  opts: {
    server?: ServerConfig | (() => ServerConfig);
    tables?: { also?: string[]; keep?: string[] };
    resetEach?: boolean;
    setup?: (db: TestDb) => Promise<unknown>;
    teardown?: () => Promise<unknown>;
  } = {},
): TestFile {
  const db = openTestDb(name);
  const conn = { connectionString: db.connectionString, schema: db.schema };
  const file: TestFile = {
    db,
    client: new Client(conn),
    inspector: new Inspector(conn),
    broker: new Db(conn),
    running: [],
    startServer: async (handler, config = {}) => {
      const defaults = typeof opts.server === 'function' ? opts.server() : (opts.server ?? {});
      const all = { ...defaults, ...config };
      const server = new Server({ ...(all.pool ? {} : { connectionString: db.connectionString }), schema: db.schema, logger: false, ...all });
      file.running.push(server);
      await server.start(handler as ServeMux | Handler);
      return server;
    },
    reset: () => resetTables(db, opts.tables),
    taskRow: async (id) => (await db.query('SELECT * FROM {{schema}}.tasks WHERE id = $1', [id]))[0],
    taskIn: (id, state, timeoutMs) =>
      waitFor(
        async () => {
          const r = await file.taskRow(id);
          return r?.state === state ? r : undefined;
        },
        timeoutMs,
        `task ${id} ${state}`,
      ),
  };
  before(() => recreateSchema(db).then(() => opts.setup?.(db)));
  if (opts.resetEach) beforeEach(() => file.reset());
  afterEach(async () => {
    await Promise.all(file.running.splice(0).map((s) => s.shutdown()));
  });
  after(async () => {
    await opts.teardown?.();
    await Promise.all([file.client.close(), file.inspector.close(), file.broker.close()]);
    await db.close();
  });
  return file;
}

/** Polls `check` until it returns a truthy value (returned), or fails after `timeoutMs`. */
export async function waitFor<T>(check: () => Promise<T> | T, timeoutMs = 20_000, what = 'condition'): Promise<NonNullable<T>> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A promise with its resolve function, for handlers a test releases. */
export function deferred<T = void>(): { promise: Promise<T>; resolve: (v: T) => void; reject: (e: unknown) => void } {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** Rows of the tasks table by state, for assertions. */
export async function countByState(db: TestDb): Promise<Record<string, number>> {
  const rows = await db.query<{ state: string; n: number }>('SELECT state, count(*)::int AS n FROM {{schema}}.tasks GROUP BY state');
  return Object.fromEntries(rows.map((r) => [r.state, r.n]));
}

/** The repository's root, where child processes run. */
export const REPO = fileURLToPath(new URL('..', import.meta.url));

export interface ChildRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs `node --import tsx ...args` in the repository, as a user runs an
 * example. DATABASE_URL is unset in the child unless `env` sets it.
 */
export function runNode(args: string[], env: Record<string, string> = {}): Promise<ChildRun> {
  return runCollecting(['--import', 'tsx', ...args], env);
}

/**
 * Runs the built CLI as the package's `bin` runs it: `node dist/cli/main.js ...args`.
 * DATABASE_URL is unset in the child unless `env` sets it.
 */
export function runCli(args: string[], env: Record<string, string> = {}): Promise<ChildRun> {
  return runCollecting([builtCli(), ...args], env);
}

/** `npm run build` before a suite runs, so that the CLI tests never run an older build than src/. */
export function buildOrExit(): void {
  const build = spawnSync('npm', ['run', '--silent', 'build'], { stdio: 'inherit' });
  if (build.status !== 0) process.exit(build.status ?? 1);
}

let checkedBuild: string | undefined;

/**
 * The path of the built CLI, after checking that it is newer than every file
 * in src/. The CLI tests run plain JavaScript, as users do: a TypeScript
 * loader costs seconds per process on a busy two-core machine, and CLI tests
 * start hundreds of processes. `npm test` builds first; running one file after
 * editing src/ without `npm run build` is refused rather than testing old code.
 */
export function builtCli(): string {
  if (checkedBuild !== undefined) return checkedBuild;
  const main = join(REPO, 'dist', 'cli', 'main.js');
  const builtAt = existsSync(main) ? statSync(main).mtimeMs : 0;
  const newer = (readdirSync(join(REPO, 'src'), { recursive: true }) as string[]).find((f) => statSync(join(REPO, 'src', f)).mtimeMs > builtAt);
  if (builtAt === 0 || newer !== undefined) {
    throw new Error(`dist/ is ${builtAt === 0 ? 'missing' : `older than src/${newer}`}: run \`npm run build\` (npm test builds before it runs)`);
  }
  return (checkedBuild = main);
}

function runCollecting(argv: string[], env: Record<string, string>): Promise<ChildRun> {
  const childEnv: NodeJS.ProcessEnv = { ...process.env, ...env };
  if (!('DATABASE_URL' in env)) delete childEnv.DATABASE_URL;
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, argv, { cwd: REPO, env: childEnv });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/**
 * Counts every task that leaves `waiting` in db's schema (a trigger of the
 * test's own on task_states), so that a test counts releases instead of
 * inferring them from final states. Resolves to a reader: the states each
 * task went to, by id, in order.
 */
export async function countReleases(db: TestDb): Promise<() => Promise<Record<string, string[]>>> {
  await db.query(`
    CREATE TABLE {{schema}}.t_releases (id text, state text, at timestamptz DEFAULT clock_timestamp());
    CREATE FUNCTION {{schema}}.t_count_release() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO {{schema}}.t_releases (id, state) SELECT i.id, NEW.state FROM {{schema}}.task_inputs i WHERE i.seq = NEW.seq;
      RETURN NULL;
    END $$;
    CREATE TRIGGER t_count_release AFTER UPDATE OF state ON {{schema}}.task_states FOR EACH ROW
      WHEN (OLD.state = 'waiting' AND NEW.state <> 'waiting') EXECUTE FUNCTION {{schema}}.t_count_release();`);
  return async () => {
    const out: Record<string, string[]> = {};
    for (const r of await db.query<{ id: string; state: string }>('SELECT id, state FROM {{schema}}.t_releases ORDER BY at')) (out[r.id] ??= []).push(r.state);
    return out;
  };
}

/** A child process of test/fixtures/ that prints one JSON event per line on stdout. */
export interface Fixture {
  child: ChildProcess;
  events: Record<string, unknown>[];
  /** The first event of this name not taken yet (waiting for it if need be). */
  next(event: string): Promise<Record<string, unknown>>;
}

/** How long a test waits for a fixture process's event. */
const FIXTURE_WAIT_MS = 90_000;

/** Starts `node --import tsx <script>` with `env` added to the test's environment. */
export function spawnFixture(script: string, env: Record<string, string>): Fixture {
  const child = spawn(process.execPath, ['--import', 'tsx', script], { cwd: REPO, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'inherit'] });
  const events: Record<string, unknown>[] = [];
  const waiters: [string, (e: Record<string, unknown>) => void, (err: Error) => void][] = [];
  let exit: string | undefined;
  // A child that ended (a crash, a missing variable; 'close': its output is all read) fails the waits for its
  // events at once, not after FIXTURE_WAIT_MS.
  child.on('close', (code, signal) => {
    exit = `${script} exited (${signal ?? `code ${code}`})`;
    for (const [event, , reject] of waiters.splice(0)) reject(new Error(`${exit} before printing a "${event}" event`));
  });
  const taken = new WeakSet<object>();
  createInterface({ input: child.stdout }).on('line', (line) => {
    const e = JSON.parse(line) as Record<string, unknown>;
    events.push(e);
    const w = waiters.findIndex(([name]) => name === e.event);
    if (w === -1) return;
    taken.add(e);
    waiters.splice(w, 1)[0]![1](e);
  });
  return {
    child,
    events,
    next: (event) => {
      const seen = events.find((e) => e.event === event && !taken.has(e));
      if (seen) return (taken.add(seen), Promise.resolve(seen));
      if (exit !== undefined) return Promise.reject(new Error(`${exit} before printing a "${event}" event`));
      return new Promise((resolve, reject) => {
        // Generous: a process that loads the library through tsx on a loaded 2-core machine (four test
        // files and their children at once) took over 20 s to boot. Readiness is waited for, not judged.
        const timer = setTimeout(() => reject(new Error(`${script} printed no "${event}" event in ${FIXTURE_WAIT_MS / 1000} s`)), FIXTURE_WAIT_MS);
        waiters.push([event, (e) => (clearTimeout(timer), resolve(e)), (err) => (clearTimeout(timer), reject(err))]);
      });
    },
  };
}

/** Resolves once the child has exited. */
export const exited = (child: ChildProcess) =>
  new Promise<void>((r) => (child.exitCode !== null || child.signalCode !== null ? r() : child.once('exit', () => r())));

/** A real pool to the test database that counts its connect() and query() calls: any SQL sent moves `sent`. */
export function countedPool(): pg.Pool & { readonly sent: number } {
  const p = new pg.Pool({ connectionString: DATABASE_URL, max: 3 });
  let sent = 0;
  const query = p.query.bind(p) as (...args: unknown[]) => unknown;
  const connect = p.connect.bind(p) as (...args: unknown[]) => unknown;
  Object.assign(p, {
    query: (...args: unknown[]) => {
      sent++;
      return query(...args);
    },
    connect: (...args: unknown[]) => {
      sent++;
      return connect(...args);
    },
  });
  Object.defineProperty(p, 'sent', { get: () => sent });
  return p as pg.Pool & { readonly sent: number };
}

/** The error `fn` rejects with (or throws synchronously); fails the test when it succeeds. */
export async function caught(fn: () => unknown): Promise<unknown> {
  try {
    await fn();
  } catch (err) {
    return err;
  }
  assert.fail('expected an error');
}
