/**
 * SEC1 (R24): the least-privilege roles of `pgasynq roles`, on a throwaway
 * cluster (roles are cluster-global). The SQL is printed by the CLI, as a
 * user would get it, applied before and after the owner migrates, and once
 * more (idempotent). Then each role does its job through the real library
 * and CLI, and every statement beyond it fails with SQLSTATE 42501.
 * Workflows (0005) last: a producer enqueues tasks that depend on stored
 * ones, a worker's Server finishes those (completed with and without
 * retention, archived) and the owner's triggers release or archive the
 * dependents; the monitor sees the edges without the results they carry.
 * Flow control (0007) and enqueue() in SQL (0008) after that: a producer
 * enqueues from a trigger of its own table, the admin alone sets a queue's
 * limits, and a worker's Server claims within them.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { sql } from 'kysely';
import pg from 'pg';
import { Client, DuplicateTaskError, Inspector, Scheduler, Server, Task, TaskIdConflictError, migrate, roleSetupSql, type Logger } from '../../src/index.js';
import { run } from '../../src/cli/program.js';
import { runCli, waitFor } from '../helpers.js';
import { startCluster, type Cluster } from './cluster.js';

const S = 'sec1';
const KINDS = ['owner', 'producer', 'worker', 'monitor', 'inspector', 'admin'] as const;
type Kind = (typeof KINDS)[number];

let cluster: Cluster;
let su: pg.Pool;
const pools = new Map<Kind, pg.Pool>();
const url = (kind: Kind) => `postgres://pgasynq_${kind}_login@127.0.0.1:${cluster.port}/postgres`;
const as = (kind: Kind, text: string, values?: unknown[]) => pools.get(kind)!.query(text.replaceAll('{{S}}', `"${S}"`), values);
const cli = (kind: Kind, ...args: string[]) => runCli(['--database-url', url(kind), '--schema', S, ...args]);

/**
 * The same CLI in this process (program.ts run(), what main.ts calls): child
 * processes cost seconds each on a loaded machine, so only `roles` and the
 * inspector's `stats`, the commands SEC1 names, run as children.
 */
async function cliHere(kind: Kind, ...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = '';
  let stderr = '';
  const code = await run(['--database-url', url(kind), '--schema', S, ...args], {
    out: { write: (s: string) => (stdout += s) },
    err: { write: (s: string) => (stderr += s) },
    env: {},
  });
  return { code, stdout, stderr };
}

/** Rejects with SQLSTATE 42501 (insufficient_privilege), and nothing else. */
async function refused(p: Promise<unknown>, what: string): Promise<void> {
  await assert.rejects(
    p,
    (err: { code?: string; message?: string }) => {
      assert.equal(err?.code, '42501', `${what}: expected SQLSTATE 42501, got ${err?.code}: ${err?.message}`);
      return true;
    },
    what,
  );
}

/** DDL and TRUNCATE: nobody but the owner. Tasks are two tables (task_inputs, task_states) and the view tasks. */
async function refusesDdl(kind: Kind): Promise<void> {
  for (const stmt of [
    'CREATE TABLE {{S}}.evil (a int)',
    'ALTER TABLE {{S}}.task_inputs ADD COLUMN evil int',
    'ALTER TABLE {{S}}.task_states ADD COLUMN evil int',
    'CREATE INDEX evil ON {{S}}.task_states (retried)',
    'DROP TABLE {{S}}.daily_stats',
    'DROP VIEW {{S}}.queue_stats',
    'DROP VIEW {{S}}.tasks',
    'DROP TRIGGER tasks_write ON {{S}}.tasks',
    // tasks_write() runs as the owner: replacing it would be writing as the owner.
    'CREATE OR REPLACE FUNCTION {{S}}.tasks_write() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$',
    'TRUNCATE {{S}}.task_inputs',
    'TRUNCATE {{S}}.task_states',
    'TRUNCATE {{S}}.queues CASCADE',
    'CREATE SCHEMA evil',
  ]) {
    await refused(as(kind, stmt), `${kind}: ${stmt}`);
  }
}

/** Records warnings and errors, so a background component's 42501 cannot go unseen. */
function captureLogger(lines: { msg: string | undefined; code: unknown; err: string }[]): Logger {
  const push = (obj: object, msg?: string) => {
    const err = (obj as { err?: { code?: unknown; message?: string } }).err;
    lines.push({ msg, code: err?.code, err: err?.message ?? '' });
  };
  const logger: Logger = { debug() {}, info() {}, warn: push, error: push, child: () => logger };
  return logger;
}

before(async () => {
  // As a user would: print the SQL with the CLI (it needs no database: while the
  // cluster starts), apply it as a superuser before the first migrate (roles and
  // schema only), migrate as the owner, apply it again.
  const [started, printed] = await Promise.all([startCluster(), runCli(['--schema', S, 'roles', '--logins'])]);
  cluster = started;
  su = new pg.Pool({ connectionString: cluster.connectionString, max: 2 });
  assert.equal(printed.code, 0, printed.stderr);
  assert.equal(printed.stdout, roleSetupSql({ schema: S, logins: true }));
  await su.query(printed.stdout);
  await migrate({ connectionString: `postgres://pgasynq_owner_login@127.0.0.1:${cluster.port}/postgres`, schema: S });
  // Before the rerun, what the migration created is nobody's: a SECURITY DEFINER
  // function callable by PUBLIC would run as the owner for anyone with USAGE.
  const callable = await su.query<{ role: string }>(
    `SELECT r.rolname AS role FROM pg_roles r
     WHERE r.rolname = ANY($2::text[]) AND has_function_privilege(r.oid, $1::text::regprocedure, 'EXECUTE')`,
    [`"${S}".settle_completed(bigint[], jsonb[], bytea[], text)`, KINDS.filter((k) => k !== 'owner').map((k) => `pgasynq_${k}`)],
  );
  assert.deepEqual(callable.rows, [], 'settle_completed() is callable between migrate and the rerun');
  await su.query(printed.stdout);
  await su.query(printed.stdout); // a rerun changes nothing and fails nothing
  for (const kind of KINDS) pools.set(kind, new pg.Pool({ connectionString: url(kind), max: 2 }));
});

after(async () => {
  await Promise.all([...pools.values()].map((p) => p.end().catch(() => {})));
  await su?.end().catch(() => {});
  cluster?.destroy();
});

describe('SEC1 roles', () => {
  test('the owner owns every object; a login without a pgasynq role cannot reach the schema', async () => {
    const { rows } = await su.query<{ name: string; owner: string }>(
      `SELECT relname::text AS name, relowner::regrole::text AS owner FROM pg_class WHERE relnamespace = $1::text::regnamespace
       UNION ALL SELECT proname::text, proowner::regrole::text FROM pg_proc WHERE pronamespace = $1::text::regnamespace
       UNION ALL SELECT nspname, nspowner::regrole::text FROM pg_namespace WHERE nspname = $1::text`,
      [S],
    );
    assert.ok(rows.length > 20);
    // The workflow triggers run as their owner: the owner role, also when migrated as someone else.
    for (const fn of ['settle_completed', 'settle_failed', 'task_states_finished', 'task_states_deleted', 'tasks_write', 'replace_tasks']) {
      assert.equal(rows.find((r) => r.name === fn)?.owner, 'pgasynq_owner', fn);
    }
    assert.deepEqual(
      rows.filter((r) => r.owner !== 'pgasynq_owner'),
      [],
    );
    // DDL is the owner's: what the next migration will do.
    await as('owner', 'CREATE TABLE {{S}}.scratch (a int); DROP TABLE {{S}}.scratch');

    await su.query('CREATE ROLE nobody LOGIN');
    const nobody = new pg.Client({ connectionString: `postgres://nobody@127.0.0.1:${cluster.port}/postgres` });
    await nobody.connect();
    try {
      await refused(nobody.query(`SELECT count(*) FROM "${S}".queues`), 'nobody: SELECT queues');
      await refused(nobody.query(`SELECT * FROM "${S}".queue_stats`), 'nobody: SELECT queue_stats');
    } finally {
      await nobody.end();
    }
  });

  test('producer: enqueue, enqueueMany, unique and scheduled tasks, in its own transaction; nothing more', async () => {
    const client = new Client({ connectionString: url('producer'), schema: S });
    try {
      const one = await client.enqueue(new Task('email:send', { to: 'a@example.com' }), { queue: 'sec1' });
      assert.equal(one.state, 'pending');
      const many = await client.enqueueMany([new Task('a', { n: 1 }), new Task('b', { n: 2 })], { queue: 'sec1' });
      assert.deepEqual(
        many.map((t) => t.type),
        ['a', 'b'],
      );
      await client.enqueue(new Task('u', { k: 1 }), { queue: 'sec1', unique: 60_000 });
      await assert.rejects(client.enqueue(new Task('u', { k: 1 }), { queue: 'sec1', unique: 60_000 }), DuplicateTaskError);
      const later = await client.enqueue(new Task('later', { x: 1 }), { queue: 'adm', processIn: 3_600_000, taskId: 'sched-1' });
      assert.equal(later.state, 'scheduled');
      // replace: through replace_tasks() (SECURITY DEFINER), with no UPDATE privilege of its own.
      const replaced = await client.enqueue(new Task('later', { x: 2 }), { queue: 'adm', processIn: 3_600_000, taskId: 'sched-1', replace: true });
      assert.deepEqual([replaced.state, replaced.payload], ['scheduled', { x: 2 }]);
      // A duplicate id names the task: PostgreSQL shows the key only to a role that may read its columns.
      await assert.rejects(client.enqueue(new Task('later', null), { queue: 'adm', taskId: 'sched-1' }), (err: unknown) => {
        assert.ok(err instanceof TaskIdConflictError, String(err));
        assert.deepEqual([err.queue, err.taskId], ['adm', 'sched-1']);
        return true;
      });
      // The caller's transaction (a pg client: the named prepared statement path).
      const c = await pools.get('producer')!.connect();
      try {
        await c.query('BEGIN');
        await client.enqueue(new Task('in-tx', null), { queue: 'sec1', tx: c });
        await c.query('COMMIT');
      } finally {
        c.release();
      }
    } finally {
      await client.close();
    }
    await refusesDdl('producer');
    await refused(as('producer', "UPDATE {{S}}.tasks SET state = 'archived' WHERE false"), 'producer: UPDATE tasks');
    await refused(as('producer', 'UPDATE {{S}}.tasks SET payload = NULL WHERE false'), 'producer: UPDATE payload');
    await refused(as('producer', 'DELETE FROM {{S}}.tasks WHERE false'), 'producer: DELETE tasks');
    await refused(
      as('producer', "INSERT INTO {{S}}.tasks (queue, id, type, state, lease_owner) VALUES ('q', 'x', 't', 'pending', 'me')"),
      'producer: INSERT a lease column',
    );
    // The tables the enqueue writes directly: inserts of its columns only.
    await refused(as('producer', "UPDATE {{S}}.task_states SET state = 'archived' WHERE false"), 'producer: UPDATE task_states');
    await refused(as('producer', 'UPDATE {{S}}.task_inputs SET payload = NULL WHERE false'), 'producer: UPDATE task_inputs');
    await refused(as('producer', 'DELETE FROM {{S}}.task_states WHERE false'), 'producer: DELETE task_states');
    await refused(as('producer', 'DELETE FROM {{S}}.task_inputs WHERE false'), 'producer: DELETE task_inputs');
    await refused(
      as('producer', "INSERT INTO {{S}}.task_states (seq, queue, state, lease_owner) VALUES (-1, 'q', 'pending', 'me')"),
      'producer: INSERT a lease column of task_states',
    );
    // It reads of task_states what an enqueue with dependsOn reads of its stored dependencies, no more.
    await refused(as('producer', 'SELECT * FROM {{S}}.task_states'), 'producer: SELECT * FROM task_states');
    await refused(as('producer', 'SELECT lease_token FROM {{S}}.task_states'), 'producer: SELECT task_states.lease_token');
    await refused(as('producer', 'UPDATE {{S}}.queues SET paused = true WHERE false'), 'producer: pause a queue');
    await refused(as('producer', 'DELETE FROM {{S}}.queues WHERE false'), 'producer: DELETE queues');
    await refused(as('producer', 'SELECT * FROM {{S}}.servers'), 'producer: SELECT servers');
  });

  test('worker: a Server (retries, ctx.transaction, writeResult, groups, recoverer, janitor) and a Scheduler; nothing more', async () => {
    const producer = new Client({ connectionString: url('producer'), schema: S });
    const seen = new Map<string, number>();
    const failedOnce = new Set<string>();
    const logs: { msg: string | undefined; code: unknown; err: string }[] = [];
    const server = new Server({
      connectionString: url('worker'),
      schema: S,
      queues: { work: 1 },
      concurrency: 4,
      taskCheckInterval: 100,
      delayedTaskCheckInterval: 100,
      retryDelay: () => 0,
      leaseDuration: 3000,
      heartbeatInterval: 300,
      recoverInterval: 200,
      recoverCutoff: 0,
      janitorInterval: 100,
      groupGracePeriod: 100,
      groupAggregator: (group, tasks) => new Task('agg', { group, n: tasks.length }),
      shutdownTimeout: 1000,
      logger: captureLogger(logs),
    });
    const scheduler = new Scheduler({ connectionString: url('worker'), schema: S, heartbeatInterval: 300 });
    try {
      await server.start(async (task, ctx) => {
        seen.set(task.type, (seen.get(task.type) ?? 0) + 1);
        if (task.type === 'flaky' && !failedOnce.has(ctx.taskId)) {
          failedOnce.add(ctx.taskId);
          throw new Error('first attempt fails');
        }
        if (task.type === 'tx') await ctx.transaction(async (trx) => sql`SELECT 1`.execute(trx));
        if (task.type === 'result') await ctx.writeResult({ done: true });
      });
      await producer.enqueueMany([new Task('ok', null), new Task('flaky', null), new Task('tx', null)], { queue: 'work' });
      await producer.enqueue(new Task('result', null), { queue: 'work', retention: 3_600_000, taskId: 'kept' });
      await producer.enqueue(new Task('short', null), { queue: 'work', retention: 1, taskId: 'short' });
      await producer.enqueueMany([new Task('member', { i: 1 }), new Task('member', { i: 2 })], { queue: 'work', group: 'g' });
      // A task whose worker died: an expired lease for the recoverer.
      await su.query(
        `INSERT INTO "${S}".tasks (queue, id, type, state, lease_owner, lease_token, lease_expires_at, started_at, max_retry)
         VALUES ('work', 'orphan', 'orphan', 'active', 'gone', gen_random_uuid(), now() - interval '1 minute', now() - interval '2 minutes', 3)`,
      );
      scheduler.register('@every 1s', new Task('cron', null), { queue: 'work' });
      await scheduler.start();

      await waitFor(
        () => ['ok', 'tx', 'result', 'short', 'agg', 'orphan', 'cron'].every((t) => seen.has(t)) && seen.get('flaky') === 2,
        20_000,
        `every task type processed (seen: ${JSON.stringify([...seen])})`,
      );
      // The janitor removed the short-retention task; the kept one has its result.
      await waitFor(async () => (await su.query(`SELECT 1 FROM "${S}".tasks WHERE id = 'short'`)).rowCount === 0, 5000, 'janitor');
      const kept = await su.query(`SELECT state, result FROM "${S}".tasks WHERE id = 'kept'`);
      assert.deepEqual(kept.rows[0], { state: 'completed', result: { done: true } });
    } finally {
      await scheduler.shutdown();
      await server.shutdown();
      await producer.close();
    }
    // Stats flushed at shutdown, the server row removed: both worker writes.
    const stats = await su.query(`SELECT processed FROM "${S}".daily_stats WHERE queue = 'work'`);
    assert.ok(Number(stats.rows[0]?.processed) >= 8);
    assert.equal((await su.query(`SELECT 1 FROM "${S}".servers`)).rowCount, 0);
    assert.deepEqual(
      logs.filter((l) => l.code === '42501' || /permission denied/.test(l.err)),
      [],
      'no component was refused',
    );

    await refusesDdl('worker');
    await refused(as('worker', "UPDATE {{S}}.tasks SET payload = '{}' WHERE false"), 'worker: UPDATE payload');
    await refused(as('worker', 'UPDATE {{S}}.tasks SET max_retry = 0 WHERE false'), 'worker: UPDATE max_retry');
    await refused(as('worker', "UPDATE {{S}}.task_inputs SET payload = '{}' WHERE false"), 'worker: UPDATE task_inputs payload');
    await refused(as('worker', 'UPDATE {{S}}.task_inputs SET max_retry = 0 WHERE false'), 'worker: UPDATE task_inputs max_retry');
    await refused(as('worker', "UPDATE {{S}}.task_states SET queue = 'x' WHERE false"), 'worker: UPDATE task_states queue');
    await refused(as('worker', "UPDATE {{S}}.task_states SET group_key = 'x' WHERE false"), 'worker: UPDATE task_states group_key');
    await refused(
      as('worker', "INSERT INTO {{S}}.task_states (seq, queue, state, lease_owner) VALUES (-1, 'q', 'pending', 'me')"),
      'worker: INSERT a lease column of task_states',
    );
    // Every write to a task is the owner's functions' (0010): none of the worker's own, and no row lock.
    await refused(as('worker', "UPDATE {{S}}.task_states SET state = 'archived' WHERE false"), 'worker: UPDATE task_states state');
    await refused(as('worker', 'DELETE FROM {{S}}.task_states WHERE false'), 'worker: DELETE task_states');
    await refused(as('worker', 'DELETE FROM {{S}}.task_inputs WHERE false'), 'worker: DELETE task_inputs');
    await refused(as('worker', 'DELETE FROM {{S}}.unique_locks WHERE false'), 'worker: DELETE unique_locks');
    await refused(as('worker', "UPDATE {{S}}.tasks SET state = 'archived' WHERE false"), 'worker: UPDATE tasks state');
    await refused(as('worker', 'DELETE FROM {{S}}.tasks WHERE false'), 'worker: DELETE tasks');
    await refused(as('worker', 'SELECT 1 FROM {{S}}.task_states FOR UPDATE SKIP LOCKED'), 'worker: lock task_states');
    await refused(as('worker', "SELECT nextval('{{S}}.task_seq')"), 'worker: nextval task_seq');
    await refused(as('worker', 'SELECT lease_token FROM {{S}}.task_states'), 'worker: SELECT task_states.lease_token');
    await refused(as('worker', 'DELETE FROM {{S}}.queue_starts WHERE false'), 'worker: DELETE queue_starts');
    await refused(as('worker', 'UPDATE {{S}}.queues SET paused = true WHERE false'), 'worker: pause a queue');
    await refused(as('worker', 'DELETE FROM {{S}}.queues WHERE false'), 'worker: DELETE queues');
    const inspector = new Inspector({ connectionString: url('worker'), schema: S });
    try {
      await refused(inspector.pauseQueue('work'), 'worker: Inspector.pauseQueue');
    } finally {
      await inspector.close();
    }
  });

  test('inspector: CLI stats, queue ls, task ls, task inspect and every Inspector read; no mutation', async () => {
    const pending = (await su.query<{ id: string }>(`SELECT id FROM "${S}".tasks WHERE queue = 'sec1' AND type = 'email:send'`)).rows[0]!.id;
    // The child runs while the in-process checks do.
    const child = cli('inspector', '--json', 'stats');
    const queues = await cliHere('inspector', '--json', 'queue', 'ls');
    const list = await cliHere('inspector', '--json', 'task', 'ls', '--queue', 'sec1', '--state', 'pending');
    const inspect = await cliHere('inspector', '--json', 'task', 'inspect', 'sec1', pending);
    const human = await cliHere('inspector', 'stats');
    const stats = await child;
    for (const r of [stats, queues, list, inspect, human]) assert.equal(r.code, 0, r.stderr);
    assert.match(human.stdout, /Tasks by state/);
    const infos = JSON.parse(stats.stdout) as { queue: string; pending: number }[];
    assert.deepEqual(infos.map((q) => q.queue).sort(), ['adm', 'sec1', 'work']);
    assert.equal(infos.find((q) => q.queue === 'sec1')?.pending, 5);
    assert.deepEqual((JSON.parse(queues.stdout) as string[]).sort(), ['adm', 'sec1', 'work']);
    assert.equal((JSON.parse(list.stdout) as unknown[]).length, 5);
    assert.deepEqual((JSON.parse(inspect.stdout) as { payload: unknown }).payload, { to: 'a@example.com' });

    const i = new Inspector({ connectionString: url('inspector'), schema: S });
    try {
      assert.equal((await i.getQueueInfo('work')).queue, 'work');
      assert.equal((await i.history('work', 2)).length, 2);
      assert.equal((await i.getTaskInfo('work', 'kept')).state, 'completed');
      assert.equal((await i.listCompletedTasks('work')).length, 1);
      assert.equal((await i.listScheduledTasks('adm')).length, 1);
      await i.listArchivedTasks('work');
      await i.listAggregatingTasks('work', 'g');
      await i.groups('work');
      await i.servers();
      await i.schedulerEntries();
      const events = await su.query<{ entry_id: string }>(`SELECT entry_id FROM "${S}".scheduler_events LIMIT 1`);
      assert.ok((await i.listSchedulerEnqueueEvents(events.rows[0]!.entry_id)).length >= 1);

      await refused(i.pauseQueue('sec1'), 'inspector: pauseQueue');
      await refused(i.deleteTask('sec1', pending), 'inspector: deleteTask');
      await refused(i.archiveTask('sec1', pending), 'inspector: archiveTask');
      await refused(i.runTask('adm', 'sched-1'), 'inspector: runTask');
      await refused(i.cancelProcessing(pending), 'inspector: cancelProcessing');
      await refused(i.deleteAllPendingTasks('sec1'), 'inspector: deleteAllPendingTasks');
      await refused(i.deleteQueue('adm', true), 'inspector: deleteQueue');
    } finally {
      await i.close();
    }
    await refusesDdl('inspector');
    await refused(as('inspector', "INSERT INTO {{S}}.queues (name) VALUES ('x')"), 'inspector: INSERT');
    await refused(as('inspector', 'DELETE FROM {{S}}.tasks WHERE false'), 'inspector: DELETE tasks');
    await refused(as('inspector', "UPDATE {{S}}.tasks SET state = 'pending' WHERE false"), 'inspector: UPDATE tasks');
    await refused(as('inspector', "INSERT INTO {{S}}.tasks (queue, id, type, state) VALUES ('q', 'x', 't', 'pending')"), 'inspector: INSERT tasks');
    await refused(as('inspector', 'DELETE FROM {{S}}.task_inputs WHERE false'), 'inspector: DELETE task_inputs');
    await refused(as('inspector', 'DELETE FROM {{S}}.task_states WHERE false'), 'inspector: DELETE task_states');
    await refused(as('inspector', "UPDATE {{S}}.task_states SET state = 'pending' WHERE false"), 'inspector: UPDATE task_states');
    await refused(as('inspector', 'UPDATE {{S}}.task_inputs SET payload = NULL WHERE false'), 'inspector: UPDATE task_inputs');
    await refused(as('inspector', "SELECT nextval('{{S}}.task_seq')"), 'inspector: nextval(task_seq)');
  });

  test('monitor: stats and counts without payloads; reading a payload is refused', async () => {
    const stats = await cliHere('monitor', '--json', 'stats');
    const list = await cliHere('monitor', 'task', 'ls', '--queue', 'sec1', '--state', 'pending');
    assert.equal(stats.code, 0, stats.stderr);
    assert.equal((JSON.parse(stats.stdout) as unknown[]).length, 3);
    assert.equal(list.code, 1, list.stdout);
    assert.match(list.stderr, /permission denied for view tasks/);

    const i = new Inspector({ connectionString: url('monitor'), schema: S });
    try {
      assert.deepEqual((await i.queues()).sort(), ['adm', 'sec1', 'work']);
      assert.equal((await i.getQueueInfo('sec1')).pending, 5);
      await i.history('work', 1);
      await i.groups('work');
      await refused(i.getTaskInfo('work', 'kept'), 'monitor: getTaskInfo');
      await refused(i.listPendingTasks('sec1'), 'monitor: listPendingTasks');
      await refused(i.servers(), 'monitor: servers (their tasks carry payloads)');
      await refused(i.pauseQueue('sec1'), 'monitor: pauseQueue');
    } finally {
      await i.close();
    }
    const counts = await as('monitor', "SELECT state, count(*)::int AS n FROM {{S}}.tasks WHERE queue = 'sec1' GROUP BY state");
    assert.deepEqual(counts.rows, [{ state: 'pending', n: 5 }]);
    await as('monitor', 'SELECT * FROM {{S}}.queue_stats');
    await as('monitor', 'SELECT * FROM {{S}}.active_tasks');
    const narrow = await as('monitor', "SELECT state, count(*)::int AS n FROM {{S}}.task_states WHERE queue = 'sec1' GROUP BY state");
    assert.deepEqual(narrow.rows, [{ state: 'pending', n: 5 }]);
    await as('monitor', 'SELECT seq, queue, id, type, max_retry, enqueued_at FROM {{S}}.task_inputs');
    for (const col of ['payload', 'payload_bytes', 'headers', 'result', 'result_bytes']) {
      await refused(as('monitor', `SELECT ${col} FROM {{S}}.tasks`), `monitor: SELECT ${col}`);
    }
    for (const col of ['payload', 'payload_bytes', 'headers']) {
      await refused(as('monitor', `SELECT ${col} FROM {{S}}.task_inputs`), `monitor: SELECT task_inputs.${col}`);
    }
    for (const col of ['result', 'result_bytes']) {
      await refused(as('monitor', `SELECT ${col} FROM {{S}}.task_states`), `monitor: SELECT task_states.${col}`);
    }
    await refused(as('monitor', 'SELECT * FROM {{S}}.tasks'), 'monitor: SELECT *');
    await refused(as('monitor', 'SELECT * FROM {{S}}.task_inputs'), 'monitor: SELECT * FROM task_inputs');
    await refused(as('monitor', 'SELECT * FROM {{S}}.task_states'), 'monitor: SELECT * FROM task_states');
    await refused(as('monitor', 'SELECT payload FROM {{S}}.scheduler_entries'), 'monitor: SELECT cron payload');
    await refusesDdl('monitor');
  });

  test('admin: every Inspector action; no DDL, no enqueue, no worker columns', async () => {
    const i = new Inspector({ connectionString: url('admin'), schema: S });
    try {
      await i.updateTaskPayload('adm', 'sched-1', { x: 2 });
      await i.runTask('adm', 'sched-1');
      await i.archiveTask('adm', 'sched-1');
      await i.runTask('adm', 'sched-1');
      await i.pauseQueue('adm');
      await i.unpauseQueue('adm');
      assert.equal(await i.cancelProcessing('none-active'), 0);
      assert.equal(await i.archiveAllPendingTasks('adm'), 1);
      assert.equal(await i.runAllArchivedTasks('adm'), 1);
      await i.deleteTask('adm', 'sched-1');
      assert.equal(await i.deleteAllCompletedTasks('work'), 1);
      const pending = await i.listPendingTasks('sec1');
      assert.equal(pending.length, 5);
      await i.archiveTask('sec1', pending[0]!.id);
      assert.equal(await i.deleteAllArchivedTasks('sec1'), 1);
      await i.deleteQueue('adm');
      assert.deepEqual((await i.queues()).sort(), ['sec1', 'work']);
    } finally {
      await i.close();
    }
    await refusesDdl('admin');
    await refused(as('admin', "INSERT INTO {{S}}.tasks (queue, id, type, state, run_at) VALUES ('q', 'x', 't', 'pending', now())"), 'admin: enqueue by INSERT');
    await refused(as('admin', 'UPDATE {{S}}.tasks SET retried = 0 WHERE false'), 'admin: UPDATE retried');
    // Its actions go through the view: nothing on the tables themselves.
    await refused(as('admin', "INSERT INTO {{S}}.task_inputs (seq, queue, id, type) VALUES (-1, 'q', 'x', 't')"), 'admin: INSERT task_inputs');
    await refused(
      as('admin', "INSERT INTO {{S}}.task_states (seq, queue, state, pending_seq, run_at) VALUES (-1, 'q', 'pending', -1, now())"),
      'admin: INSERT task_states',
    );
    await refused(as('admin', 'UPDATE {{S}}.task_states SET retried = 0 WHERE false'), 'admin: UPDATE task_states retried');
    await refused(as('admin', "UPDATE {{S}}.task_states SET state = 'pending' WHERE false"), 'admin: UPDATE task_states state');
    await refused(as('admin', 'UPDATE {{S}}.task_inputs SET payload = NULL WHERE false'), 'admin: UPDATE task_inputs payload');
    await refused(as('admin', 'DELETE FROM {{S}}.task_states WHERE false'), 'admin: DELETE task_states');
    await refused(as('admin', 'DELETE FROM {{S}}.task_inputs WHERE false'), 'admin: DELETE task_inputs');
    await refused(as('admin', "SELECT nextval('{{S}}.task_seq')"), 'admin: nextval(task_seq)');
    await refused(as('admin', 'UPDATE {{S}}.queues SET processed_total = 0 WHERE false'), 'admin: UPDATE totals');
    await refused(as('admin', 'DELETE FROM {{S}}.servers WHERE false'), 'admin: DELETE servers');
  });

  test('workflows: a producer enqueues dependents, a worker settles them, the monitor sees no results, the admin acts on waiting tasks', async () => {
    const producer = new Client({ connectionString: url('producer'), schema: S });
    const results = new Map<string, Record<string, unknown>>();
    const logs: { msg: string | undefined; code: unknown; err: string }[] = [];
    const server = new Server({
      connectionString: url('worker'),
      schema: S,
      queues: { wf: 1 },
      concurrency: 4,
      taskCheckInterval: 100,
      delayedTaskCheckInterval: 100,
      retryDelay: () => 0,
      janitorInterval: 100,
      shutdownTimeout: 1000,
      logger: captureLogger(logs),
    });
    try {
      // Stored dependencies, then their dependents in calls of their own: the
      // stored path (lock, mark, edges). 'dep' completes without retention (its
      // row is deleted), 'kept' with one (its state changes), 'doomed' is archived.
      await producer.enqueueMany(
        [
          new Task('dep', null, { taskId: 'dep' }),
          new Task('kept', null, { taskId: 'kept', retention: 3_600_000 }),
          new Task('doomed', null, { taskId: 'doomed', maxRetry: 0 }),
        ],
        { queue: 'wf' },
      );
      const after = await producer.enqueue(new Task('after', null, { taskId: 'after', dependsOn: ['dep', 'kept'] }), { queue: 'wf' });
      assert.deepEqual([after.state, after.waitingFor], ['waiting', 2]);
      const victim = await producer.enqueue(new Task('after', null, { taskId: 'victim', dependsOn: ['doomed'] }), { queue: 'wf' });
      assert.equal(victim.state, 'waiting');
      // Held back for the admin: a dependency in a queue no server serves, and a two-step graph in one call.
      await producer.enqueueMany(
        [new Task('blocker', null, { taskId: 'blocker' }), ...['w1', 'w2', 'w3'].map((id) => new Task('held', null, { taskId: id, dependsOn: ['blocker'] }))],
        { queue: 'wf-hold' },
      );

      await server.start(async (task, ctx) => {
        if (task.type === 'doomed') throw new Error('doomed');
        if (task.type === 'dep' || task.type === 'kept') await ctx.writeResult({ from: task.type });
        if (task.type === 'after') results.set(ctx.taskId, Object.fromEntries(await ctx.dependencyResults()));
      });
      await waitFor(() => results.has('after'), 20_000, 'the dependent released and run');
      assert.deepEqual(results.get('after'), { 'wf/dep': { from: 'dep' }, 'wf/kept': { from: 'kept' } });
      await waitFor(
        async () => (await su.query(`SELECT state FROM "${S}".tasks WHERE id = 'victim'`)).rows[0]?.state === 'archived',
        10_000,
        'the dependent of the archived task archived',
      );
      assert.equal(results.has('victim'), false);

      // A dependency completed already: the enqueue copies its result into the edge, and the task is pending at
      // once. The worker enqueues as the producer does (a handler's follow-up tasks).
      const late = await producer.enqueue(new Task('after', null, { taskId: 'late', dependsOn: ['kept'] }), { queue: 'wf' });
      assert.equal(late.state, 'pending');
      const asWorker = new Client({ connectionString: url('worker'), schema: S });
      try {
        const byWorker = await asWorker.enqueue(new Task('after', null, { taskId: 'by-worker', dependsOn: ['kept'] }), { queue: 'wf' });
        assert.equal(byWorker.state, 'pending');
      } finally {
        await asWorker.close();
      }
      await waitFor(() => results.has('late') && results.has('by-worker'), 10_000, 'the late dependents run');
      assert.deepEqual(results.get('late'), { 'wf/kept': { from: 'kept' } });
      assert.deepEqual(results.get('by-worker'), { 'wf/kept': { from: 'kept' } });
    } finally {
      await server.shutdown();
      await producer.close();
    }
    assert.deepEqual(
      logs.filter((l) => l.code === '42501' || /permission denied/.test(l.err)),
      [],
      'no component was refused',
    );

    // Nobody but the owner settles edges or calls the function that does.
    for (const kind of KINDS.filter((k) => k !== 'owner')) {
      await refused(as(kind, "SELECT {{S}}.settle_completed(ARRAY[1::bigint], ARRAY[NULL::jsonb], ARRAY[NULL::bytea], 'x')"), `${kind}: settle_completed()`);
      await refused(as(kind, "SELECT {{S}}.settle_failed(1, 'x')"), `${kind}: settle_failed()`);
      await refused(as(kind, "UPDATE {{S}}.task_dependencies SET outcome = 'completed' WHERE false"), `${kind}: UPDATE task_dependencies`);
      await refused(as(kind, 'DELETE FROM {{S}}.task_dependencies WHERE false'), `${kind}: DELETE task_dependencies`);
      await refused(as(kind, 'UPDATE {{S}}.task_states SET waiting_for = 0 WHERE false'), `${kind}: UPDATE task_states.waiting_for`);
    }
    await refused(as('producer', 'SELECT * FROM {{S}}.task_dependencies'), 'producer: SELECT task_dependencies');
    for (const kind of ['monitor', 'inspector', 'admin'] as const) {
      await refused(
        as(kind, "INSERT INTO {{S}}.task_dependencies (dependent_seq, dependency_seq, dependency_queue, dependency_id) VALUES (-1, -2, 'q', 'x')"),
        `${kind}: INSERT task_dependencies`,
      );
      await refused(as(kind, 'UPDATE {{S}}.task_states SET has_dependents = false WHERE false'), `${kind}: UPDATE task_states.has_dependents`);
    }

    // monitor: the edges and the waiting counts, not the results they hand over.
    const edges = await as(
      'monitor',
      "SELECT dependency_queue, dependency_id, on_failure, outcome FROM {{S}}.task_dependencies WHERE dependency_queue = 'wf-hold' ORDER BY dependent_seq",
    );
    assert.deepEqual(
      edges.rows,
      ['w1', 'w2', 'w3'].map(() => ({ dependency_queue: 'wf-hold', dependency_id: 'blocker', on_failure: 'archive', outcome: null })),
    );
    await as('monitor', 'SELECT dependent_seq, dependency_seq FROM {{S}}.task_dependencies');
    for (const col of ['result', 'result_bytes']) {
      await refused(as('monitor', `SELECT ${col} FROM {{S}}.task_dependencies`), `monitor: SELECT task_dependencies.${col}`);
    }
    await refused(as('monitor', 'SELECT * FROM {{S}}.task_dependencies'), 'monitor: SELECT * FROM task_dependencies');
    await as('monitor', 'SELECT waiting_for, has_dependents FROM {{S}}.task_states');
    const stats = await as('monitor', "SELECT waiting::int, size::int FROM {{S}}.queue_stats WHERE queue = 'wf-hold'");
    assert.deepEqual(stats.rows, [{ waiting: 3, size: 4 }]);
    const monitor = new Inspector({ connectionString: url('monitor'), schema: S });
    try {
      assert.equal((await monitor.getQueueInfo('wf-hold')).waiting, 3);
    } finally {
      await monitor.close();
    }

    // inspector: a waiting task with what it waits for.
    const inspector = new Inspector({ connectionString: url('inspector'), schema: S });
    try {
      const w1 = await inspector.getTaskInfo('wf-hold', 'w1');
      assert.deepEqual([w1.state, w1.waitingFor, w1.dependsOn], ['waiting', 1, [{ queue: 'wf-hold', id: 'blocker' }]]);
      assert.equal((await inspector.listWaitingTasks('wf-hold')).length, 3);
    } finally {
      await inspector.close();
    }

    // admin: archive one waiting task, run another, delete their dependency (the third is archived with it).
    const admin = new Inspector({ connectionString: url('admin'), schema: S });
    try {
      await admin.archiveTask('wf-hold', 'w1');
      await admin.runTask('wf-hold', 'w2');
      await admin.deleteTask('wf-hold', 'blocker');
      const states = await Promise.all(['w1', 'w2', 'w3'].map(async (id) => (await admin.getTaskInfo('wf-hold', id)).state));
      assert.deepEqual(states, ['archived', 'pending', 'archived']);
      assert.equal((await admin.getTaskInfo('wf-hold', 'w3')).lastError, 'dependency wf-hold/blocker failed');
      assert.equal((await admin.getQueueInfo('wf-hold')).waiting, 0);
    } finally {
      await admin.close();
    }
  });

  test('flow control: a producer enqueues in SQL (from a trigger), the admin sets limits, a worker claims within them', async () => {
    // The application's table, whose trigger enqueues as whoever inserts the row.
    await su.query(`
      CREATE TABLE public.orders (id int PRIMARY KEY, tenant text NOT NULL);
      CREATE FUNCTION public.orders_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        PERFORM "${S}".enqueue('order:confirm', jsonb_build_object('order', NEW.id), queue => 'lim',
                               task_id => 'order-' || NEW.id, concurrency_key => NEW.tenant);
        RETURN NEW;
      END
      $$;
      CREATE TRIGGER orders_enqueue AFTER INSERT ON public.orders FOR EACH ROW EXECUTE FUNCTION public.orders_enqueue();
      GRANT SELECT, INSERT ON public.orders TO ${KINDS.map((k) => `pgasynq_${k}`).join(', ')};`);
    try {
      // producer: the trigger, a call of its own, the library's enqueue with a priority and a key.
      await as('producer', "INSERT INTO public.orders SELECT g, 'tenant-' || (g % 2) FROM generate_series(1, 6) g");
      const direct = await as(
        'producer',
        "SELECT {{S}}.enqueue('order:confirm', '{\"order\": 0}', queue => 'lim', task_id => 'order-0', priority => 10, concurrency_key => 'tenant-0') AS id",
      );
      assert.equal(direct.rows[0].id, 'order-0');
      const producer = new Client({ connectionString: url('producer'), schema: S });
      try {
        const lib = await producer.enqueue(new Task('order:confirm', { order: 7 }), {
          queue: 'lim',
          taskId: 'order-7',
          priority: 10,
          concurrencyKey: 'tenant-1',
        });
        assert.deepEqual([lib.priority, lib.concurrencyKey], [10, 'tenant-1']);
      } finally {
        await producer.close();
      }
      await assert.rejects(as('producer', "SELECT {{S}}.enqueue('order:confirm', priority => 101)"), (err: { code?: string; column?: string }) => {
        assert.deepEqual([err.code, err.column], ['22023', 'priority']);
        return true;
      });
      // Nobody else may call enqueue(): not through a trigger, not directly.
      await refused(as('monitor', "INSERT INTO public.orders VALUES (100, 'x')"), 'monitor: the trigger calls enqueue()');
      for (const kind of ['worker', 'monitor', 'inspector', 'admin'] as const) {
        await refused(as(kind, "SELECT {{S}}.enqueue('order:confirm')"), `${kind}: enqueue()`);
      }
      assert.equal((await su.query('SELECT count(*)::int AS n FROM public.orders')).rows[0].n, 6);
      // The rule functions enqueue() calls are the owner's alone.
      for (const kind of KINDS.filter((k) => k !== 'owner')) {
        await refused(as(kind, "SELECT {{S}}.enqueue_text_rule('x', 1)"), `${kind}: enqueue_text_rule()`);
      }

      const inspector = new Inspector({ connectionString: url('inspector'), schema: S });
      try {
        const byTrigger = await inspector.getTaskInfo('lim', 'order-1');
        assert.deepEqual([byTrigger.state, byTrigger.payload, byTrigger.priority, byTrigger.concurrencyKey], ['pending', { order: 1 }, 0, 'tenant-1']);
        const byCall = await inspector.getTaskInfo('lim', 'order-0');
        assert.deepEqual([byCall.priority, byCall.concurrencyKey], [10, 'tenant-0']);
      } finally {
        await inspector.close();
      }

      // Only the admin sets limits.
      for (const kind of ['producer', 'worker', 'monitor', 'inspector'] as const) {
        await refused(as(kind, 'UPDATE {{S}}.queues SET concurrency = 1 WHERE false'), `${kind}: UPDATE queues.concurrency`);
        const i = new Inspector({ connectionString: url(kind), schema: S });
        try {
          await refused(i.setQueueLimits('lim', { concurrency: 1, keyConcurrency: null, rateLimit: null }), `${kind}: setQueueLimits`);
        } finally {
          await i.close();
        }
      }
      const admin = new Inspector({ connectionString: url('admin'), schema: S });
      try {
        await admin.setQueueLimits('lim', { concurrency: 2, keyConcurrency: 1, rateLimit: { limit: 100, interval: 60_000 } });
        assert.deepEqual((await admin.getQueueInfo('lim')).limits, { concurrency: 2, keyConcurrency: 1, rateLimit: { limit: 100, interval: 60_000 } });
      } finally {
        await admin.close();
      }
      // No Inspector action changes a task's priority: nobody but the owner does.
      await refused(as('admin', 'UPDATE {{S}}.tasks SET priority = 1 WHERE false'), 'admin: UPDATE tasks.priority');
      await refused(as('worker', 'UPDATE {{S}}.task_states SET priority = 1 WHERE false'), 'worker: UPDATE task_states.priority');
      await refused(as('producer', 'UPDATE {{S}}.task_states SET concurrency_key = NULL WHERE false'), 'producer: UPDATE task_states.concurrency_key');
      // claim_limited() is the worker's alone (0010: the owner's, granted to the worker).
      await refused(as('producer', "SELECT * FROM {{S}}.claim_limited(ARRAY['lim'], ARRAY[1], 1, 'me', 1000, 0)"), 'producer: claim_limited()');

      // worker: a Server claims the limited queue (claim_limited()), two at a time, one per tenant,
      // the priority-10 tasks first.
      const started: string[] = [];
      const running = new Map<string, string>();
      let most = 0;
      let twoOfOneTenant = false;
      const logs: { msg: string | undefined; code: unknown; err: string }[] = [];
      const server = new Server({
        connectionString: url('worker'),
        schema: S,
        queues: { lim: 1 },
        concurrency: 4,
        taskCheckInterval: 100,
        shutdownTimeout: 1000,
        logger: captureLogger(logs),
      });
      try {
        await server.start(async (task, ctx) => {
          const tenant = `tenant-${(task.payload as { order: number }).order % 2}`;
          if ([...running.values()].includes(tenant)) twoOfOneTenant = true;
          running.set(ctx.taskId, tenant);
          started.push(ctx.taskId);
          most = Math.max(most, running.size);
          await new Promise((r) => setTimeout(r, 100));
          running.delete(ctx.taskId);
        });
        await waitFor(() => started.length === 8 && running.size === 0, 20_000, `every order confirmed (started: ${started.join(', ')})`);
      } finally {
        await server.shutdown();
      }
      assert.deepEqual(started.slice(0, 2).sort(), ['order-0', 'order-7'], `the priority-10 tasks first: ${started.join(', ')}`);
      assert.equal(most, 2, 'at most 2 active (concurrency)');
      assert.equal(twoOfOneTenant, false, 'one task per tenant at a time (keyConcurrency)');
      const starts = await su.query(`SELECT sum(tasks)::int AS n FROM "${S}".queue_starts WHERE queue = 'lim'`);
      assert.equal(starts.rows[0].n, 8, 'every start logged for the rate limit');
      assert.deepEqual(
        logs.filter((l) => l.code === '42501' || /permission denied/.test(l.err)),
        [],
        'no component was refused',
      );
    } finally {
      await su.query('DROP TABLE public.orders; DROP FUNCTION public.orders_enqueue()');
    }
  });
});
