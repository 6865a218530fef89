/**
 * The Inspector's actions against real rows: on one task (delete, run,
 * archive, update its payload), in bulk by state or group, and on queues
 * (pause, delete); each refusal, the locks released and the NOTIFYs sent.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { FailedPreconditionError, QueueNotEmptyError, QueueNotFoundError, Task, TaskNotFoundError, ValidationError } from '../src/index.js';
import { test, waitFor } from './helpers.js';
import { ids, setupInspector } from './inspector-kit.js';

const { db, client, inspector, startServer, row, put, force, everyState, listen } = setupInspector('t_inspector_actions');

describe('single-task actions', () => {
  test('deleteTask: any state but active; releases the unique lock it holds', async () => {
    await everyState('default');
    for (const id of ['p1', 'sch', 'ret', 'arc', 'com', 'agg1']) {
      await inspector.deleteTask('default', id);
      assert.equal(await row('default', id), undefined, id);
    }
    await assert.rejects(inspector.deleteTask('default', 'act'), (e: unknown) => e instanceof FailedPreconditionError && /active state/.test(e.message));
    assert.equal((await row('default', 'act')).state, 'active');
    await assert.rejects(inspector.deleteTask('default', 'p1'), TaskNotFoundError);

    const first = await client.enqueue(new Task('uniq', { n: 1 }), { unique: 60_000, taskId: 'u1' });
    await assert.rejects(client.enqueue(new Task('uniq', { n: 1 }), { unique: 60_000 }), /already exists/);
    await inspector.deleteTask('default', first.id);
    await client.enqueue(new Task('uniq', { n: 1 }), { unique: 60_000, taskId: 'u2' });
    // A lock held by another task (u2) is not released by deleting a task with the same key.
    await db.query("UPDATE {{schema}}.tasks SET unique_key = (SELECT key FROM {{schema}}.unique_locks) WHERE id = 'p2'");
    await inspector.deleteTask('default', 'p2');
    assert.deepEqual(await db.query('SELECT task_id FROM {{schema}}.unique_locks'), [{ task_id: 'u2' }]);
  });

  test('runTask: scheduled, retry, archived, completed, aggregating → back of pending, and a NOTIFY', async () => {
    const notes = await listen(`${db.schema}_tasks`);
    try {
      await everyState('default');
      for (const id of ['sch', 'ret', 'arc', 'com', 'agg1']) {
        await inspector.runTask('default', id);
        const r = await row('default', id);
        assert.equal(r.state, 'pending', id);
        assert.equal(r.lease_token, null);
      }
      assert.deepEqual(ids(await inspector.listPendingTasks('default')), ['p1', 'p2', 'sch', 'ret', 'arc', 'com', 'agg1']);
      assert.equal((await row('default', 'arc')).error_msg, 'dead', 'the last error is kept');
      await assert.rejects(
        inspector.runTask('default', 'p1'),
        (e: unknown) => e instanceof FailedPreconditionError && /already in pending state/.test(e.message),
      );
      await assert.rejects(inspector.runTask('default', 'act'), (e: unknown) => e instanceof FailedPreconditionError && /already running/.test(e.message));
      await assert.rejects(inspector.runTask('default', 'nope'), TaskNotFoundError);
      await waitFor(() => notes.payloads.filter((p) => p === 'default').length >= 5, 5000, 'a NOTIFY per run');
    } finally {
      await notes.close();
    }
  });

  test('archiveTask: pending, scheduled, retry, completed, aggregating → archived now; active and archived refused', async () => {
    await everyState('default');
    for (const id of ['p1', 'sch', 'ret', 'com', 'agg1']) {
      await inspector.archiveTask('default', id);
      assert.equal((await row('default', id)).state, 'archived', id);
    }
    const [{ fresh }] = await db.query(
      "SELECT bool_and(run_at > now() - interval '1 min') AS fresh FROM {{schema}}.tasks WHERE state = 'archived' AND id <> 'arc'",
    );
    assert.equal(fresh, true, 'archived at now()');
    assert.equal((await row('default', 'ret')).error_msg, 'boom', 'last error and last_failed_at kept');
    assert.ok((await row('default', 'ret')).last_failed_at instanceof Date);
    await assert.rejects(inspector.archiveTask('default', 'arc'), (e: unknown) => e instanceof FailedPreconditionError && /already archived/.test(e.message));
    await assert.rejects(inspector.archiveTask('default', 'act'), (e: unknown) => e instanceof FailedPreconditionError && /active state/.test(e.message));
    await assert.rejects(inspector.archiveTask('default', 'nope'), TaskNotFoundError);
  });

  test('updateTaskPayload: scheduled tasks only; JSON or bytes; validated', async () => {
    await everyState('default');
    await inspector.updateTaskPayload('default', 'sch', { v: 2 });
    assert.deepEqual((await inspector.getTaskInfo('default', 'sch')).payload, { v: 2 });
    await inspector.updateTaskPayload('default', 'sch', Buffer.from([1, 2, 3]));
    assert.deepEqual((await inspector.getTaskInfo('default', 'sch')).payload, Buffer.from([1, 2, 3]));
    for (const id of ['p1', 'ret', 'arc', 'com', 'act', 'agg1']) {
      await assert.rejects(
        inspector.updateTaskPayload('default', id, { v: 3 }),
        (e: unknown) => e instanceof FailedPreconditionError && /not in scheduled state/.test(e.message),
        id,
      );
    }
    await assert.rejects(inspector.updateTaskPayload('default', 'sch', { n: 1n }), (e: unknown) => e instanceof ValidationError && e.field === 'payload');
    await assert.rejects(inspector.updateTaskPayload('default', 'nope', {}), TaskNotFoundError);
  });
});

describe('bulk actions', () => {
  test('deleteAll…: counts per state, the group only, locks released', async () => {
    await everyState('default');
    await everyState('other');
    await put('default', 'agg3', { group: 'g1' });
    await client.enqueue(new Task('uniq'), { unique: 60_000, taskId: 'u', processIn: 60_000 });
    assert.equal(await inspector.deleteAllPendingTasks('default'), 2);
    assert.equal(await inspector.deleteAllScheduledTasks('default'), 2);
    assert.equal((await db.query('SELECT * FROM {{schema}}.unique_locks')).length, 0, 'the lock of the deleted scheduled task');
    assert.equal(await inspector.deleteAllRetryTasks('default'), 1);
    assert.equal(await inspector.deleteAllArchivedTasks('default'), 1);
    assert.equal(await inspector.deleteAllCompletedTasks('default'), 1);
    assert.equal(await inspector.deleteAllAggregatingTasks('default', 'g1'), 2);
    assert.equal(await inspector.deleteAllAggregatingTasks('default', 'g1'), 0);
    assert.deepEqual(ids(await inspector.listAggregatingTasks('default', 'g2')), ['agg2']);
    assert.equal((await inspector.getQueueInfo('default')).size, 2, 'active and agg2 are left');
    assert.equal((await inspector.getQueueInfo('other')).size, 9, 'another queue is untouched');
  });

  test('runAll… and archiveAll…: counts, states, order and a NOTIFY for pending', async () => {
    const notes = await listen(`${db.schema}_tasks`);
    try {
      await everyState('default');
      await put('default', 'sch2', { processIn: 60_000 });
      assert.equal(await inspector.runAllScheduledTasks('default'), 2);
      assert.equal(await inspector.runAllRetryTasks('default'), 1);
      assert.equal(await inspector.runAllArchivedTasks('default'), 1);
      assert.equal(await inspector.runAllAggregatingTasks('default', 'g1'), 1);
      assert.equal(await inspector.runAllAggregatingTasks('default', 'g1'), 0);
      assert.deepEqual(ids(await inspector.listPendingTasks('default')), ['p1', 'p2', 'sch', 'sch2', 'ret', 'arc', 'agg1']);
      await waitFor(() => notes.payloads.length >= 4, 5000, 'NOTIFYs');

      await put('default', 's', { processIn: 60_000 });
      await put('default', 'r');
      await force('default', 'r', "state = 'retry', run_at = now() + interval '1 min'");
      // Notifications arrive in commit order: everything between two marks was sent between them.
      const mark = async (m: string) => {
        await db.query('SELECT pg_notify($1, $2)', [`${db.schema}_tasks`, m]);
        await waitFor(() => notes.payloads.includes(m), 5000, m);
        return notes.payloads.indexOf(m);
      };
      const before = await mark('mark1');
      assert.equal(await inspector.archiveAllPendingTasks('default'), 7);
      assert.equal(await inspector.archiveAllScheduledTasks('default'), 1);
      assert.equal(await inspector.archiveAllRetryTasks('default'), 1);
      assert.equal(await inspector.archiveAllAggregatingTasks('default', 'g2'), 1);
      const info = await inspector.getQueueInfo('default');
      assert.deepEqual([info.archived, info.pending, info.scheduled, info.retry, info.aggregating, info.active, info.completed], [10, 0, 0, 0, 0, 1, 1]);
      assert.equal(await mark('mark2'), before + 1, 'archiving notifies nobody');
    } finally {
      await notes.close();
    }
  });
});

describe('queue administration', () => {
  test('pause and unpause, with asynq refusals; a paused queue is not worked', { timeout: 30_000 }, async () => {
    await put('default', 'x');
    await inspector.pauseQueue('default');
    assert.equal((await inspector.getQueueInfo('default')).paused, true);
    await assert.rejects(
      inspector.pauseQueue('default'),
      (e: unknown) => e instanceof FailedPreconditionError && e.message === 'queue "default" is already paused',
    );
    const ran: string[] = [];
    const server = await startServer((_t, ctx) => void ran.push(ctx.taskId), { taskCheckInterval: 60_000 });
    try {
      await waitFor(async () => (await inspector.servers()).length === 1, 5000, 'server registered');
      assert.deepEqual(ran, []);
      await inspector.unpauseQueue('default');
      // taskCheckInterval is a minute: only the NOTIFY sent by unpause can wake the server this soon.
      await waitFor(() => ran.length === 1, 5000, 'the task runs after unpause');
    } finally {
      await server.shutdown();
    }
    await assert.rejects(
      inspector.unpauseQueue('default'),
      (e: unknown) => e instanceof FailedPreconditionError && e.message === 'queue "default" is not paused',
    );
  });

  test('deleteQueue: empty only, or force unless a task is active; stats and locks go too', async () => {
    await everyState('default');
    await client.enqueue(new Task('uniq'), { unique: 60_000, taskId: 'u' });
    await db.query("INSERT INTO {{schema}}.daily_stats VALUES ('default', now()::date, 1, 1)");
    await assert.rejects(inspector.deleteQueue('default'), (e: unknown) => e instanceof QueueNotEmptyError && e.queue === 'default');
    await assert.rejects(inspector.deleteQueue('default', true), (e: unknown) => e instanceof FailedPreconditionError && /active tasks/.test(e.message));
    assert.equal((await inspector.getQueueInfo('default')).size, 10, 'nothing deleted');
    await force('default', 'act', "state = 'retry', run_at = now(), lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL");
    await assert.rejects(inspector.deleteQueue('default'), QueueNotEmptyError);
    await inspector.deleteQueue('default', true);
    assert.deepEqual(await inspector.queues(), []);
    assert.deepEqual(await db.query('SELECT count(*)::int AS n FROM {{schema}}.tasks'), [{ n: 0 }]);
    assert.deepEqual(await db.query('SELECT count(*)::int AS n FROM {{schema}}.unique_locks'), [{ n: 0 }]);
    assert.deepEqual(await db.query('SELECT count(*)::int AS n FROM {{schema}}.daily_stats'), [{ n: 0 }]);

    await put('empty', 'x');
    await inspector.deleteTask('empty', 'x');
    await inspector.deleteQueue('empty');
    await assert.rejects(inspector.getQueueInfo('empty'), QueueNotFoundError);
    await assert.rejects(inspector.deleteQueue('empty'), QueueNotFoundError);
  });
});
