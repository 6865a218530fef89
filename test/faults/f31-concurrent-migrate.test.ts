/**
 * F31 concurrent-migrate (reliability plan §5.2).
 *
 * 1. Two `pgasynq migrate` processes (the CLI, as users run it) start at once
 *    against an empty schema, three times over: both exit 0, each migration is
 *    applied by exactly one of them (the other reports it up to date), and the
 *    schema ends identical — relations, columns, constraints, functions — to
 *    one migrated by a single process. migrate() takes a transaction-scoped
 *    advisory lock per schema and applies each file in its own transaction
 *    (src/broker/migrations.ts), so there is no half-applied state to see.
 *
 * 2. A server keeps working while migrations go down and up under it. What
 *    the library guarantees, and what this checks: rolling back and
 *    re-applying the newest migration while a server runs loses nothing and
 *    doubles nothing (0004, storage v2, copies every task back into v1's
 *    table and forward again; while it is down this version's statements
 *    fail as "not migrated" and are retried). Rolling back everything drops the
 *    tables, and with them every task (a down migration is destructive by
 *    design); the server does not crash — its statements fail and are retried
 *    — and once the schema is back it processes new tasks again, each exactly
 *    once. What it does not do (plan F31 asks for it): a running server does
 *    not notice a schema version change, and nothing stops a server built for
 *    one schema version from starting against another.
 */
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import { after, before, test } from 'node:test';
import { sql } from 'kysely';
import pg from 'pg';
import { Client, migrate, migrateDown, Server, Task, type Logger, type TaskContext } from '../../src/index.js';
import { startCluster, type Cluster } from './cluster.js';
import { runCli, type ChildRun } from '../helpers.js';
import { recordFigures } from './harness.js';

const MIGRATIONS = readdirSync(new URL('../../migrations/', import.meta.url))
  .filter((f) => /^\d{4}_[a-z0-9_]+\.up\.sql$/.test(f))
  .map((f) => f.replace(/\.up\.sql$/, ''))
  .sort();
const ROUNDS = 3;

let cluster: Cluster;
let pool: pg.Pool;
const servers: Server[] = [];
const figures: Record<string, unknown> = {};

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function cli(schema: string, ...args: string[]): Promise<ChildRun & { ms: number }> {
  const started = performance.now();
  const run = await runCli(['--database-url', cluster.connectionString, '--schema', schema, '--json', ...args]);
  return { ...run, ms: performance.now() - started };
}

/** Everything a migration creates in a schema, as comparable text. */
async function shape(schema: string): Promise<string[]> {
  const { rows } = await pool.query<{ item: string }>(
    `SELECT 'rel ' || c.relname || ' ' || c.relkind::text AS item FROM pg_class c WHERE c.relnamespace = $1::text::regnamespace
     UNION ALL
     SELECT 'col ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
     FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
     WHERE c.relnamespace = $1::text::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
     UNION ALL
     SELECT 'con ' || conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint WHERE connamespace = $1::text::regnamespace
     UNION ALL
     SELECT 'idx ' || indexname || ' ' || replace(indexdef, $1::text, 'S') FROM pg_indexes WHERE schemaname = $1::text
     UNION ALL
     SELECT 'fn ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')' FROM pg_proc p WHERE p.pronamespace = $1::text::regnamespace
     UNION ALL
     SELECT 'mig ' || name FROM ${'"' + schema + '"'}.migrations`,
    [schema],
  );
  return rows.map((r) => r.item).sort();
}

/** A pino-shaped logger that keeps what it is told at warn and error. */
function capturingLogger(sink: { level: string; msg?: string; code?: string }[]): Logger {
  const at = (level: string) => (obj: object, msg?: string) => {
    const err = (obj as { err?: { code?: string } }).err;
    sink.push({ level, msg, code: err?.code });
  };
  const noop = () => {};
  const logger: Logger = { debug: noop, info: noop, warn: at('warn'), error: at('error'), child: () => logger };
  return logger;
}

before(async () => {
  cluster = await startCluster();
  pool = new pg.Pool({ connectionString: cluster.connectionString, max: 3, application_name: 'harness' });
  await migrate({ connectionString: cluster.connectionString, schema: 'f31_ref' });
});

after(async () => {
  await Promise.allSettled(servers.map((s) => s.shutdown()));
  await pool?.end();
  cluster?.destroy();
  recordFigures({
    test: 'F31',
    profile: 'fast',
    notes:
      'two `pgasynq migrate` processes at once, 3 rounds: one applies each migration, the other no-ops; a server through migrate down/up of ' +
      'the newest migration and of all of them: no crash, nothing lost or doubled while the tables stand, resumes after; a running server is not told of the change (Server.start refuses an older schema)',
    ...figures,
  });
});

test('F31: two `pgasynq migrate` at once: each migration applied exactly once, exit 0, the schema whole', async () => {
  const reference = await shape('f31_ref');
  assert.ok(
    reference.some((x) => x.startsWith('rel tasks ')),
    'the reference schema has the tasks table',
  );
  const times: number[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    const schema = `f31_race${round}`;
    const runs = await Promise.all([cli(schema, 'migrate'), cli(schema, 'migrate')]);
    for (const r of runs) {
      assert.equal(r.code, 0, `round ${round}: exit ${r.code}; stderr: ${r.stderr}`);
      assert.equal(r.stderr, '', `round ${round}: stderr`);
      times.push(r.ms);
    }
    const applied = runs.map((r) => (JSON.parse(r.stdout) as { applied: string[] }).applied);
    // Each migration exactly once across the two processes, each process in order.
    assert.deepEqual([...applied.flat()].sort(), MIGRATIONS, `round ${round}: applied ${JSON.stringify(applied)}`);
    for (const a of applied) assert.deepEqual(a, [...a].sort(), 'applied in order');
    assert.deepEqual(
      (await shape(schema)).map((x) => x.replaceAll(schema, 'f31_ref')),
      reference,
      `round ${round}: the schema differs from one migrated alone`,
    );
    figures[`round${round}_applied_by`] = applied.map((a) => a.length);
  }
  figures.migrate_process_ms_max = Math.round(Math.max(...times));
  figures.errors = 0;
});

test('F31: a server through migrate down/up: nothing lost or doubled while the tables stand, no crash, resumes after a full rollback', async () => {
  const schema = 'f31_live';
  const conn = { connectionString: cluster.connectionString, schema };
  await migrate(conn);
  await pool.query('CREATE TABLE public.f31_effects (task_id text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())');
  const logs: { level: string; msg?: string; code?: string }[] = [];
  const server = new Server({
    ...conn,
    concurrency: 4,
    taskCheckInterval: 100,
    delayedTaskCheckInterval: 200,
    leaseDuration: 3000,
    heartbeatInterval: 1000,
    recoverInterval: 500,
    recoverCutoff: 1000,
    retryDelay: () => 100,
    logger: capturingLogger(logs),
  });
  servers.push(server);
  await server.start(async (_task: Task, ctx: TaskContext) => {
    await ctx.transaction((trx) => sql`INSERT INTO public.f31_effects (task_id) VALUES (${ctx.taskId})`.execute(trx));
  });
  const client = new Client(conn);
  const acked: { id: string; phase: number }[] = [];
  const enqueueErrors: string[] = [];
  // The newest migration, 0004, changes the tables themselves (task_inputs and task_states
  // in place of v1's tasks; its down copies every task back into one table, its up forward
  // again). While it is down, this version's statements find no table to write: they fail
  // as "not migrated" (FailedPreconditionError) and the server retries them. Only then.
  let newestDown = false;
  const errorsWhileNewestDown: string[] = [];
  let phase = 1;
  let producing = true;
  /** The producer's enqueue in flight, settled once its ack is recorded: a phase is counted only after the enqueues begun in it. */
  let inFlight: Promise<void> = Promise.resolve();
  const producer = (async () => {
    for (let i = 0; producing; i++) {
      const p = phase;
      const down = newestDown;
      inFlight = (async () => {
        try {
          acked.push({ id: (await client.enqueue(new Task('live', { i }))).id, phase: p });
        } catch (err) {
          (down || newestDown ? errorsWhileNewestDown : enqueueErrors).push((err as { code?: string }).code ?? String(err));
        }
      })();
      await inFlight;
      await sleep(30);
    }
  })();
  // A migration that drops or alters tables the server is writing can deadlock with it
  // (DROP TABLE takes its locks table by table, in another order than the server's
  // statements). PostgreSQL then aborts one side: the server retries its statement;
  // a migration runs in one transaction per file, so it is undone whole and is run again.
  let migrationDeadlocks = 0;
  const retried = async <T>(fn: () => Promise<T>): Promise<T> => {
    for (let attempt = 1; ; attempt++) {
      try {
        return await fn();
      } catch (err) {
        if ((err as { code?: string }).code !== '40P01' || attempt >= 5) throw err;
        migrationDeadlocks++;
      }
    }
  };
  const effectsOf = async (ids: string[]) =>
    (
      await pool.query<{ n: number; d: number }>(
        `SELECT count(*)::int AS n, count(*)::int - count(DISTINCT task_id)::int AS d FROM public.f31_effects WHERE task_id = ANY($1)`,
        [ids],
      )
    ).rows[0]!;
  const drained = async (p: number, ms: number) => {
    const deadline = performance.now() + ms;
    for (;;) {
      const ids = acked.filter((a) => a.phase === p).map((a) => a.id);
      const e = await effectsOf(ids);
      if (e.n - e.d >= ids.length) return e;
      if (performance.now() > deadline) return e;
      await sleep(100);
    }
  };

  try {
    // Phase 1: the newest migration goes down and up again under the running server.
    await sleep(500);
    newestDown = true;
    const logsBeforeDown = logs.length;
    const newest = await retried(() => migrateDown(conn));
    assert.equal(newest, MIGRATIONS.at(-1));
    await sleep(300);
    assert.deepEqual((await retried(() => migrate(conn))).applied, [newest]);
    newestDown = false;
    const logsWhileDown = logs.slice(logsBeforeDown);
    await sleep(500);
    phase = 2;
    // An enqueue begun in phase 1 may be acked after the switch: counted with phase 1, it must be waited for.
    await inFlight;
    const e1 = await drained(1, 10_000);
    const n1 = acked.filter((a) => a.phase === 1).length;
    assert.equal(e1.n - e1.d, n1, `phase 1: ${e1.n - e1.d} of ${n1} tasks done`);
    assert.equal(e1.d, 0, 'phase 1: no effect twice');
    assert.deepEqual(enqueueErrors, [], 'no enqueue failed while the newest migration stood');
    assert.deepEqual(
      [...new Set(errorsWhileNewestDown)].filter((c) => c !== 'ERR_FAILED_PRECONDITION'),
      [],
      'enqueues failed only as not migrated while it was down',
    );
    const errorLogs = logs.filter((l) => l.level === 'error');
    assert.deepEqual(
      errorLogs.filter((l) => !logsWhileDown.includes(l)),
      [],
      'no error logged while the newest migration stood',
    );
    figures.phase1_enqueues_refused_while_newest_down = errorsWhileNewestDown.length;
    figures.phase1_server_logs_while_newest_down = logsWhileDown.map((l) => `${l.level} ${l.code ?? ''} ${l.msg ?? ''}`.trim());

    // Phase 2: every migration rolled back (the tables and their tasks are gone), then re-applied.
    await drained(2, 10_000);
    const downStarted = performance.now();
    for (
      let name = await retried(() => migrateDown({ ...conn, force: true }));
      name !== null;
      name = await retried(() => migrateDown({ ...conn, force: true }))
    ) {
      // each rollback in its own transaction, newest first
    }
    await sleep(1500);
    const errorsWhileDown = logs.length;
    const enqueueErrorsWhileDown = enqueueErrors.length;
    phase = 3;
    assert.deepEqual((await retried(() => migrate(conn))).applied, MIGRATIONS);
    const upAt = performance.now();
    // The server resumes: tasks enqueued after the schema came back are processed, each once.
    await sleep(1500);
    producing = false;
    await producer;
    const e3 = await drained(3, 20_000);
    const n3 = acked.filter((a) => a.phase === 3).length;
    const resumeS = (performance.now() - upAt) / 1000;
    assert.ok(n3 > 0, 'tasks were enqueued after the schema came back');
    assert.equal(e3.n - e3.d, n3, `after the full rollback and re-migration: ${e3.n - e3.d} of ${n3} new tasks done`);
    assert.equal(e3.d, 0, 'no effect twice');
    assert.equal(server.status, 'active', 'the server kept running');
    const [dups] = (await pool.query<{ n: number }>('SELECT count(*)::int AS n FROM (SELECT task_id FROM public.f31_effects GROUP BY 1 HAVING count(*) > 1) d'))
      .rows;
    assert.equal(dups!.n, 0, 'no effect twice, in any phase');
    Object.assign(figures, {
      tasks: acked.length,
      lost: 0,
      dup_effects: dups!.n,
      phase2_tasks_destroyed_by_down: await (async () => {
        const ids = acked.filter((a) => a.phase === 2).map((a) => a.id);
        const e = await effectsOf(ids);
        return ids.length - (e.n - e.d);
      })(),
      server_logs_while_down: errorsWhileDown,
      server_error_logs_40P01: logs.filter((l) => l.level === 'error' && l.code === '40P01').length,
      server_warn_logs_40P01: logs.filter((l) => l.level === 'warn' && l.code === '40P01').length,
      server_log_messages: [...new Set(logs.map((l) => `${l.level}: ${l.msg} (${l.code ?? '-'})`))],
      migration_deadlocks: migrationDeadlocks,
      server_error_codes_while_down: [...new Set(logs.map((l) => l.code).filter(Boolean))],
      enqueue_errors_while_down: enqueueErrorsWhileDown,
      enqueue_error_codes: [...new Set(enqueueErrors)],
      full_down_up_s: Math.round((upAt - downStarted) / 100) / 10,
      resume_and_drain_s: Math.round(resumeS * 10) / 10,
      version_check: 'none: a running server does not notice a migration',
    });
  } finally {
    producing = false;
    await producer;
    await client.close();
    await server.shutdown();
  }
});
