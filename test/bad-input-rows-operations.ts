/**
 * Rows 26–43 of the bad-input table (see bad-input-kit.ts): cron specs and
 * time zones, Server and DSN config, the CLI's usage errors, the Inspector's
 * list options, what handlers throw and retryDelay returns at runtime, and a
 * Client or Inspector used after close().
 */
import assert from 'node:assert/strict';
import { Client, Inspector, Scheduler, Task } from '../src/index.js';
import { BAD_DELAYS, cli, db, failOnce, inspector, pool, register, row, serverConfig, stillWorking, thrown, warnings, type Row } from './bad-input-kit.js';

export const OPERATIONS_ROWS: Row[] = [
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
    note: 'timed in security-limits.test.ts (SEC7)',
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
];
