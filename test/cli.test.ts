/**
 * The `pgasynq` CLI, run as a child process exactly as users run it:
 * output, --json, exit codes, and what it does to the database.
 */
import assert from 'node:assert/strict';
import { after, before, describe } from 'node:test';
import pg from 'pg';
import { humanLine } from '../src/cli/log.js';
import { run } from '../src/cli/program.js';
import { Client, Task } from '../src/index.js';
import { DATABASE_URL, dsnWith, MIGRATIONS as ALL, runCli, testWithin } from './helpers.js';

/** 0005 (workflows) adds a table that holds tasks' edges: its rollback is refused while it has rows; none after it drops such a table. */
const WORKFLOWS = ALL.indexOf('0005_workflows');
const AFTER_WORKFLOWS = ALL.slice(WORKFLOWS + 1);

/** The CLI runs as a process per command, several per test: more than a minute under a loaded machine. */
const test = testWithin(180_000);

const SCHEMA = 't_cli';
const ENV_SCHEMA = 't_cli_env';
const RACE_SCHEMA = 't_cli_race';
const UNREACHABLE = 'postgres://u:secret@127.0.0.1:1/x';
const pendingStatus = ALL.map((name) => ({ name, applied: false, appliedAt: null }));

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the CLI; DATABASE_URL is unset in the child unless `env` sets it. */
function cli(args: string[], env: Record<string, string> = {}): Promise<Run> {
  return runCli(args, env);
}

/** `pgasynq --database-url <test db> --schema <schema> ...args` */
const inSchema = (schema: string, ...args: string[]) => cli(['--database-url', DATABASE_URL, '--schema', schema, ...args]);

function json<T = unknown>(r: Run): T {
  assert.equal(r.code, 0, `exit ${r.code}; stderr: ${r.stderr}`);
  return JSON.parse(r.stdout) as T;
}

function ok(r: Run): string {
  assert.equal(r.code, 0, `exit ${r.code}; stderr: ${r.stderr}`);
  assert.equal(r.stderr, '');
  return r.stdout;
}

/** A usage error: exit 2, a message on stderr, nothing on stdout. */
function usage(r: Run, message: RegExp): void {
  assert.equal(r.code, 2, `exit ${r.code}; stderr: ${r.stderr}`);
  assert.equal(r.stdout, '');
  assert.match(r.stderr, /^error: /);
  assert.match(r.stderr, message);
}

let pool: pg.Pool;

async function recorded(schema: string): Promise<string[]> {
  const rows = (await pool.query<{ name: string }>(`SELECT name FROM "${schema}".migrations ORDER BY name`)).rows;
  return rows.map((r) => r.name);
}

async function schemaExists(name: string): Promise<boolean> {
  return (await pool.query('SELECT 1 FROM pg_namespace WHERE nspname = $1', [name])).rowCount === 1;
}

before(async () => {
  pool = new pg.Pool({ connectionString: DATABASE_URL, max: 2 });
  for (const s of [SCHEMA, ENV_SCHEMA, RACE_SCHEMA]) await pool.query(`DROP SCHEMA IF EXISTS "${s}" CASCADE`);
});

after(async () => {
  await pool.end();
});

describe('pgasynq migrate', () => {
  test('status before any migration: every migration pending', async () => {
    const status = json<{ name: string; applied: boolean; appliedAt: string | null }[]>(await inSchema(SCHEMA, '--json', 'migrate', 'status'));
    assert.deepEqual(status, pendingStatus);
    const text = ok(await inSchema(SCHEMA, 'migrate', 'status'));
    assert.match(text, /^name\s+applied\s+applied at$/m);
    assert.match(text, /^0001_initial\s+no\s+-$/m);
    assert.equal(await schemaExists(SCHEMA), false, 'status must not create the schema');
  });

  test('up applies every migration, then is a no-op', async () => {
    assert.equal(ok(await inSchema(SCHEMA, 'migrate', 'up')), ALL.map((n) => `applied ${n}\n`).join(''));
    assert.deepEqual(await recorded(SCHEMA), ALL);
    assert.equal(ok(await inSchema(SCHEMA, 'migrate', 'up')), 'up to date\n');
    assert.equal(ok(await inSchema(SCHEMA, 'migrate')), 'up to date\n', 'up is the default action');
    assert.deepEqual(json(await inSchema(SCHEMA, '--json', 'migrate')), { applied: [] });
    assert.deepEqual(await recorded(SCHEMA), ALL);
  });

  test('status after up', async () => {
    const started = Date.now();
    const status = json<{ name: string; applied: boolean; appliedAt: string | null }[]>(await inSchema(SCHEMA, '--json', 'migrate', 'status'));
    assert.deepEqual(
      status.map((m) => [m.name, m.applied]),
      ALL.map((n) => [n, true]),
    );
    const at = Date.parse(status[0]?.appliedAt ?? '');
    assert.ok(Number.isFinite(at) && at <= started && at > started - 10 * 60_000, `appliedAt ${status[0]?.appliedAt}`);
    const text = ok(await inSchema(SCHEMA, 'migrate', 'status'));
    assert.match(text, /^0001_initial\s+yes\s+\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/m);
  });

  test('down rolls back one, then nothing; up applies it again', async () => {
    for (const name of [...ALL].reverse()) assert.equal(ok(await inSchema(SCHEMA, 'migrate', 'down')), `reverted ${name}\n`);
    assert.deepEqual(await recorded(SCHEMA), []);
    assert.deepEqual(json(await inSchema(SCHEMA, '--json', 'migrate', 'status')), pendingStatus);
    assert.equal(ok(await inSchema(SCHEMA, 'migrate', 'down')), 'nothing to roll back\n');
    assert.deepEqual(json(await inSchema(SCHEMA, '--json', 'migrate', 'down')), { reverted: null });

    assert.deepEqual(json(await inSchema(SCHEMA, '--json', 'migrate', 'up')), { applied: ALL });
    assert.deepEqual(await recorded(SCHEMA), ALL);
    assert.deepEqual(json(await inSchema(SCHEMA, '--json', 'migrate', 'down')), { reverted: ALL.at(-1) });
    assert.equal(ok(await inSchema(SCHEMA, 'migrate', 'up')), `applied ${ALL.at(-1)}\n`);
    const tasks = await pool.query(`SELECT to_regclass('"${SCHEMA}".tasks')::text AS t`);
    assert.notEqual(tasks.rows[0].t, null, 'the tables are back after up');
  });

  test('down refuses to drop tables that hold tasks unless --force', async () => {
    const schema = 't_cli_down';
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    json(await inSchema(schema, '--json', 'migrate', 'up'));
    // Rolling back storage v2 (it copies every task back), the views and the index drops no data: no question asked.
    for (const name of ALL.slice(1).reverse()) assert.equal(ok(await inSchema(schema, 'migrate', 'down')), `reverted ${name}\n`);
    await pool.query(`INSERT INTO "${schema}".queues (name) VALUES ('default')`);
    await pool.query(
      `INSERT INTO "${schema}".tasks (id, queue, type, state, run_at) VALUES ('a', 'default', 't', 'pending', now()), ('b', 'default', 't', 'pending', now())`,
    );
    const refused = await inSchema(schema, 'migrate', 'down');
    assert.equal(refused.code, 1, refused.stderr);
    assert.equal(refused.stdout, '');
    assert.match(refused.stderr, /would drop tasks \(2 rows\), queues \(1 row\): pass --force/);
    assert.deepEqual(await recorded(schema), ['0001_initial'], 'nothing rolled back');
    assert.equal((await pool.query(`SELECT count(*)::int AS n FROM "${schema}".tasks`)).rows[0].n, 2, 'the tasks are still there');
    assert.deepEqual(json(await inSchema(schema, '--json', 'migrate', 'down', '--force')), { reverted: '0001_initial' });
    assert.equal((await pool.query(`SELECT to_regclass('"${schema}".tasks')::text AS t`)).rows[0].t, null);
    await pool.query(`DROP SCHEMA "${schema}" CASCADE`);
  });

  test('down from 0005 refuses to drop task dependencies unless --force; without any it reverts cleanly', async () => {
    const schema = 't_cli_down_wf';
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    json(await inSchema(schema, '--json', 'migrate', 'up'));
    const enqueue = async (tasks: Task[]) => {
      const client = new Client({ connectionString: DATABASE_URL, schema });
      try {
        return await client.enqueueMany(tasks);
      } finally {
        await client.close();
      }
    };
    const states = async () =>
      (await pool.query<{ id: string; state: string }>(`SELECT id, state FROM "${schema}".tasks ORDER BY id`)).rows.map((r) => `${r.id}:${r.state}`);
    await enqueue([new Task('t', null, { taskId: 'first' })]);
    const waiting = await enqueue(['second', 'third'].map((id) => new Task('t', null, { taskId: id, dependsOn: ['first'] })));
    assert.deepEqual(
      waiting.map((t) => t.state),
      ['waiting', 'waiting'],
    );

    // Every migration after 0005 drops no table holding tasks: each rolled back without a question.
    for (const name of AFTER_WORKFLOWS.toReversed()) assert.equal(ok(await inSchema(schema, 'migrate', 'down')), `reverted ${name}\n`);
    const refused = await inSchema(schema, 'migrate', 'down');
    assert.equal(refused.code, 1, refused.stderr);
    assert.equal(refused.stdout, '');
    assert.match(refused.stderr, /^error: rolling back 0005_workflows would drop task_dependencies \(2 rows\): pass --force/);
    assert.deepEqual(await recorded(schema), ALL.slice(0, WORKFLOWS + 1), 'nothing rolled back');
    assert.deepEqual(await states(), ['first:pending', 'second:waiting', 'third:waiting']);

    // The dependents deleted, their edges go with them: nothing to refuse, and the other tasks stay.
    await pool.query(`DELETE FROM "${schema}".tasks WHERE id IN ('second', 'third')`);
    assert.equal((await pool.query(`SELECT count(*)::int AS n FROM "${schema}".task_dependencies`)).rows[0].n, 0);
    assert.equal(ok(await inSchema(schema, 'migrate', 'down')), 'reverted 0005_workflows\n');
    assert.deepEqual(await recorded(schema), ALL.slice(0, WORKFLOWS));
    assert.equal((await pool.query(`SELECT to_regclass('"${schema}".task_dependencies')::text AS t`)).rows[0].t, null);
    const columns = await pool.query(
      `SELECT attname FROM pg_attribute WHERE attrelid = '"${schema}".task_states'::regclass AND attname IN ('waiting_for', 'has_dependents') AND NOT attisdropped`,
    );
    assert.equal(columns.rowCount, 0, 'the columns of 0005 are gone');
    assert.deepEqual(await states(), ['first:pending']);
    assert.equal(
      ok(await inSchema(schema, 'migrate', 'up')),
      ALL.slice(WORKFLOWS)
        .map(
          (name) => `applied ${name}
`,
        )
        .join(''),
    );

    // --force drops the edges; a task still waiting becomes pending.
    await enqueue([new Task('t', null, { taskId: 'fourth', dependsOn: ['first'] })]);
    for (const name of AFTER_WORKFLOWS.toReversed()) assert.deepEqual(json(await inSchema(schema, '--json', 'migrate', 'down')), { reverted: name });
    assert.deepEqual(json(await inSchema(schema, '--json', 'migrate', 'down', '--force')), { reverted: '0005_workflows' });
    assert.deepEqual(await states(), ['first:pending', 'fourth:pending']);
    await pool.query(`DROP SCHEMA "${schema}" CASCADE`);
  });

  test('DATABASE_URL from the environment when no --database-url', async () => {
    const r = await cli(['--schema', ENV_SCHEMA, '--json', 'migrate'], { DATABASE_URL });
    assert.deepEqual(json(r), { applied: ALL });
    assert.deepEqual(await recorded(ENV_SCHEMA), ALL);
  });

  test('--database-url wins over DATABASE_URL', async () => {
    const r = await cli(['--database-url', DATABASE_URL, '--schema', ENV_SCHEMA, 'migrate', 'status'], { DATABASE_URL: UNREACHABLE });
    assert.match(ok(r), /^0001_initial\s+yes\s/m);
  });

  test('two migrate up processes at once on a fresh schema: both exit 0, applied once', async () => {
    const [a, b] = await Promise.all([inSchema(RACE_SCHEMA, '--json', 'migrate', 'up'), inSchema(RACE_SCHEMA, '--json', 'migrate', 'up')]);
    const applied = [...json<{ applied: string[] }>(a).applied, ...json<{ applied: string[] }>(b).applied];
    assert.deepEqual(applied.sort(), ALL, 'each migration applied by exactly one of the two');
    assert.deepEqual(await recorded(RACE_SCHEMA), ALL);
  });
});

// Independent of each other and of the schemas above: run concurrently.
describe('exit codes', { concurrency: true }, () => {
  test('--help exits 0 and lists migrate', async () => {
    const out = ok(await cli(['--help']));
    assert.match(out, /Usage: pgasynq/);
    assert.match(out, /--database-url/);
    assert.match(out, /migrate/);
    assert.match(ok(await cli(['migrate', '--help'])), /up.*down.*status/s);
  });

  test('unknown command: 2', async () => {
    usage(await cli(['bogus'], { DATABASE_URL }), /unknown command 'bogus'/);
  });

  test('unknown option: 2', async () => {
    usage(await cli(['--bogus', 'migrate'], { DATABASE_URL }), /unknown option '--bogus'/);
    usage(await cli(['migrate', '--bogus'], { DATABASE_URL }), /unknown option '--bogus'/);
  });

  test('bad argument (migrate sideways): 2', async () => {
    usage(await cli(['migrate', 'sideways'], { DATABASE_URL }), /'sideways'.*up, down, status/);
    usage(await cli(['migrate', 'up', 'extra'], { DATABASE_URL }), /too many arguments/);
  });

  test('no command: 2', async () => {
    const r = await cli([], { DATABASE_URL });
    assert.equal(r.code, 2);
    assert.equal(r.stdout, '');
    assert.match(r.stderr, /Usage: pgasynq/);
  });

  test('no database URL: 2 with a clear message', async () => {
    usage(await cli(['migrate']), /--database-url.*DATABASE_URL/);
  });

  test('bad --schema: 2, and no schema is created', async () => {
    const cases = [
      ['a;b', 'up'],
      ['a;b', 'down'],
      ['a;b', 'status'],
      ['x"; DROP SCHEMA t_cli CASCADE; --', 'up'],
    ] as const;
    const runs = await Promise.all(cases.map(([bad, action]) => inSchema(bad, 'migrate', action)));
    for (const r of runs) usage(r, /schema must/);
    for (const [bad] of cases) assert.equal(await schemaExists(bad), false, `schema ${JSON.stringify(bad)} must not exist`);
    assert.deepEqual(await recorded(SCHEMA), ALL);
  });

  test('unreachable database: 1, one line on stderr, no password', async () => {
    const argvs = [['migrate'], ['migrate', 'status'], ['migrate', 'down'], ['--json', 'migrate']];
    const runs = await Promise.all(argvs.map((args) => cli(['--database-url', UNREACHABLE, ...args])));
    for (const [i, r] of runs.entries()) {
      const args = argvs[i] ?? [];
      assert.equal(r.code, 1, `${args.join(' ')}: exit ${r.code}; stderr: ${r.stderr}`);
      assert.equal(r.stdout, '');
      assert.match(r.stderr, /^error: [^\n]+\n$/, `one line: ${JSON.stringify(r.stderr)}`);
      assert.match(r.stderr, /ECONNREFUSED/);
      assert.doesNotMatch(r.stderr, /secret/);
      assert.doesNotMatch(r.stderr, /\bat .*\.ts:\d+/, 'no stack without --debug');
    }
    const env = await cli(['migrate'], { DATABASE_URL: UNREACHABLE });
    assert.equal(env.code, 1);
    assert.doesNotMatch(env.stderr, /secret/);
  });

  test('a database that cannot be used (unknown database, unknown role): 1 within 10 s, one line naming the cause', async () => {
    const noDb = dsnWith({ database: 'no_such_db_cli' });
    const noRole = dsnWith({ user: 'no_such_role_cli' });
    const cases: [string[], RegExp][] = [
      [
        ['--database-url', noDb, 'stats'],
        /^error: database "no_such_db_cli" does not exist \(server [^)]+\/no_such_db_cli\): create it, or correct the database name in the connection string\n$/,
      ],
      [['--database-url', noDb, 'migrate'], /^error: database "no_such_db_cli" does not exist/],
      [['--database-url', noDb, 'server', 'ls'], /^error: database "no_such_db_cli" does not exist/],
      [['--database-url', noRole, 'stats'], /^error: .*"no_such_role_cli".*: check the user and password of the connection string\n$/],
    ];
    // Timed in this process: child processes started side by side on a loaded machine take long to boot.
    for (const [args] of cases) {
      const err: string[] = [];
      const started = performance.now();
      const code = await run(args, { out: { write: () => true }, err: { write: (t: string) => err.push(t) }, env: {} });
      const ms = performance.now() - started;
      assert.equal(code, 1, err.join(''));
      assert.ok(ms < 10_000, `${args.join(' ')} took ${Math.round(ms)} ms`);
    }
    const runs = await Promise.all(cases.map(([args]) => cli(args)));
    for (const [i, r] of runs.entries()) {
      const [args, message] = cases[i]!;
      assert.equal(r.code, 1, `${args.join(' ')}: exit ${r.code}; stderr: ${r.stderr}`);
      assert.equal(r.stdout, '');
      assert.match(r.stderr, message);
    }
  });

  test('--debug prints the stack, still without the password', async () => {
    const r = await cli(['--debug', '--database-url', UNREACHABLE, 'migrate']);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /^error: /);
    assert.match(r.stderr, /\n\s+at /, 'a stack trace');
    assert.doesNotMatch(r.stderr, /secret/);
  });
});

describe('log lines in the CLI', () => {
  test('are human lines: time, level, component, message, fields; errors as their message', () => {
    const line = JSON.stringify({
      level: 40,
      time: new Date(2026, 0, 2, 3, 4, 5, 6).getTime(),
      pid: 1,
      hostname: 'h',
      name: 'pgasynq',
      component: 'server',
      queue: 'emails',
      pending: 2,
      servedQueues: ['default', 'email'],
      task: { id: 't1', type: 'email:send' },
      err: { type: 'Error', message: 'smtp down', stack: 'Error: smtp down\n    at x' },
      note: 'two words',
      msg: 'queue has pending tasks but no running server serves it',
    });
    assert.equal(
      humanLine(line),
      '03:04:05.006 WARN  server: queue has pending tasks but no running server serves it queue=emails pending=2 servedQueues=["default","email"] task.id=t1 task.type=email:send err="smtp down" note="two words"\n',
    );
    assert.equal(humanLine('not json'), 'not json\n');
  });
});
