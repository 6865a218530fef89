/**
 * The Inspector and running processes: servers() with a real Server and the
 * task it runs, cancellation of a running handler (by NOTIFY, and by
 * heartbeat when the NOTIFY is lost), and scheduler entries and their history.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { Task, TaskCanceledError, ValidationError } from '../src/index.js';
import { deferred, test, waitFor } from './helpers.js';
import { ACTIVE, setupInspector } from './inspector-kit.js';

const { db, client, inspector, startServer, row, put, force, listen } = setupInspector('t_inspector_servers');

describe('servers and cancellation, with a real Server', () => {
  test('servers() shows a running server and the task it runs; gone after shutdown', { timeout: 30_000 }, async () => {
    const release = deferred();
    const server = await startServer(() => release.promise, { queues: { default: 2, low: 1 }, concurrency: 3 });
    try {
      await client.enqueue(new Task('slow', { n: 1 }), { taskId: 'slow1', timeout: 60_000 });
      const [s] = await waitFor(async () => {
        const list = await inspector.servers();
        return list[0]?.activeWorkers.length === 1 ? list : undefined;
      });
      assert.equal(s!.id, server.id);
      assert.equal(s!.pid, process.pid);
      assert.equal(typeof s!.host, 'string');
      assert.equal(s!.concurrency, 3);
      assert.deepEqual(s!.queues, { default: 2, low: 1 });
      assert.equal(s!.strictPriority, false);
      assert.equal(s!.status, 'active');
      assert.ok(s!.startedAt instanceof Date);
      const w = s!.activeWorkers[0]!;
      assert.deepEqual([w.taskId, w.queue, w.type, w.payload], ['slow1', 'default', 'slow', { n: 1 }]);
      assert.ok(w.startedAt instanceof Date && w.leaseExpiresAt > w.startedAt);
      assert.equal(w.deadline?.getTime(), w.startedAt.getTime() + 60_000, 'start + timeout');
      const [view] = await db.query('SELECT * FROM {{schema}}.active_tasks');
      assert.equal(view.lease_owner, server.id);
      assert.equal(view.orphaned, false);
      // An expired server row is not listed.
      await db.query(
        "INSERT INTO {{schema}}.servers (id, host, pid, concurrency, queues, strict_priority, status, expires_at) VALUES ('dead', 'h', 1, 1, '{}', false, 'active', now() - interval '1 s')",
      );
      assert.deepEqual(
        (await inspector.servers()).map((x) => x.id),
        [server.id],
      );
    } finally {
      release.resolve();
      await server.shutdown();
    }
    assert.deepEqual(await inspector.servers(), []);
  });

  for (const how of ['NOTIFY', 'heartbeat (NOTIFY lost)'] as const) {
    test(`cancelProcessing aborts a running handler by ${how}; the task goes to retry`, { timeout: 30_000 }, async () => {
      const started = deferred();
      const reason = deferred<unknown>();
      const server = await startServer(
        async (_t, ctx) => {
          started.resolve();
          await new Promise((r) => ctx.signal.addEventListener('abort', r, { once: true }));
          reason.resolve(ctx.signal.reason);
        },
        { retryDelay: () => 3_600_000 },
      );
      try {
        await client.enqueue(new Task('long'), { taskId: 'victim', maxRetry: 5 });
        await put('other', 'victim');
        await started.promise;
        if (how === 'NOTIFY') {
          assert.equal(await inspector.cancelProcessing('victim'), 1, 'only the active one is marked');
        } else {
          await db.query("UPDATE {{schema}}.tasks SET cancel_requested = true WHERE id = 'victim' AND state = 'active'");
        }
        assert.ok((await reason.promise) instanceof TaskCanceledError);
        const r = await waitFor(async () => {
          const x = await row('default', 'victim');
          return x?.state === 'retry' ? x : undefined;
        });
        assert.equal(r.retried, 1);
        assert.equal(r.error_msg, 'task canceled');
        assert.equal((await row('other', 'victim')).state, 'pending', 'the same id in a queue the server does not work is untouched');
      } finally {
        await server.shutdown();
      }
    });
  }

  test('cancelProcessing of a task that is not running marks nothing and notifies nobody', async () => {
    const notes = await listen(`${db.schema}_cancel`);
    try {
      await put('default', 'idle');
      assert.equal(await inspector.cancelProcessing('idle'), 0);
      assert.equal(await inspector.cancelProcessing('ghost'), 0);
      assert.equal((await row('default', 'idle')).cancel_requested, false);
      await put('default', 'busy');
      await force('default', 'busy', ACTIVE);
      assert.equal(await inspector.cancelProcessing('busy'), 1);
      await waitFor(() => notes.payloads.length === 1, 5000, 'one NOTIFY');
      assert.deepEqual(notes.payloads, ['busy']);
    } finally {
      await notes.close();
    }
  });
});

describe('scheduler entries and history', () => {
  test('schedulerEntries: live entries only; listSchedulerEnqueueEvents newest first, paged', async () => {
    await db.query(
      `INSERT INTO {{schema}}.scheduler_entries (id, spec, task_type, payload, options, scheduler_id, next_run_at, prev_run_at, expires_at) VALUES
       ('e1', '@every 30s', 'report', '{"k":1}', '{"queue":"low"}', 's1', now() + interval '30 s', now(), now() + interval '1 min'),
       ('e0', '0 * * * *', 'old', NULL, '{}', 's0', NULL, NULL, now() - interval '1 s')`,
    );
    const entries = await inspector.schedulerEntries();
    assert.equal(entries.length, 1);
    const e = entries[0]!;
    assert.deepEqual([e.id, e.spec, e.task, e.options], ['e1', '@every 30s', { type: 'report', payload: { k: 1 } }, { queue: 'low' }]);
    assert.ok(e.next instanceof Date && e.prev instanceof Date && e.next > e.prev);

    await db.query(
      "INSERT INTO {{schema}}.scheduler_events (entry_id, tick_at, task_id, enqueued_at) SELECT 'e1', now() - i * interval '30 s', 'task' || i, now() - i * interval '30 s' FROM generate_series(1, 35) i",
    );
    const first = await inspector.listSchedulerEnqueueEvents('e1');
    assert.equal(first.length, 30);
    assert.equal(first[0]!.taskId, 'task1', 'newest first');
    assert.ok(first[0]!.tickAt > first[1]!.tickAt && first[0]!.enqueuedAt instanceof Date);
    assert.deepEqual(
      (await inspector.listSchedulerEnqueueEvents('e1', { page: 2 })).map((x) => x.taskId),
      ['task31', 'task32', 'task33', 'task34', 'task35'],
    );
    assert.deepEqual(await inspector.listSchedulerEnqueueEvents('unknown'), []);
    await assert.rejects(inspector.listSchedulerEnqueueEvents(''), (e: unknown) => e instanceof ValidationError && e.field === 'entryId');
  });
});
