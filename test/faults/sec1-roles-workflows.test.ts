/**
 * SEC1 (R24), workflows (0005): the least-privilege roles of `pgasynq roles`
 * (set up as sec1.ts does, on a cluster of this file's own) around tasks that
 * depend on others. A producer enqueues tasks that depend on stored ones, a
 * worker's Server finishes those (completed with and without retention,
 * archived) and the owner's triggers release or archive the dependents; the
 * monitor sees the edges without the results they carry; the inspector sees
 * a waiting task with what it waits for; the admin acts on waiting tasks.
 * Nobody but the owner settles an edge.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { Client, Inspector, Task } from '../../src/index.js';
import { waitFor } from '../helpers.js';
import { as, assertNoneRefused, KINDS, refused, S, su, url, useRolesCluster, workerRoleServer, type LogLine } from './sec1.js';

useRolesCluster();

describe('SEC1 roles', () => {
  test('workflows: a producer enqueues dependents, a worker settles them, the monitor sees no results, the admin acts on waiting tasks', async () => {
    const producer = new Client({ connectionString: url('producer'), schema: S });
    const results = new Map<string, Record<string, unknown>>();
    const logs: LogLine[] = [];
    const server = workerRoleServer(logs, { queues: { wf: 1 }, delayedTaskCheckInterval: 100, retryDelay: () => 0, janitorInterval: 100 });
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
    assertNoneRefused(logs);

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
});
