/**
 * SEC1 (R24): the least-privilege roles of `pgasynq roles`, on a throwaway
 * cluster (roles are cluster-global). The SQL is printed by the CLI, as a
 * user would get it, applied before and after the owner migrates, and once
 * more (idempotent). Then each role does its job through the real library
 * and CLI, and every statement beyond it fails with SQLSTATE 42501. The
 * roles' later duties are files of their own: workflows (0005) in
 * sec1-roles-workflows.test.ts, flow control and enqueue() in SQL (0007,
 * 0008) in sec1-roles-flow-control.test.ts; the setup is sec1.ts's.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { sql } from 'kysely';
import pg from 'pg';
import { Client, DuplicateTaskError, Inspector, Scheduler, Task, TaskIdConflictError } from '../../src/index.js';
import { waitFor } from '../helpers.js';
import {
  as,
  assertNoneRefused,
  cli,
  cliHere,
  cluster,
  pools,
  refused,
  refusesDdl,
  S,
  su,
  url,
  useRolesCluster,
  workerRoleServer,
  type LogLine,
} from './sec1.js';

useRolesCluster();

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
    const logs: LogLine[] = [];
    const server = workerRoleServer(logs, {
      queues: { work: 1 },
      delayedTaskCheckInterval: 100,
      retryDelay: () => 0,
      leaseDuration: 3000,
      heartbeatInterval: 300,
      recoverInterval: 200,
      recoverCutoff: 0,
      janitorInterval: 100,
      groupGracePeriod: 100,
      groupAggregator: (group, tasks) => new Task('agg', { group, n: tasks.length }),
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
    assertNoneRefused(logs);

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
});
