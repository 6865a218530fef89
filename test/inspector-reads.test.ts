/**
 * The Inspector's reads against real rows: queues, getQueueInfo, history, the
 * queue_stats and active_tasks views, and tasks one by one and by the page,
 * in each state's order.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { QueueNotFoundError, Task, TaskNotFoundError, ValidationError } from '../src/index.js';
import { test } from './helpers.js';
import { ACTIVE, QUEUE_METHODS, ids, setupInspector } from './inspector-kit.js';

const { db, client, inspector, put, force, everyState } = setupInspector('t_inspector_reads');

describe('queues, getQueueInfo, history and the views', () => {
  test('queues() lists every queue, sorted', async () => {
    assert.deepEqual(await inspector.queues(), []);
    for (const q of ['low', 'critical', 'default']) await put(q, 'a');
    assert.deepEqual(await inspector.queues(), ['critical', 'default', 'low']);
  });

  test('getQueueInfo counts every state, latency, stats of today and totals; queue_stats agrees', async () => {
    await everyState('default');
    await put('default', 'w', { dependsOn: ['p1'] });
    await db.query("UPDATE {{schema}}.tasks SET run_at = now() - interval '5 s' WHERE id = 'p1'");
    await db.query(
      "INSERT INTO {{schema}}.daily_stats VALUES ('default', (now() AT TIME ZONE 'UTC')::date, 7, 2), ('default', (now() AT TIME ZONE 'UTC')::date - 1, 100, 50)",
    );
    await db.query("UPDATE {{schema}}.queues SET processed_total = 1000, failed_total = 300, paused = true WHERE name = 'default'");
    const info = await inspector.getQueueInfo('default');
    const { latency, timestamp, ...rest } = info;
    assert.deepEqual(rest, {
      queue: 'default',
      size: 10,
      groups: 2,
      pending: 2,
      active: 1,
      scheduled: 1,
      retry: 1,
      archived: 1,
      completed: 1,
      aggregating: 2,
      waiting: 1,
      processed: 7,
      failed: 2,
      processedTotal: 1000,
      failedTotal: 300,
      paused: true,
      limits: { concurrency: null, keyConcurrency: null, rateLimit: null },
    });
    assert.ok(latency >= 5000 && latency < 15_000, `latency ${latency}`);
    assert.ok(timestamp instanceof Date && Math.abs(timestamp.getTime() - Date.now()) < 60_000);

    const truth = await db.query<{ state: string; n: number }>("SELECT state, count(*)::int AS n FROM {{schema}}.tasks WHERE queue = 'default' GROUP BY state");
    for (const { state, n } of truth) assert.equal((info as unknown as Record<string, number>)[state], n, `${state} against a plain count`);
    const [view] = await db.query("SELECT * FROM {{schema}}.queue_stats WHERE queue = 'default'");
    for (const key of ['size', 'groups', 'pending', 'active', 'scheduled', 'retry', 'archived', 'completed', 'aggregating', 'waiting', 'processed', 'failed']) {
      assert.equal(Number(view[key]), (info as unknown as Record<string, number>)[key], key);
    }
    assert.equal(Number(view.processed_total), info.processedTotal);
    assert.equal(Number(view.failed_total), info.failedTotal);
    assert.equal(view.paused, true);
    assert.ok(Math.abs(view.latency_ms - latency) < 5000);
    const [{ secs }] = await db.query("SELECT extract(epoch FROM latency)::int AS secs FROM {{schema}}.queue_stats WHERE queue = 'default'");
    assert.ok(secs >= 5, 'latency is also an interval');
  });

  test('an empty queue: zeros and latency 0; the view has one row per queue', async () => {
    await put('empty', 'x');
    await inspector.deleteTask('empty', 'x');
    await put('other', 'y');
    const info = await inspector.getQueueInfo('empty');
    assert.equal(info.size, 0);
    assert.equal(info.latency, 0);
    assert.equal(info.paused, false);
    const views = await db.query('SELECT queue, size::int AS size FROM {{schema}}.queue_stats ORDER BY queue');
    assert.deepEqual(views, [
      { queue: 'empty', size: 0 },
      { queue: 'other', size: 1 },
    ]);
  });

  test('the active_tasks view: owner, lease and orphaned', async () => {
    await put('default', 'live');
    await force('default', 'live', ACTIVE);
    await put('default', 'orphan');
    await force('default', 'orphan', ACTIVE.replace("now() + interval '1 min'", "now() - interval '1 s'"));
    await put('default', 'waiting');
    const rows = await db.query('SELECT id, lease_owner, orphaned, started_at IS NOT NULL AS started FROM {{schema}}.active_tasks ORDER BY id');
    assert.deepEqual(rows, [
      { id: 'live', lease_owner: 'srv', orphaned: false, started: true },
      { id: 'orphan', lease_owner: 'srv', orphaned: true, started: true },
    ]);
    const active = await inspector.listActiveTasks('default');
    assert.deepEqual(active.map((t) => [t.id, t.isOrphaned]).sort(), [
      ['live', false],
      ['orphan', true],
    ]);
  });

  test('history: n days, today first, UTC midnights, zeros for quiet days', async () => {
    await put('default', 'a');
    await db.query(
      "INSERT INTO {{schema}}.daily_stats VALUES ('default', (now() AT TIME ZONE 'UTC')::date, 5, 1), ('default', (now() AT TIME ZONE 'UTC')::date - 2, 9, 3), ('default', (now() AT TIME ZONE 'UTC')::date - 10, 1, 1)",
    );
    const days = await inspector.history('default', 4);
    const midnight = new Date();
    midnight.setUTCHours(0, 0, 0, 0);
    // Near midnight UTC the database's today may be tomorrow by the time we compare; allow one day.
    assert.ok(Math.abs((days[0]?.date.getTime() ?? 0) - midnight.getTime()) <= 86_400_000);
    const today = days[0]!.date.getTime();
    assert.deepEqual(days, [
      { queue: 'default', date: new Date(today), processed: 5, failed: 1 },
      { queue: 'default', date: new Date(today - 86_400_000), processed: 0, failed: 0 },
      { queue: 'default', date: new Date(today - 2 * 86_400_000), processed: 9, failed: 3 },
      { queue: 'default', date: new Date(today - 3 * 86_400_000), processed: 0, failed: 0 },
    ]);
    assert.equal((await inspector.history('default', 1)).length, 1);
    for (const bad of [0, -1, 1.5, '3', Number.NaN, 3651]) {
      await assert.rejects(inspector.history('default', bad as number), (e: unknown) => e instanceof ValidationError && e.field === 'days');
    }
  });

  test('every method taking a queue rejects an unknown queue with QueueNotFoundError', async () => {
    await put('default', 'x');
    for (const [name, call] of QUEUE_METHODS) {
      await assert.rejects(call(inspector, 'nope'), (e: unknown) => e instanceof QueueNotFoundError && e.queue === 'nope', name);
    }
  });
});

describe('reading tasks', () => {
  test('getTaskInfo: every field, TaskNotFoundError, QueueNotFoundError', async () => {
    await put('default', 'r1', { maxRetry: 3, timeout: 5000, headers: { h: 'v' } });
    await force('default', 'r1', "state = 'retry', retried = 2, run_at = now() + interval '1 min', error_msg = 'boom', last_failed_at = now()");
    const t = await inspector.getTaskInfo('default', 'r1');
    assert.equal(t.state, 'retry');
    assert.deepEqual(t.payload, { id: 'r1' });
    assert.equal(t.maxRetry, 3);
    assert.equal(t.retried, 2);
    assert.equal(t.lastError, 'boom');
    assert.ok(t.lastFailedAt instanceof Date);
    assert.equal(t.timeout, 5000);
    assert.ok(t.nextProcessAt && t.nextProcessAt.getTime() > Date.now());
    assert.deepEqual(t.headers, { h: 'v' });
    await assert.rejects(
      inspector.getTaskInfo('default', 'missing'),
      (e: unknown) => e instanceof TaskNotFoundError && e.taskId === 'missing' && e.queue === 'default',
    );
    await assert.rejects(inspector.getTaskInfo('nope', 'r1'), QueueNotFoundError);
  });

  test('pages: 1-based, 30 by default, in claim order, never overlapping', async () => {
    const tasks = Array.from({ length: 75 }, (_, i) => new Task('job', { i }, { taskId: `t${String(i).padStart(2, '0')}` }));
    await client.enqueueMany(tasks);
    // Same run_at for all (one statement): the order is enqueue order (seq).
    const all = Array.from({ length: 75 }, (_, i) => `t${String(i).padStart(2, '0')}`);
    assert.deepEqual(ids(await inspector.listPendingTasks('default')), all.slice(0, 30));
    assert.deepEqual(ids(await inspector.listPendingTasks('default', { page: 2 })), all.slice(30, 60));
    assert.deepEqual(ids(await inspector.listPendingTasks('default', { page: 3 })), all.slice(60));
    assert.deepEqual(await inspector.listPendingTasks('default', { page: 4 }), []);
    assert.deepEqual(ids(await inspector.listPendingTasks('default', { page: 4, pageSize: 7 })), all.slice(21, 28));
    assert.deepEqual(ids(await inspector.listPendingTasks('default', { pageSize: 1000 })), all);
    // The claim's order: a higher priority first, whatever the enqueue order.
    await client.enqueue(new Task('job', null, { taskId: 'urgent', priority: 5 }));
    assert.equal((await inspector.listPendingTasks('default', { pageSize: 1 }))[0]?.id, 'urgent');
    const t = (await inspector.listPendingTasks('default', { pageSize: 1 }))[0]!;
    assert.equal(t.state, 'pending');
    assert.ok(t.nextProcessAt instanceof Date, 'pending: nextProcessAt is now');
  });

  test('page options are validated', async () => {
    await put('default', 'x');
    const bad: [unknown, string][] = [
      [{ page: 0 }, 'page'],
      [{ page: -1 }, 'page'],
      [{ page: 1.5 }, 'page'],
      [{ page: '2' }, 'page'],
      [{ pageSize: 0 }, 'pageSize'],
      [{ pageSize: 1001 }, 'pageSize'],
      [{ pageSize: 2.5 }, 'pageSize'],
      [{ pageSize: null }, 'pageSize'],
      [{ size: 10 }, 'options.size'],
      ['30', 'options'],
      [null, 'options'],
    ];
    for (const [opts, field] of bad) {
      await assert.rejects(
        inspector.listArchivedTasks('default', opts as never),
        (e: unknown) => e instanceof ValidationError && e.field === field,
        JSON.stringify(opts),
      );
    }
  });

  test('scheduled and retry by due time, archived and completed oldest first, aggregating by enqueue order and group', async () => {
    for (const [id, mins] of [
      ['s3', 30],
      ['s1', 10],
      ['s2', 20],
    ] as const)
      await put('default', id, { processIn: mins * 60_000 });
    assert.deepEqual(ids(await inspector.listScheduledTasks('default')), ['s1', 's2', 's3']);
    for (const [id, mins] of [
      ['r2', 2],
      ['r1', 1],
    ] as const) {
      await put('default', id);
      await force('default', id, `state = 'retry', run_at = now() + interval '${mins} min'`);
    }
    assert.deepEqual(ids(await inspector.listRetryTasks('default')), ['r1', 'r2']);
    for (const [id, ago] of [
      ['a2', 2],
      ['a3', 1],
      ['a1', 3],
    ] as const) {
      await put('default', id);
      await force('default', id, `state = 'archived', run_at = now() - interval '${ago} min'`);
    }
    assert.deepEqual(ids(await inspector.listArchivedTasks('default')), ['a1', 'a2', 'a3']);
    for (const [id, ago] of [
      ['c2', 2],
      ['c1', 3],
    ] as const) {
      await put('default', id, { retention: 3_600_000 });
      await force('default', id, `state = 'completed', completed_at = now() - interval '${ago} min', run_at = now() - interval '${ago} min' + retention`);
    }
    assert.deepEqual(ids(await inspector.listCompletedTasks('default')), ['c1', 'c2']);
    for (const [id, g] of [
      ['g1b', 'g1'],
      ['g2a', 'g2'],
      ['g1a', 'g1'],
      ['g1c', 'g1'],
    ] as const)
      await put('default', id, { group: g });
    assert.deepEqual(ids(await inspector.listAggregatingTasks('default', 'g1')), ['g1b', 'g1a', 'g1c']);
    assert.deepEqual(ids(await inspector.listAggregatingTasks('default', 'g2')), ['g2a']);
    assert.deepEqual(await inspector.listAggregatingTasks('default', 'g3'), []);
    assert.deepEqual(await inspector.groups('default'), [
      { group: 'g1', size: 3 },
      { group: 'g2', size: 1 },
    ]);
    assert.deepEqual(await inspector.groups((await put('other', 'x')).queue), []);
  });
});
