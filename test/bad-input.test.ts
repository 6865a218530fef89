/**
 * The bad-input table of the reliability plan (§6), as one parameterised test
 * against the real library and a real PostgreSQL: every row names the input,
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
import { after, before, describe } from 'node:test';
import * as lib from '../src/index.js';
import {
  Client,
  Inspector,
  MAX_PAYLOAD_BYTES,
  Scheduler,
  ServeMux,
  Server,
  Task,
  ValidationError,
  migrate,
  type EnqueueOptions,
  type Logger,
  type ServerConfig,
  type TaskInfo,
} from '../src/index.js';
import { countedPool, DATABASE_URL, runCli, test, testDb, waitFor, type TestDb } from './helpers.js';

const MIB = 1_048_576;

let db: TestDb;
/** The counted pool every object under test runs on. */
let pool: ReturnType<typeof countedPool>;
let client: Client;
let inspector: Inspector;

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
interface Seen {
  name: string;
  message: string;
  error?: unknown;
}

async function thrown(fn: () => unknown): Promise<Seen> {
  try {
    await fn();
  } catch (error) {
    return { name: (error as Error)?.name ?? typeof error, message: (error as Error)?.message ?? String(error), error };
  }
  return { name: '(nothing thrown)', message: '' };
}

async function cli(...args: string[]): Promise<Seen> {
  const r = await runCli(['--database-url', DATABASE_URL, '--schema', db.schema, ...args]);
  assert.equal(r.stdout, '', 'a usage error prints nothing on stdout');
  return { name: `exit ${r.code}`, message: r.stderr };
}

// --- the runtime rows share one server ------------------------------------------

/** Warnings the runtime server logged, as [message, bindings]. */
const warnings: [string, Record<string, unknown>][] = [];
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

const BAD_DELAYS: Record<string, number> = { 'delay:nan': Number.NaN, 'delay:negative': -1, 'delay:infinity': Number.POSITIVE_INFINITY };
let runtime: Promise<{ server: Server; client: Client }> | undefined;

/** A Server whose handlers throw what the runtime rows need, on a pool of its own (not counted). */
function runtimeServer(): Promise<{ server: Server; client: Client }> {
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

async function taskRow(id: string): Promise<{ state: string; retried: number; error_msg: string | null; delay_s: number | null } | undefined> {
  const [r] = await db.query(
    'SELECT state, retried, error_msg, extract(epoch FROM run_at - last_failed_at)::float8 AS delay_s FROM {{schema}}.tasks WHERE id = $1',
    [id],
  );
  return r;
}

/** Enqueues a task of `type` on the runtime server and waits until it went to retry. */
async function failOnce(type: string): Promise<NonNullable<Awaited<ReturnType<typeof taskRow>>>> {
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
async function stillWorking(): Promise<void> {
  const { client: c } = await runtimeServer();
  const info = await c.enqueue(new Task('ok'), { retention: 60_000 });
  await waitFor(async () => (await taskRow(info.id))?.state === 'completed', 20_000, 'an ok task completed');
}

// --- the table ------------------------------------------------------------------

interface Row {
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
const row = (n: number, surface: Row['surface'], input: string, error: string, message: RegExp, attempt: Row['attempt']): Row => ({
  n,
  surface,
  input,
  error,
  message,
  attempt,
});

const enqueue = (task: () => Task, opts?: EnqueueOptions) => () => thrown(async () => client.enqueue(task(), opts));
const option = (opts: Record<string, unknown>) => enqueue(() => new Task('bad:option'), opts);
const withPayload = (payload: () => unknown) => enqueue(() => new Task('bad:payload', payload()));
const register = (spec: string) => () => thrown(() => new Scheduler({ pool, schema: db.schema }).register(spec, new Task('cron:t')));
const serverConfig = (config: Record<string, unknown>) => () => thrown(() => new Server({ pool, schema: db.schema, ...config }));

const deep = (levels: number): unknown => {
  let v: unknown = 1;
  for (let i = 0; i < levels; i++) v = { a: v };
  return v;
};

const ROWS: Row[] = [
  row(1, 'enqueue', 'queue ""', 'InvalidQueueNameError', /^queue must be 1–100 characters \(got 0\)$/, option({ queue: '' })),
  row(2, 'enqueue', 'queue of 101 × a', 'InvalidQueueNameError', /^queue must be 1–100 characters \(got 101\)$/, option({ queue: 'a'.repeat(101) })),
  row(
    3,
    'enqueue',
    'queue " default"',
    'InvalidQueueNameError',
    /^queue may contain only A–Z a–z 0–9 _ \. : - \(found " " at index 0\)$/,
    option({ queue: ' default' }),
  ),
  row(
    4,
    'enqueue',
    `queue "default'; DROP TABLE tasks;--"`,
    'InvalidQueueNameError',
    /^queue may contain only .* \(found "'" at index 7\)$/,
    option({ queue: "default'; DROP TABLE tasks;--" }),
  ),
  {
    n: 5,
    surface: 'enqueue',
    input: 'queue "a\\u0000b"',
    error: 'InvalidQueueNameError',
    message: /^queue may contain only .* \(NUL character at index 1\)$/,
    attempt: option({ queue: 'a\u0000b' }),
    note: 'refused on the client, never PostgreSQL 22021',
  },
  row(
    6,
    'enqueue',
    'task type ""',
    'InvalidTaskTypeError',
    /^type must be 1–100 characters, not blank \(got 0\)$/,
    enqueue(() => new Task('')),
  ),
  row(
    7,
    'enqueue',
    'task type "email:\\uD800"',
    'InvalidTaskTypeError',
    /^type is not valid Unicode \(lone surrogate at index 6\)$/,
    enqueue(() => new Task('email:\uD800')),
  ),
  row(
    8,
    'enqueue',
    'payload { amount: 10n }',
    'PayloadSerializationError',
    /^payload is not JSON-serialisable: BigInt \(encode it as a string\) at \$\.amount$/,
    withPayload(() => ({ amount: 10n })),
  ),
  {
    n: 9,
    surface: 'enqueue',
    input: 'payload with a cycle (a.self = a)',
    error: 'PayloadSerializationError',
    message: /^payload is not JSON-serialisable: circular reference at \$\.self$/,
    attempt: withPayload(() => {
      const a: Record<string, unknown> = { x: 1 };
      a.self = a;
      return a;
    }),
  },
  row(
    10,
    'enqueue',
    'payload of 1,048,577 bytes (cap 1 MiB)',
    'PayloadTooLargeError',
    /^payload is 1048577 bytes as JSON; the limit is 1048576 \(option maxPayloadBytes\)$/,
    withPayload(() => 'x'.repeat(MIB - 1)),
  ),
  row(
    10,
    'enqueue',
    'bytes payload of 1,048,577 bytes',
    'PayloadTooLargeError',
    /^payload is 1048577 bytes; the limit is 1048576 \(option maxPayloadBytes\)$/,
    withPayload(() => new Uint8Array(MIB + 1)),
  ),
  row(
    10,
    'enqueue',
    'payload of 101 bytes, Client maxPayloadBytes: 100',
    'PayloadTooLargeError',
    /^payload is 101 bytes as JSON; the limit is 100 \(option maxPayloadBytes\)$/,
    () => thrown(() => new Client({ pool, schema: db.schema, maxPayloadBytes: 100 }).enqueue(new Task('t', 'x'.repeat(99)))),
  ),
  {
    n: 10,
    surface: 'enqueue',
    input: 'enqueueMany, second payload over maxPayloadBytes: 100',
    error: 'PayloadTooLargeError',
    message: /^tasks\[1\]\.payload is 101 bytes as JSON; the limit is 100 \(option maxPayloadBytes\)$/,
    attempt: () =>
      thrown(() => new Client({ pool, schema: db.schema, maxPayloadBytes: 100 }).enqueueMany([new Task('t', 'ok'), new Task('t', 'x'.repeat(99))])),
  },
  row(10, 'config', 'Client maxPayloadBytes: 0', 'ConfigError', /^maxPayloadBytes must be an integer in \[1, 268435455\] \(got 0\)$/, () =>
    thrown(() => new Client({ pool, schema: db.schema, maxPayloadBytes: 0 })),
  ),
  row(
    11,
    'enqueue',
    'payload { f: () => 1 }',
    'PayloadSerializationError',
    /^payload is not JSON-serialisable: function at \$\.f$/,
    withPayload(() => ({ f: () => 1 })),
  ),
  row(
    12,
    'enqueue',
    'payload { ratio: NaN }',
    'PayloadSerializationError',
    /^payload is not JSON-serialisable: non-finite number NaN at \$\.ratio$/,
    withPayload(() => ({ ratio: Number.NaN })),
  ),
  row(
    13,
    'enqueue',
    'payload nested 1,000 levels deep',
    'PayloadSerializationError',
    /^payload nesting depth exceeds the limit of 64 levels at \$(\.a){59}\.…$/,
    withPayload(() => deep(1000)),
  ),
  row(14, 'enqueue', 'maxRetry: -1', 'InvalidOptionError', /^maxRetry must be an integer in \[0, 1000\] \(got -1\)$/, option({ maxRetry: -1 })),
  row(15, 'enqueue', 'maxRetry: 2.5', 'InvalidOptionError', /^maxRetry must be an integer in \[0, 1000\] \(got 2\.5\)$/, option({ maxRetry: 2.5 })),
  ...[-1000, Number.NaN, Number.POSITIVE_INFINITY].map((timeout): Row => ({
    n: 16,
    surface: 'enqueue',
    input: `timeout: ${timeout}`,
    error: 'InvalidOptionError',
    message: new RegExp(`^timeout must be a finite duration in ms in \\[0, 2147483647\\] \\(got ${timeout}\\)$`),
    attempt: option({ timeout }),
    note: 'timeout: 0 means "not set" (EnqueueOptions.timeout) and is accepted; the upper bound is 2^31-1 ms, not 24 h',
  })),
  row(17, 'enqueue', "processAt: new Date('nope')", 'InvalidOptionError', /^processAt is an Invalid Date$/, option({ processAt: new Date('nope') })),
  ...(
    [
      [18, 'public; DROP SCHEMA public CASCADE', /^schema must match \^\[a-z_\]\[a-z0-9_\]\*\$ \(found ";" at index 6\)$/],
      [19, 'pg_catalog', /^schema may not start with "pg_" \(reserved by PostgreSQL\)$/],
      [19, 'pg_pgq', /^schema may not start with "pg_" \(reserved by PostgreSQL\)$/],
      [20, "o'brien", /^schema must match .* \(found "'" at index 1\)$/],
      [20, 'a$$b', /^schema must match .* \(found "\$" at index 1\)$/],
      [20, 'Queue', /^schema must match .* \(found "Q" at index 0\)$/],
      [20, 'x.job', /^schema must match .* \(found "\." at index 1\)$/],
      [21, '', /^schema must be 1–55 characters \(got 0\): its notification channels, such as <schema>_delayed, must fit PostgreSQL's 63-byte names$/],
      [21, 'a'.repeat(64), /^schema must be 1–55 characters \(got 64\): .*_delayed/],
      // Issue #26 finding 11: <schema>_delayed must be an identifier (pg_notify refused 56–63 characters: 22023).
      [
        21,
        'a'.repeat(56),
        /^schema must be 1–55 characters \(got 56\): its notification channels, such as <schema>_delayed, must fit PostgreSQL's 63-byte names$/,
      ],
    ] as const
  ).flatMap(([n, schema, message]): Row[] => [
    {
      n,
      surface: 'client',
      input: `schema ${JSON.stringify(schema.length > 24 ? `${schema.slice(0, 24)}… (${schema.length} characters)` : schema)}`,
      error: 'InvalidSchemaNameError',
      message,
      attempt: () => thrown(() => new Client({ pool, schema })),
    },
    {
      n,
      surface: 'migrate',
      input: `schema ${JSON.stringify(schema.length > 24 ? `${schema.slice(0, 24)}… (${schema.length} characters)` : schema)}`,
      error: 'InvalidSchemaNameError',
      message,
      attempt: () => thrown(() => migrate({ pool, schema })),
    },
  ]),
  row(
    22,
    'enqueue',
    'task id "../etc/passwd"',
    'InvalidTaskIdError',
    /^taskId must start with a letter, a digit or _ \(found "\." at index 0\)$/,
    option({ taskId: '../etc/passwd' }),
  ),
  row(
    22,
    'enqueue',
    'task id "a b"',
    'InvalidTaskIdError',
    /^taskId may contain only A–Z a–z 0–9 _ \. : - \(found " " at index 1\)$/,
    option({ taskId: 'a b' }),
  ),
  row(22, 'enqueue', 'task id of 200 characters', 'InvalidTaskIdError', /^taskId must be 1–128 characters \(got 200\)$/, option({ taskId: 'i'.repeat(200) })),
  {
    n: 23,
    surface: 'enqueue',
    input: 'a task id that already exists in the queue',
    error: 'TaskIdConflictError',
    message: /^task ID conflicts with another task: id=x in queue "q"$/,
    setup: async () => {
      await db.query('DELETE FROM {{schema}}.tasks WHERE queue = $1 AND id = $2', ['q', 'x']);
      await client.enqueue(new Task('dup'), { queue: 'q', taskId: 'x' });
    },
    attempt: enqueue(() => new Task('dup:other'), { queue: 'q', taskId: 'x' }),
    sqlFree: false,
    note: "asynq's wording (ErrTaskIDConflict); needs the database, so SQL is sent",
  },
  row(
    24,
    'enqueue',
    'unique: 0',
    'InvalidOptionError',
    /^unique must be a finite duration in ms in \[1000, 31557600000000\] \(1000 years\) \(got 0\)$/,
    option({ unique: 0 }),
  ),
  row(
    24,
    'enqueue',
    'unique: -1000',
    'InvalidOptionError',
    /^unique must be a finite duration in ms in \[1000, 31557600000000\] \(1000 years\) \(got -1000\)$/,
    option({ unique: -1000 }),
  ),
  row(
    25,
    'enqueue',
    'processIn: -5000',
    'InvalidOptionError',
    /^processIn must be a finite duration in ms in \[0, 2147483647\] \(got -5000\)$/,
    option({ processIn: -5000 }),
  ),
  row(
    26,
    'cron',
    '"* * * * * * *"',
    'InvalidCronSpecError',
    /^cronspec does not parse: .*exactly 5 or 6 parts, but pattern '\* \* \* \* \* \* \*' has 7 parts/,
    register('* * * * * * *'),
  ),
  row(
    27,
    'cron',
    '"61 * * * *"',
    'InvalidCronSpecError',
    /^cronspec does not parse: Invalid value for minute: 61 \(got "61 \* \* \* \*"\)$/,
    register('61 * * * *'),
  ),
  row(
    28,
    'cron',
    '"*/0 * * * *"',
    'InvalidCronSpecError',
    /^cronspec does not parse: .*illegal stepping: 0 \(got "\*\/0 \* \* \* \*"\)$/,
    register('*/0 * * * *'),
  ),
  {
    n: 29,
    surface: 'cron',
    input: '"0 0 31 2 *"',
    error: 'InvalidCronSpecError',
    message: /^cronspec never fires \(got "0 0 31 2 \*"\)$/,
    attempt: register('0 0 31 2 *'),
    note: 'one class for every bad spec: InvalidCronSpecError, not ScheduleNeverFiresError',
  },
  row(30, 'cron', 'location "Mars/Olympus_Mons"', 'ConfigError', /^location is not a known IANA time zone \(got "Mars\/Olympus_Mons"\)$/, () =>
    thrown(() => new Scheduler({ pool, schema: db.schema, location: 'Mars/Olympus_Mons' })),
  ),
  row(
    30,
    'cron',
    '"CRON_TZ=Mars/Olympus_Mons * * * * *"',
    'InvalidCronSpecError',
    /^cronspec is not a known IANA time zone \(got "Mars\/Olympus_Mons"\)$/,
    register('CRON_TZ=Mars/Olympus_Mons * * * * *'),
  ),
  {
    n: 31,
    surface: 'cron',
    input: 'a 10,000-character expression',
    error: 'InvalidCronSpecError',
    message: /^cronspec must be at most 256 characters \(got 10000\)$/,
    attempt: register(`${'1,'.repeat(4999)}10`),
    note: 'timed in security.test.ts (SEC7)',
  },
  {
    n: 32,
    surface: 'config',
    input: 'heartbeatInterval: 30 s, leaseDuration: 30 s',
    error: 'ConfigError',
    message: /^heartbeatInterval \(30000 ms\) must be below leaseDuration \/ 2 \(15000 ms\)$/,
    attempt: serverConfig({ heartbeatInterval: 30_000, leaseDuration: 30_000 }),
    note: "the README's server options: below leaseDuration / 2",
  },
  row(
    33,
    'config',
    'recoverCutoff: -1000',
    'ConfigError',
    /^recoverCutoff must be a finite duration in ms in \[0, 2147483647\] \(got -1000\)$/,
    serverConfig({ recoverCutoff: -1000 }),
  ),
  row(
    33,
    'config',
    'recoverInterval: 0',
    'ConfigError',
    /^recoverInterval must be a finite duration in ms in \[10, 2147483647\] \(got 0\)$/,
    serverConfig({ recoverInterval: 0 }),
  ),
  ...[0, -1, 1e6].map((concurrency): Row => ({
    n: 34,
    surface: 'config',
    input: `concurrency: ${concurrency}`,
    error: 'ConfigError',
    message: new RegExp(`^concurrency must be an integer in \\[1, 10000\\] \\(got ${concurrency}\\)$`),
    attempt: serverConfig({ concurrency }),
  })),
  row(
    35,
    'config',
    'DSN postgres://app:hunter2@db:notaport/q',
    'ConfigError',
    /^connectionString has an invalid port "notaport" \(postgres:\/\/app:\*\*\*@db:notaport\/q\)$/,
    () => thrown(() => new Client({ connectionString: 'postgres://app:hunter2@db:notaport/q' })),
  ),
  row(
    35,
    'config',
    'DSN with port 99999',
    'ConfigError',
    /^connectionString has an invalid port "99999" \(postgres:\/\/app:\*\*\*@127\.0\.0\.1:99999\/q\)$/,
    () => thrown(() => new Inspector({ connectionString: 'postgres://app:hunter2@127.0.0.1:99999/q' })),
  ),
  {
    n: 36,
    surface: 'CLI',
    input: 'pgasynq task inspect (no id)',
    error: 'exit 2',
    message: /^error: missing required argument/,
    attempt: () => cli('task', 'inspect'),
    sqlFree: false,
  },
  {
    n: 37,
    surface: 'CLI',
    input: 'pgasynq frobnicate',
    error: 'exit 2',
    message: /^error: unknown command 'frobnicate'\n/,
    attempt: () => cli('frobnicate'),
    sqlFree: false,
  },
  {
    n: 38,
    surface: 'CLI',
    input: 'pgasynq task ls --queue default --state bogus',
    error: 'exit 2',
    message:
      /^error: option '-s, --state <state>' argument 'bogus' is invalid\. Allowed choices are active, pending, waiting, aggregating, scheduled, retry, archived, completed\.\n/,
    attempt: () => cli('task', 'ls', '--queue', 'default', '--state', 'bogus'),
    sqlFree: false,
  },
  {
    n: 38,
    surface: 'CLI',
    input: 'pgasynq task deleteall default bogus',
    error: 'exit 2',
    message: /^error: invalid state 'bogus': the states are active, pending, waiting, aggregating, scheduled, retry, archived, completed\n/,
    attempt: () => cli('task', 'deleteall', 'default', 'bogus'),
    sqlFree: false,
  },
  row(40, 'inspector', 'listPendingTasks({ pageSize: 0 })', 'InvalidOptionError', /^pageSize must be an integer in \[1, 1000\] \(got 0\)$/, () =>
    thrown(() => inspector.listPendingTasks('default', { pageSize: 0 })),
  ),
  row(40, 'inspector', 'listPendingTasks({ pageSize: 100001 })', 'InvalidOptionError', /^pageSize must be an integer in \[1, 1000\] \(got 100001\)$/, () =>
    thrown(() => inspector.listPendingTasks('default', { pageSize: 100_001 })),
  ),
  {
    n: 40,
    surface: 'inspector',
    input: 'a tampered cursor ({ cursor: "1; DROP TABLE tasks" })',
    error: 'InvalidOptionError',
    message: /^options\.cursor is not a known option \(expected one of page, pageSize\)$/,
    attempt: () => thrown(() => inspector.listPendingTasks('default', { cursor: '1; DROP TABLE tasks' } as never)),
    note: 'pages are numbers, never cursors: there is nothing to tamper with',
  },
  row(40, 'inspector', 'listPendingTasks({ page: "2" })', 'InvalidOptionError', /^page must be an integer in \[1, 1000000000\] \(got "2"\)$/, () =>
    thrown(() => inspector.listPendingTasks('default', { page: '2' } as never)),
  ),
  {
    n: 41,
    surface: 'runtime',
    input: 'handler throws "boom"',
    error: 'last_error',
    message: /^non-Error thrown: "boom"$/,
    attempt: async () => {
      const r = await failOnce('throw:string');
      assert.equal(r.retried, 1, 'retried normally');
      await stillWorking();
      return { name: 'last_error', message: r.error_msg ?? '' };
    },
    sqlFree: false,
    unchanged: false,
  },
  {
    n: 41,
    surface: 'runtime',
    input: 'handler throws undefined',
    error: 'last_error',
    message: /^non-Error thrown: undefined$/,
    attempt: async () => {
      const r = await failOnce('throw:undefined');
      assert.equal(r.retried, 1, 'retried normally');
      await stillWorking();
      return { name: 'last_error', message: r.error_msg ?? '' };
    },
    sqlFree: false,
    unchanged: false,
  },
  ...Object.entries(BAD_DELAYS).map(([type, value]): Row => ({
    n: 42,
    surface: 'runtime',
    input: `retryDelay returns ${value}: the default backoff, never a tight loop`,
    error: 'retry delay',
    message: /^default backoff: (1[5-9]|[234]\d) s$/,
    attempt: async () => {
      const r = await failOnce(type);
      assert.equal(r.retried, 1);
      // asynq's default for the first retry is 15–44 s: far from a tight loop.
      return { name: 'retry delay', message: `default backoff: ${Math.floor(r.delay_s ?? -1)} s` };
    },
    sqlFree: false,
    unchanged: false,
  })),
  {
    n: 42,
    surface: 'runtime',
    input: 'retryDelay returns NaN, -1, Infinity for 2 tasks of each type: one warning per type',
    error: 'warnings',
    message:
      /^delay:infinity: 1 \(retryDelay returned Infinity; using the default backoff.*\), delay:nan: 1 \(retryDelay returned NaN; using the default backoff.*\), delay:negative: 1 \(retryDelay returned -1; using the default backoff.*\)$/,
    attempt: async () => {
      for (const type of Object.keys(BAD_DELAYS)) await failOnce(type); // the second task of each type
      const byType = new Map<string, string[]>();
      for (const [msg, b] of warnings) if (/retryDelay/.test(msg)) byType.set(String(b.type), [...(byType.get(String(b.type)) ?? []), msg]);
      const text = [...byType.keys()]
        .sort()
        .map((t) => `${t}: ${byType.get(t)?.length} (${byType.get(t)?.[0]})`)
        .join(', ');
      return { name: 'warnings', message: text };
    },
    sqlFree: false,
    unchanged: false,
  },
  {
    n: 43,
    surface: 'enqueue',
    input: 'enqueue() after client.close()',
    error: 'ClientClosedError',
    message: /^client is closed$/,
    attempt: async () => {
      const c = new Client({ pool, schema: db.schema });
      await c.close();
      return thrown(() => c.enqueue(new Task('late')));
    },
  },
  {
    n: 43,
    surface: 'inspector',
    input: 'getQueueInfo() after inspector.close()',
    error: 'ClientClosedError',
    message: /^inspector is closed$/,
    attempt: async () => {
      const i = new Inspector({ pool, schema: db.schema });
      await i.close();
      return thrown(() => i.getQueueInfo('default'));
    },
  },
  // roleSetupSql() only builds text: each refusal comes before any of it.
  row(44, 'roles', 'roleSetupSql({ logins: "yes" })', 'InvalidOptionError', /^logins must be a boolean/, () =>
    thrown(() => lib.roleSetupSql({ logins: 'yes' as unknown as boolean })),
  ),
  row(44, 'roles', 'roleSetupSql({ prefix: "pg_app" })', 'InvalidOptionError', /^prefix may not start with "pg_"/, () =>
    thrown(() => lib.roleSetupSql({ prefix: 'pg_app' })),
  ),
  row(
    44,
    'roles',
    'roleSetupSql({ schemas: "app" }) (a misspelt option)',
    'InvalidOptionError',
    /^options\.schemas is not a known option \(expected one of schema, prefix, logins\)$/,
    () => thrown(() => lib.roleSetupSql({ schemas: 'app' } as never)),
  ),
  // ---- issue #26 (the database is the trust boundary), findings 5, 9, 11 and 13
  // Finding 5: headers have a cap of their own, counted as stored (UTF-8 JSON text).
  row(
    45,
    'enqueue',
    'headers of 20 MB (Client with the default 1 MiB maxPayloadBytes)',
    'PayloadTooLargeError',
    /^headers are 20000008 bytes as JSON; the limit is 65536 \(headers have a cap of their own\)$/,
    option({ headers: { h: 'x'.repeat(20_000_000) } }),
  ),
  row(
    45,
    'enqueue',
    'headers with 100,000 keys',
    'PayloadTooLargeError',
    /^headers have 100000 keys; the limit is 1000$/,
    option({ headers: Object.fromEntries(Array.from({ length: 100_000 }, (_, i) => [`k${i}`, 'v'])) }),
  ),
  row(
    45,
    'enqueue',
    "the Task's headers and the enqueue's, 40 KB each: over the cap once merged",
    'PayloadTooLargeError',
    /^headers are 80015 bytes as JSON; the limit is 65536/,
    enqueue(() => new Task('h', null, { headers: { a: 'x'.repeat(40_000) } }), { headers: { b: 'y'.repeat(40_000) } }),
  ),
  {
    n: 45,
    surface: 'enqueue',
    input: 'a header value with a lone surrogate',
    error: 'InvalidOptionError',
    message: /^headers\.k value is not valid Unicode \(lone surrogate at index 1\)$/,
    attempt: option({ headers: { k: 'a\uD800' } }),
    note: 'was a raw 22P02 from PostgreSQL',
  },
  {
    n: 45,
    surface: 'enqueue',
    input: 'a header key with a lone surrogate',
    error: 'InvalidOptionError',
    message: /^headers key "a\\udc00" is not valid Unicode \(lone surrogate at index 1\)$/,
    attempt: option({ headers: { 'a\uDC00': 'v' } }),
    note: 'was a raw 22P02 from PostgreSQL',
  },
  row(
    45,
    'enqueue',
    'a header key with a NUL',
    'InvalidOptionError',
    /^headers key "a\\u0000" may not contain a NUL character \(found at index 1\)$/,
    option({ headers: { 'a\u0000': 'v' } }),
  ),
  row(45, 'enqueue', 'a header value that is a number', 'InvalidOptionError', /^headers\.n must be a string \(got 5\)$/, option({ headers: { n: 5 } })),
  // Finding 9 and 13: instants in years 0001–9999 UTC, durations at most 1000 years (MAX_DURATION_MS).
  ...(
    [
      ['processAt', new Date('+010000-01-01T00:00:00Z'), '\\+010000-01-01T00:00:00\\.000Z'],
      ['processAt', new Date('0000-12-31T23:59:59Z'), '0000-12-31T23:59:59\\.000Z'],
      ['deadline', new Date('+275760-09-13T00:00:00Z'), '\\+275760-09-13T00:00:00\\.000Z'],
    ] as const
  ).map(([field, at, shown]): Row => ({
    n: 46,
    surface: 'enqueue',
    input: `${field}: ${at.toISOString()}`,
    error: 'InvalidOptionError',
    message: new RegExp(`^${field} must lie in years 0001–9999 UTC \\(got ${shown}\\)$`),
    attempt: option({ [field]: at }),
    note: 'was a raw 22008/22009 from PostgreSQL, or a row no reader could show',
  })),
  {
    n: 46,
    surface: 'enqueue',
    input: 'retention: Number.MAX_SAFE_INTEGER',
    error: 'InvalidOptionError',
    message: /^retention must be a finite duration in ms in \[0, 31557600000000\] \(1000 years\) \(got 9007199254740991\)$/,
    attempt: option({ retention: Number.MAX_SAFE_INTEGER }),
    note: "was accepted, and the queue's Completed tab and the task page answered 500",
  },
  {
    n: 46,
    surface: 'enqueue',
    input: 'unique: 1e17',
    error: 'InvalidOptionError',
    message: /^unique must be a finite duration in ms in \[1000, 31557600000000\] \(1000 years\) \(got 100000000000000000\)$/,
    attempt: option({ unique: 1e17 }),
    note: 'was "interval out of range" from PostgreSQL',
  },
  row(
    46,
    'enqueue',
    'unique: MAX_DURATION_MS + 1',
    'InvalidOptionError',
    /^unique must be a finite duration in ms in \[1000, 31557600000000\] \(1000 years\) \(got 31557600000001\)$/,
    option({ unique: lib.MAX_DURATION_MS + 1 }),
  ),
  // Finding 11: a schema too long for its channels is refused up front, everywhere it is taken.
  ...(
    [
      ['server', () => new Server({ pool, schema: 'a'.repeat(56) })],
      ['inspector', () => new Inspector({ pool, schema: 'a'.repeat(56) })],
    ] as const
  ).map(([surface, attempt]): Row => ({
    n: 47,
    surface: surface === 'server' ? 'config' : 'inspector',
    input: `${surface}: schema of 56 characters`,
    error: 'InvalidSchemaNameError',
    message: /^schema must be 1–55 characters \(got 56\): its notification channels, such as <schema>_delayed, must fit PostgreSQL's 63-byte names$/,
    attempt: () => thrown(attempt),
  })),
  {
    n: 47,
    surface: 'CLI',
    input: 'pgasynq --schema <56 characters> stats',
    error: 'exit 2',
    message: /^error: schema must be 1–55 characters \(got 56\): its notification channels, such as <schema>_delayed, must fit PostgreSQL's 63-byte names\n$/,
    attempt: async () => {
      const r = await runCli(['--database-url', DATABASE_URL, '--schema', 'a'.repeat(56), 'stats']);
      assert.equal(r.stdout, '');
      return { name: `exit ${r.code}`, message: r.stderr };
    },
  },
  {
    n: 47,
    surface: 'CLI',
    input: 'pgasynq --schema <56 characters> migrate',
    error: 'exit 2',
    message: /^error: schema must be 1–55 characters \(got 56\)/,
    attempt: async () => {
      const r = await runCli(['--database-url', DATABASE_URL, '--schema', 'a'.repeat(56), 'migrate']);
      return { name: `exit ${r.code}`, message: r.stderr };
    },
  },
  // Finding 13: raw or untyped errors become typed ones naming the field.
  {
    n: 48,
    surface: 'enqueue',
    input: 'a payload key with a lone surrogate',
    error: 'PayloadSerializationError',
    message: /^payload has a key with a lone surrogate \(not valid Unicode\): "k\\ud800" at \$\.a$/,
    attempt: withPayload(() => ({ a: { 'k\uD800': 1 } })),
    note: 'was a raw 22P02 from PostgreSQL',
  },
  ...(
    [
      ['returns undefined', () => undefined, /^payload is not JSON-serialisable: its toJSON\(\) returned undefined at \$\.when$/],
      ['returns a BigInt', () => 10n, /^payload is not JSON-serialisable: BigInt \(encode it as a string\) at \$\.when$/],
      [
        'returns a cycle',
        () => {
          const a: Record<string, unknown> = {};
          a.self = a;
          return a;
        },
        /^payload is not JSON-serialisable: circular reference at \$\.when\.self$/,
      ],
      [
        'throws',
        () => {
          throw new Error('no clock');
        },
        /^payload is not JSON-serialisable: its toJSON\(\) threw \(no clock\) at \$\.when$/,
      ],
    ] as const
  ).map(([what, toJSON, message]): Row => ({
    n: 48,
    surface: 'enqueue',
    input: `a payload class whose toJSON() ${what}`,
    error: 'PayloadSerializationError',
    message,
    attempt: withPayload(() => ({
      when: new (class Stamp {
        toJSON = toJSON;
      })(),
    })),
    note: 'was a raw TypeError (or a payload stored as nothing)',
  })),
  row(
    48,
    'enqueue',
    'a Buffer inside a JSON payload (it has a toJSON(), which is not followed)',
    'PayloadSerializationError',
    /^payload is not JSON-serialisable: Buffer \(convert it to an array or object\) at \$\.b$/,
    withPayload(() => ({ b: Buffer.from('x') })),
  ),
  row(
    48,
    'enqueue',
    'a payload whose toJSON() returns undefined at the top',
    'PayloadSerializationError',
    /^payload is not JSON-serialisable: its toJSON\(\) returned undefined at \$$/,
    withPayload(() => ({ toJSON: () => undefined })),
  ),
  {
    n: 48,
    surface: 'enqueue',
    input: 'tx: {}',
    error: 'InvalidOptionError',
    message: /^tx must be a Kysely Transaction or a pg client inside BEGIN \(got an object with neither query\(\) nor getExecutor\(\)\)$/,
    attempt: () => thrown(() => client.enqueue(new Task('t'), { tx: {} as never })),
    note: 'was "tx.query is not a function"',
  },
  ...(['client', 'inspector'] as const).map((surface): Row => ({
    n: 48,
    surface: surface === 'client' ? 'client' : 'inspector',
    input: `${surface}: pool: {}`,
    error: 'ConfigError',
    message: /^pool must be a pg\.Pool \(an object with connect\(\), query\(\) and on\(\)\)$/,
    attempt: () => thrown(() => (surface === 'client' ? new Client({ pool: {} as never }) : new Inspector({ pool: {} as never }))),
    note: 'was "pool.on is not a function"',
  })),
  ...(['client', 'inspector'] as const).map((surface): Row => ({
    n: 48,
    surface: surface === 'client' ? 'client' : 'inspector',
    input: `${surface}: a misspelt option (maxPayloadByte)`,
    error: 'ConfigError',
    message: /^options\.maxPayloadByte is not a known option \(expected one of connectionString, pool, schema, .*maxPayloadBytes\)$/,
    attempt: () =>
      thrown(() =>
        surface === 'client'
          ? new Client({ pool, schema: db.schema, maxPayloadByte: 5 } as never)
          : new Inspector({ pool, schema: db.schema, maxPayloadByte: 5 } as never),
      ),
    note: 'was accepted and ignored (the Server refused it)',
  })),
  {
    n: 48,
    surface: 'enqueue',
    input: 'enqueueMany of 260 tasks of 1 MiB bytes each (over 512 MiB as sent)',
    error: 'PayloadTooLargeError',
    message: /^tasks take up to \d+ bytes as sent \(payloads, bytes as hex, and headers\); one call may send at most 535822336: split them into several calls$/,
    // One Task, listed 260 times: each is its own record with its own id, the MiB held once.
    attempt: () => thrown(() => client.enqueueMany(Array<Task>(260).fill(new Task('big', new Uint8Array(MIB))))),
    note: 'was "RangeError: Invalid string length", after building half a GiB of text',
  },
  {
    n: 48,
    surface: 'runtime',
    input: 'ctx.writeResult({ "k\\uD800": 1 })',
    error: 'last_error',
    message: /^PayloadSerializationError: result has a key with a lone surrogate \(not valid Unicode\): "k\\ud800" at \$$/,
    attempt: async () => {
      const r = await failOnce('result:surrogate');
      await stillWorking();
      return { name: 'last_error', message: r.error_msg ?? '' };
    },
    sqlFree: false,
    unchanged: false,
  },
];

before(async () => {
  db = await testDb('bad_input');
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

describe('§6 bad input: the typed error, a message naming field and rule, no SQL, nothing written', () => {
  test('the table has every row of the plan, 1 to 43, but 39 (see the header); rows after 43 are ours', () => {
    const expected = Array.from({ length: 43 }, (_, i) => i + 1).filter((n) => n !== 39);
    assert.deepEqual(
      [...new Set(ROWS.map((r) => r.n))].filter((n) => n <= 43).sort((a, b) => a - b),
      expected,
    );
  });

  for (const row of ROWS) {
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
});

describe('§6 accepted safely', () => {
  // Issue #26 finding 11: 56–63 characters broke every enqueue (channel names), ~47 and up the prepared statements (42P05).
  for (const length of [48, 55]) {
    test(`a schema name of ${length} characters works end to end: migrate, enqueue, a Server runs the tasks`, { timeout: 60_000 }, async () => {
      const suffix = process.env.TEST_SCHEMA_SUFFIX ?? '';
      const long = await testDb(`long_${'s'.repeat(length - 5 - suffix.length)}`);
      assert.equal(long.schema.length, length);
      const c = new Client({ connectionString: DATABASE_URL, schema: long.schema, logger: false });
      let ran = 0;
      const server = new Server({
        connectionString: DATABASE_URL,
        schema: long.schema,
        concurrency: 4,
        taskCheckInterval: 50,
        delayedTaskCheckInterval: 50,
        logger: false,
      });
      await server.start(
        new ServeMux().handle('long', () => {
          ran++;
        }),
      );
      try {
        // Kept and deleted on completion, pending and scheduled: the statements whose names, cut at 63 bytes, were one.
        const n = 20;
        await c.enqueueMany(Array.from({ length: n }, (_, i) => new Task('long', i, i % 2 === 0 ? { retention: 60_000 } : {})));
        await c.enqueueMany(Array.from({ length: n }, (_, i) => new Task('long', n + i, { processIn: 100 })));
        await waitFor(() => ran === 2 * n, 30_000, `${2 * n} tasks run`);
        // A handler's return comes before its completion commits: wait for the rows.
        const counts = async () =>
          (
            await long.query<{ completed: number; left: number }>(
              "SELECT count(*) FILTER (WHERE state = 'completed')::int AS completed, count(*) FILTER (WHERE state <> 'completed')::int AS left FROM {{schema}}.tasks",
            )
          )[0];
        await waitFor(async () => (await counts())?.left === 0, 10_000, 'every completion written');
        assert.deepEqual(await counts(), { completed: n / 2, left: 0 });
      } finally {
        await server.shutdown();
        await c.close();
        await long.query(`DROP SCHEMA "${long.schema}" CASCADE`);
        await long.close();
      }
    });
  }

  test('payload {"__proto__":{"polluted":true}}: stored and read back as own data, no pollution', async () => {
    const payload = JSON.parse('{"__proto__":{"polluted":true},"constructor":{"prototype":{"x":1}}}') as Record<string, unknown>;
    const info = await client.enqueue(new Task('proto', payload));
    const read = await inspector.getTaskInfo(info.queue, info.id);
    const p = read.payload as Record<string, unknown>;
    assert.ok(Object.hasOwn(p, '__proto__'), '__proto__ is an own key');
    assert.deepEqual(Object.getOwnPropertyDescriptor(p, '__proto__')?.value, { polluted: true });
    assert.equal(Object.getPrototypeOf(p), Object.prototype, 'the key did not set the prototype');
    assert.equal(({} as Record<string, unknown>).polluted, undefined);
    assert.equal(({} as Record<string, unknown>).x, undefined);
  });

  test('queue name "a:b.c-d_e": every allowed character round-trips', async () => {
    const info = await client.enqueue(new Task('chars'), { queue: 'a:b.c-d_e' });
    assert.equal(info.queue, 'a:b.c-d_e');
    assert.ok((await inspector.queues()).includes('a:b.c-d_e'));
    assert.equal((await inspector.getTaskInfo('a:b.c-d_e', info.id)).queue, 'a:b.c-d_e');
  });

  test('a payload exactly at the cap is accepted (default 1 MiB, and a Client maxPayloadBytes)', async () => {
    const atCap = await client.enqueue(new Task('cap', 'x'.repeat(MAX_PAYLOAD_BYTES - 2))); // with its quotes: exactly 1 MiB
    assert.equal((atCap.payload as string).length, MIB - 2);
    const [stored] = await db.query<{ n: number }>('SELECT octet_length(payload::text)::int AS n FROM {{schema}}.tasks WHERE id = $1', [atCap.id]);
    assert.equal(stored?.n, MIB);
    const small = new Client({ pool, schema: db.schema, maxPayloadBytes: 100 });
    assert.equal(((await small.enqueue(new Task('cap', 'x'.repeat(98)))).payload as string).length, 98);
    assert.equal(((await small.enqueue(new Task('cap', new Uint8Array(100)))).payload as Buffer).length, 100);
    // A Client with a larger cap takes what the default refuses.
    const big = new Client({ pool, schema: db.schema, maxPayloadBytes: 2 * MIB });
    assert.equal(((await big.enqueue(new Task('cap', 'x'.repeat(MIB)))).payload as string).length, MIB);
  });

  test('the Inspector applies its maxPayloadBytes to updateTaskPayload, before any SQL', async () => {
    const info = await client.enqueue(new Task('upd', { a: 1 }), { processIn: 3_600_000 });
    const small = new Inspector({ pool, schema: db.schema, maxPayloadBytes: 10 });
    const sentBefore = pool.sent;
    await assert.rejects(
      small.updateTaskPayload(info.queue, info.id, 'x'.repeat(20)),
      (err: unknown) =>
        err instanceof lib.PayloadTooLargeError && /^payload is 22 bytes as JSON; the limit is 10 \(option maxPayloadBytes\)$/.test(err.message),
    );
    assert.equal(pool.sent, sentBefore);
    await small.updateTaskPayload(info.queue, info.id, 'x'.repeat(8));
    assert.equal((await inspector.getTaskInfo(info.queue, info.id)).payload, 'x'.repeat(8));
  });

  test('timeout: 0 is accepted and means "not set" (EnqueueOptions.timeout), the 30 min default', async () => {
    const info = await client.enqueue(new Task('t0'), { timeout: 0 });
    assert.equal(info.timeout, 30 * 60_000);
  });

  test('maxRetry: 0 runs once, then archives', { timeout: 30_000 }, async () => {
    const { client: c } = await runtimeServer();
    const info: TaskInfo = await c.enqueue(new Task('throw:string'), { maxRetry: 0 });
    const r = await waitFor(async () => {
      const row = await taskRow(info.id);
      return row?.state === 'archived' ? row : undefined;
    });
    assert.equal(r.retried, 0);
    assert.equal(r.error_msg, 'non-Error thrown: "boom"');
  });

  test('a 7,999-byte garbage NOTIFY on our channel is only a hint (SEC6 floods it)', { timeout: 30_000 }, async () => {
    await runtimeServer();
    const garbage = Array.from({ length: 7999 }, (_, i) => String.fromCharCode(33 + ((i * 7919) % 90))).join('');
    await db.pool.query('SELECT pg_notify($1, $2)', [`${db.schema}_tasks`, garbage]);
    await db.pool.query('SELECT pg_notify($1, $2)', [`${db.schema}_tasks`, '']);
    await stillWorking();
  });
});
