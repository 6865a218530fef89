/**
 * What the bad-input test files share (not a test file itself): the table of
 * the reliability plan (§6) runs as parameterised tests against the real
 * library and a real PostgreSQL, a slice per file (the rows are in
 * bad-input-rows-*.ts); every row names the input,
 * the typed error class it must raise (exported by the package), and a
 * pattern its message must match: the field, the rule, the offending value.
 *
 * Where the check can happen before any SQL, the row proves it did: the
 * Client, Inspector, Scheduler, Server and migrate() under test run on a real
 * pg.Pool whose connect() and query() are counted (a real pool to the real
 * database, only counted), and the count must not move. Every refused call
 * must also leave the tables as they were (nothing half-written), and no
 * message may hold a DSN password.
 *
 * Where our names or wording differ from the plan's (what the README and
 * the TSDoc document wins; the library's wording was kept where it is as
 * clear), the row says so in `note`:
 *
 *   - the CLI is `pgasynq` with the commands of the README's "The pgasynq
 *     command" (`task inspect Q ID`, `task ls --queue Q --state S`,
 *     `task deleteall Q S`), and its usage errors are commander's
 *     ("missing required argument 'id'");
 *   - `timeout: 0` means "not set" (EnqueueOptions.timeout), so it is
 *     accepted, and durations run up to 2^31-1 ms (Node's timer limit), not
 *     24 h;
 *   - cron errors are all InvalidCronSpecError (field `cronspec` or
 *     `location`), a never-firing spec included; a bad Scheduler `location` is
 *     a ConfigError;
 *   - heartbeatInterval must be below leaseDuration / 2 (the README's server
 *     options), not /3; the smallest recoverInterval is 10 ms; concurrency
 *     goes up to 10,000;
 *   - the Inspector pages by number, so there is no cursor to tamper with: an
 *     unknown list option (`cursor`) is refused instead.
 *
 * Row 39 (refuse a destructive CLI action without --yes) is left out on
 * purpose: the CLI's `task deleteall Q STATE` (README) has no --yes, and
 * asynq's CLI does not ask either; scripts that run it must keep working.
 */
import assert from 'node:assert/strict';
import { after, before } from 'node:test';
import * as lib from '../src/index.js';
import { Client, Inspector, Scheduler, ServeMux, Server, Task, ValidationError, type EnqueueOptions, type Logger, type ServerConfig } from '../src/index.js';
import { countedPool, DATABASE_URL, runCli, test, testDb, waitFor, type TestDb } from './helpers.js';

export const MIB = 1_048_576;

// The file's database and the objects under test, made by setupBadInput() (each test file is a process of its own).
export let db: TestDb;
/** The counted pool every object under test runs on. */
export let pool: ReturnType<typeof countedPool>;
export let client: Client;
export let inspector: Inspector;

/** Row counts of every table a refused call could have written to. */
async function snapshot(): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const t of ['tasks', 'queues', 'unique_locks', 'scheduler_entries', 'scheduler_events', 'servers']) {
    const [r] = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM {{schema}}.${t}`);
    out[t] = r?.n ?? -1;
  }
  return out;
}

/** What a row observed: an error's class name and message, a CLI's exit code and stderr, a stored last_error. */
export interface Seen {
  name: string;
  message: string;
  error?: unknown;
}

export async function thrown(fn: () => unknown): Promise<Seen> {
  try {
    await fn();
  } catch (error) {
    return { name: (error as Error)?.name ?? typeof error, message: (error as Error)?.message ?? String(error), error };
  }
  return { name: '(nothing thrown)', message: '' };
}

export async function cli(...args: string[]): Promise<Seen> {
  const r = await runCli(['--database-url', DATABASE_URL, '--schema', db.schema, ...args]);
  assert.equal(r.stdout, '', 'a usage error prints nothing on stdout');
  return { name: `exit ${r.code}`, message: r.stderr };
}

// --- the runtime rows share one server ------------------------------------------

/** Warnings the runtime server logged, as [message, bindings]. */
export const warnings: [string, Record<string, unknown>][] = [];
function captureLogger(bindings: Record<string, unknown> = {}): Logger {
  const noop = () => {};
  return {
    debug: noop,
    info: noop,
    error: noop,
    warn: (obj, msg) => warnings.push([msg ?? '', { ...bindings, ...obj }]),
    child: (b) => captureLogger({ ...bindings, ...b }),
  };
}

export const BAD_DELAYS: Record<string, number> = { 'delay:nan': Number.NaN, 'delay:negative': -1, 'delay:infinity': Number.POSITIVE_INFINITY };
let runtime: Promise<{ server: Server; client: Client }> | undefined;

/** A Server whose handlers throw what the runtime rows need, on a pool of its own (not counted). */
export function runtimeServer(): Promise<{ server: Server; client: Client }> {
  runtime ??= (async () => {
    const mux = new ServeMux()
      .handle('throw:string', () => {
        throw 'boom';
      })
      .handle('throw:undefined', () => {
        throw undefined;
      })
      .handle('delay:', () => {
        throw new Error('fails, to be retried');
      })
      .handle('result:surrogate', async (_task, ctx) => {
        try {
          await ctx.writeResult({ 'k\uD800': 1 });
        } catch (err) {
          throw new Error(`${(err as Error).name}: ${(err as Error).message}`, { cause: err });
        }
      })
      .handle('ok', () => {});
    const config: ServerConfig = {
      connectionString: DATABASE_URL,
      schema: db.schema,
      concurrency: 4,
      taskCheckInterval: 50,
      delayedTaskCheckInterval: 50,
      logger: captureLogger(),
      retryDelay: (_n, _err, task) => BAD_DELAYS[task.type] ?? 3_600_000,
    };
    const server = new Server(config);
    await server.start(mux);
    return { server, client: new Client({ connectionString: DATABASE_URL, schema: db.schema }) };
  })();
  return runtime;
}

export async function taskRow(id: string): Promise<{ state: string; retried: number; error_msg: string | null; delay_s: number | null } | undefined> {
  const [r] = await db.query(
    'SELECT state, retried, error_msg, extract(epoch FROM run_at - last_failed_at)::float8 AS delay_s FROM {{schema}}.tasks WHERE id = $1',
    [id],
  );
  return r;
}

/** Enqueues a task of `type` on the runtime server and waits until it went to retry. */
export async function failOnce(type: string): Promise<NonNullable<Awaited<ReturnType<typeof taskRow>>>> {
  const { client: c } = await runtimeServer();
  const info = await c.enqueue(new Task(type), { maxRetry: 5 });
  return waitFor(
    async () => {
      const r = await taskRow(info.id);
      return r?.state === 'retry' ? r : undefined;
    },
    20_000,
    `${type} in retry`,
  );
}

/** The worker still processes: a fresh task completes. */
export async function stillWorking(): Promise<void> {
  const { client: c } = await runtimeServer();
  const info = await c.enqueue(new Task('ok'), { retention: 60_000 });
  await waitFor(async () => (await taskRow(info.id))?.state === 'completed', 20_000, 'an ok task completed');
}

// --- the table ------------------------------------------------------------------

export interface Row {
  /** The row number in the plan's §6 table. */
  n: number;
  surface: 'enqueue' | 'client' | 'migrate' | 'cron' | 'config' | 'CLI' | 'inspector' | 'runtime' | 'roles';
  input: string;
  /** The error class exported by the package (or, for CLI and runtime rows, what is observed). */
  error: string;
  /** The message must match: it names the field, the rule and the value. */
  message: RegExp;
  attempt: () => Promise<Seen>;
  /** Refused before any SQL: the counted pool must not move. @defaultValue true for error rows */
  sqlFree?: boolean;
  /** The tables must be as before. @defaultValue true */
  unchanged?: boolean;
  setup?: () => Promise<void>;
  /** Where we differ from the plan, and why. */
  note?: string;
}

/** A row with nothing but its six fields (no setup, note or change to the defaults). */
export const row = (n: number, surface: Row['surface'], input: string, error: string, message: RegExp, attempt: Row['attempt']): Row => ({
  n,
  surface,
  input,
  error,
  message,
  attempt,
});

export const enqueue = (task: () => Task, opts?: EnqueueOptions) => () => thrown(async () => client.enqueue(task(), opts));
export const option = (opts: Record<string, unknown>) => enqueue(() => new Task('bad:option'), opts);
export const withPayload = (payload: () => unknown) => enqueue(() => new Task('bad:payload', payload()));
export const register = (spec: string) => () => thrown(() => new Scheduler({ pool, schema: db.schema }).register(spec, new Task('cron:t')));
export const serverConfig = (config: Record<string, unknown>) => () => thrown(() => new Server({ pool, schema: db.schema, ...config }));

export const deep = (levels: number): unknown => {
  let v: unknown = 1;
  for (let i = 0; i < levels; i++) v = { a: v };
  return v;
};

// --- the hooks and the test of a row ------------------------------------------------

/** Registers a bad-input file's hooks on schema `name`: its database, counted pool, Client and Inspector; the runtime server, if a row started it, shut down after. */
export function setupBadInput(name: string): void {
  before(async () => {
    db = await testDb(name);
    pool = countedPool();
    client = new Client({ pool, schema: db.schema });
    inspector = new Inspector({ pool, schema: db.schema });
  });

  after(async () => {
    if (runtime) {
      const { server, client: c } = await runtime;
      await server.shutdown();
      await c.close();
    }
    await inspector.close();
    await client.close();
    await pool.end();
    await db.close();
  });
}

/** The test of each row (inside the caller's describe): the typed error, a message naming field and rule, no SQL, nothing written. */
export function testRows(rows: Row[]): void {
  for (const row of rows) {
    test(`#${row.n} ${row.surface}: ${row.input} → ${row.error}`, { timeout: 60_000 }, async () => {
      await row.setup?.();
      const before = await snapshot();
      const sentBefore = pool.sent;
      const seen = await row.attempt();
      const sentByAttempt = pool.sent - sentBefore;

      assert.equal(seen.name, row.error, `expected ${row.error}, got ${seen.name}: ${seen.message}`);
      assert.match(seen.message, row.message);
      assert.doesNotMatch(seen.message, /hunter2/, 'never the DSN password');
      if (seen.error !== undefined) {
        // A typed class the package exports, and for bad input a ValidationError naming its field first.
        const cls = (lib as Record<string, unknown>)[row.error];
        assert.equal(typeof cls, 'function', `${row.error} is exported by the package`);
        assert.ok(seen.error instanceof (cls as new () => Error), `an instance of the exported ${row.error}`);
        if (seen.error instanceof ValidationError)
          assert.ok(seen.message.startsWith(seen.error.field), `the message starts with the field "${seen.error.field}"`);
      }
      if (row.sqlFree ?? row.surface !== 'CLI') assert.equal(sentByAttempt, 0, 'refused before any SQL was sent');
      if (row.unchanged ?? true) assert.deepEqual(await snapshot(), before, 'nothing written');
    });
  }
}
