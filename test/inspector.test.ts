/**
 * Inspector against real rows: every method, each refusal, paging and order,
 * the queue_stats and active_tasks views, and cancellation of a handler
 * running in a real Server (by NOTIFY, and by heartbeat when the NOTIFY is lost).
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import pg from 'pg';
import {
  ClientClosedError,
  FailedPreconditionError,
  Inspector,
  QueueNotEmptyError,
  QueueNotFoundError,
  Task,
  TaskCanceledError,
  TaskNotFoundError,
  ValidationError,
  migrate,
  migrateDown,
} from '../src/index.js';
import { deferred, MIGRATIONS, setupDb, test, waitFor } from './helpers.js';

const { db, client, inspector, startServer } = setupDb('t_inspector', {
  resetEach: true,
  // Fast durations, as in server.test.ts.
  server: { concurrency: 4, taskCheckInterval: 50, delayedTaskCheckInterval: 50, leaseDuration: 2000, heartbeatInterval: 200 },
});

const row = async (queue: string, id: string) => (await db.query('SELECT * FROM {{schema}}.tasks WHERE queue = $1 AND id = $2', [queue, id]))[0];
const put = (queue: string, id: string, extra: Record<string, unknown> = {}) => client.enqueue(new Task('job', { id }), { queue, taskId: id, ...extra });
/** Rewrites a row's state with the columns that state needs (SQL `set`, $1 = queue, $2 = id). */
const force = (queue: string, id: string, set: string) => db.query(`UPDATE {{schema}}.tasks SET ${set} WHERE queue = $1 AND id = $2`, [queue, id]);
const ACTIVE =
  "state = 'active', run_at = NULL, lease_owner = 'srv', lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 min', started_at = now()";
const ids = (tasks: { id: string }[]) => tasks.map((t) => t.id);

/** LISTENs on a channel of the test schema and collects payloads. */
async function listen(channel: string): Promise<{ payloads: string[]; close: () => Promise<void> }> {
  const c = new pg.Client({ connectionString: db.connectionString });
  await c.connect();
  const payloads: string[] = [];
  c.on('notification', (n) => n.channel === channel && payloads.push(n.payload ?? ''));
  await c.query(`LISTEN "${channel}"`);
  return { payloads, close: () => c.end() };
}

type QueueCall = [string, (i: Inspector, q: string) => Promise<unknown>];
/** The Inspector's methods that take nothing but the queue. */
type QueueOnly = Extract<{ [K in keyof Inspector]: Inspector[K] extends (q: string) => Promise<unknown> ? K : never }[keyof Inspector], string>;
/** Rows of QUEUE_METHODS for methods called with the queue alone. */
const only = (...names: QueueOnly[]): QueueCall[] => names.map((name) => [name, (i, q) => (i[name] as (q: string) => Promise<unknown>).call(i, q)]);

/** Every method that takes a queue, called on `q`. */
const QUEUE_METHODS: QueueCall[] = [
  ...only('getQueueInfo'),
  ['history', (i, q) => i.history(q, 7)],
  ['getTaskInfo', (i, q) => i.getTaskInfo(q, 'x')],
  ...only('listPendingTasks', 'listActiveTasks', 'listScheduledTasks', 'listRetryTasks', 'listArchivedTasks', 'listCompletedTasks'),
  ['listAggregatingTasks', (i, q) => i.listAggregatingTasks(q, 'g')],
  ...only('listWaitingTasks'),
  ['deleteTask', (i, q) => i.deleteTask(q, 'x')],
  ['runTask', (i, q) => i.runTask(q, 'x')],
  ['archiveTask', (i, q) => i.archiveTask(q, 'x')],
  ['updateTaskPayload', (i, q) => i.updateTaskPayload(q, 'x', { a: 1 })],
  ...only('deleteAllPendingTasks', 'deleteAllScheduledTasks', 'deleteAllRetryTasks', 'deleteAllArchivedTasks', 'deleteAllCompletedTasks'),
  ['deleteAllAggregatingTasks', (i, q) => i.deleteAllAggregatingTasks(q, 'g')],
  ...only('deleteAllWaitingTasks', 'runAllScheduledTasks', 'runAllRetryTasks', 'runAllArchivedTasks'),
  ['runAllAggregatingTasks', (i, q) => i.runAllAggregatingTasks(q, 'g')],
  ...only('runAllWaitingTasks', 'archiveAllPendingTasks', 'archiveAllScheduledTasks', 'archiveAllRetryTasks'),
  ['archiveAllAggregatingTasks', (i, q) => i.archiveAllAggregatingTasks(q, 'g')],
  ...only('archiveAllWaitingTasks'),
  // Not pauseQueue, setQueueLimits or createQueue: they make an unknown queue known (queues-known.test.ts).
  ...only('unpauseQueue', 'deleteQueue'),
  ['deleteQueue force', (i, q) => i.deleteQueue(q, true)],
  ...only('groups'),
];

/** One task in each state in queue `q`, ids named after the state (two pending). */
async function everyState(q: string): Promise<void> {
  await put(q, 'p1');
  await put(q, 'p2');
  await put(q, 'sch', { processIn: 3_600_000 });
  await put(q, 'ret');
  await force(q, 'ret', "state = 'retry', run_at = now() + interval '1 min', retried = 1, error_msg = 'boom', last_failed_at = now()");
  await put(q, 'arc');
  await force(q, 'arc', "state = 'archived', run_at = now(), error_msg = 'dead', last_failed_at = now()");
  await put(q, 'com', { retention: 3_600_000 });
  await force(q, 'com', "state = 'completed', completed_at = now(), run_at = now() + interval '1 hour'");
  await put(q, 'act');
  await force(q, 'act', ACTIVE);
  await put(q, 'agg1', { group: 'g1' });
  await put(q, 'agg2', { group: 'g2' });
}

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

describe('validation, closing, migration', () => {
  test('bad arguments are ValidationErrors naming the field, raised before any SQL', async () => {
    // Nothing listens on port 1: a method that reached the database would fail with ECONNREFUSED instead.
    const offline = new Inspector({ connectionString: 'postgres://u@127.0.0.1:1/x', schema: db.schema });
    try {
      for (const [name, call] of QUEUE_METHODS) {
        for (const bad of ['', 'a b', 42, undefined, 'x'.repeat(101)]) {
          await assert.rejects(call(offline, bad as string), (e: unknown) => e instanceof ValidationError && e.field === 'queue', `${name}(${String(bad)})`);
        }
      }
      const calls: [string, () => Promise<unknown>][] = [
        ['taskId', () => offline.getTaskInfo('q', '../x')],
        ['taskId', () => offline.deleteTask('q', '')],
        ['taskId', () => offline.runTask('q', 7 as never)],
        ['taskId', () => offline.archiveTask('q', 'a b')],
        ['taskId', () => offline.updateTaskPayload('q', 'x y', {})],
        ['taskId', () => offline.cancelProcessing('')],
        ['payload', () => offline.updateTaskPayload('q', 'x', () => 1)],
        ['group', () => offline.listAggregatingTasks('q', '')],
        ['group', () => offline.deleteAllAggregatingTasks('q', undefined as never)],
        ['group', () => offline.runAllAggregatingTasks('q', 'a/b')],
        ['group', () => offline.archiveAllAggregatingTasks('q', 3 as never)],
        ['days', () => offline.history('q', 0)],
        ['force', () => offline.deleteQueue('q', 'yes' as never)],
        ['pageSize', () => offline.listRetryTasks('q', { pageSize: 5000 })],
        ['entryId', () => offline.listSchedulerEnqueueEvents(5 as never)],
      ];
      for (const [field, call] of calls) {
        await assert.rejects(call(), (e: unknown) => e instanceof ValidationError && e.field === field, field);
      }
    } finally {
      await offline.close();
    }
  });

  test('after close() every method rejects with ClientClosedError; close twice is fine', async () => {
    const ins = new Inspector({ connectionString: db.connectionString, schema: db.schema });
    await ins.queues();
    await ins[Symbol.asyncDispose]();
    await ins.close();
    await assert.rejects(ins.queues(), ClientClosedError);
    await assert.rejects(ins.getQueueInfo('default'), ClientClosedError);
    await assert.rejects(ins.servers(), ClientClosedError);
    await assert.rejects(ins.cancelProcessing('x'), ClientClosedError);
  });

  test('a schema that was never migrated: reads and actions reject with FailedPreconditionError saying to migrate; nothing is created', async () => {
    const schema = `${db.schema}_never`;
    await db.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    const ins = new Inspector({ connectionString: db.connectionString, schema, logger: false });
    const calls: [string, () => Promise<unknown>][] = [
      ['queues', () => ins.queues()],
      ['getQueueInfo', () => ins.getQueueInfo('default')],
      ['history', () => ins.history('default', 7)],
      ['getTaskInfo', () => ins.getTaskInfo('default', 'x')],
      ['listPendingTasks', () => ins.listPendingTasks('default')],
      ['listArchivedTasks', () => ins.listArchivedTasks('default', { page: 2 })],
      ['servers', () => ins.servers()],
      ['schedulerEntries', () => ins.schedulerEntries()],
      ['pauseQueue', () => ins.pauseQueue('default')],
      ['deleteQueue', () => ins.deleteQueue('default', true)],
      ['runAllArchivedTasks', () => ins.runAllArchivedTasks('default')],
      ['deleteTask', () => ins.deleteTask('default', 'x')],
      ['cancelProcessing', () => ins.cancelProcessing('x')],
    ];
    try {
      for (const [name, call] of calls) {
        await assert.rejects(call(), (e: unknown) => {
          assert.ok(e instanceof FailedPreconditionError, `${name}: ${String(e)}`);
          assert.match(e.message, /^schema "\w+_never" is not migrated \(.* does not exist\): run `pgasynq migrate` \(or migrate\(\)\) first$/, name);
          return true;
        });
      }
      assert.equal((await db.pool.query('SELECT 1 FROM pg_namespace WHERE nspname = $1', [schema])).rowCount, 0, 'no schema was created');
    } finally {
      await ins.close();
    }
  });

  test('a borrowed pool is not ended by close()', async () => {
    const pool = new pg.Pool({ connectionString: db.connectionString, max: 1 });
    const ins = new Inspector({ pool, schema: db.schema });
    await ins.queues();
    await ins.close();
    assert.deepEqual((await pool.query('SELECT 1 AS one')).rows, [{ one: 1 }]);
    await pool.end();
  });

  test('migrations 0012 down to 0002 roll back and apply again', async () => {
    const schema = `${db.schema}_mig`;
    await db.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    const opts = { connectionString: db.connectionString, schema, logger: false as const };
    await migrate(opts);
    const objects = () =>
      db.pool
        .query(
          `SELECT to_regclass('"${schema}".queue_stats')::text AS v, to_regclass('"${schema}".active_tasks')::text AS a, to_regclass('"${schema}".tasks_due_queue_idx')::text AS i`,
        )
        .then((r) => r.rows[0]);
    const activeIndex = () => db.pool.query(`SELECT pg_get_indexdef(to_regclass('"${schema}".tasks_active_idx')) AS def`).then((r) => r.rows[0].def as string);
    assert.equal(await migrateDown(opts), '0012_transitions');
    assert.equal(await migrateDown(opts), '0011_clock_seam');
    assert.equal(await migrateDown(opts), '0010_worker_writes');
    assert.equal(await migrateDown(opts), '0009_trust_boundary');
    assert.equal(await migrateDown(opts), '0008_sql_enqueue');
    assert.equal(await migrateDown(opts), '0007_flow_control');
    assert.equal(await migrateDown(opts), '0006_replace');
    assert.equal(await migrateDown(opts), '0005_workflows');
    assert.ok((await objects()).v);
    assert.equal(await migrateDown(opts), '0004_storage_v2');
    assert.ok((await objects()).v && (await objects()).a && (await objects()).i);
    assert.match(await activeIndex(), /\(queue, started_at, seq\) WHERE \(\(state = 'active'::text\) AND \(lease_owner IS NOT NULL\)\)/);
    assert.equal(await migrateDown(opts), '0003_active_index');
    assert.match(await activeIndex(), /\(lease_expires_at\) WHERE \(state = 'active'::text\)$/);
    assert.equal(await migrateDown(opts), '0002_views');
    assert.deepEqual(await objects(), { v: null, a: null, i: null });
    assert.deepEqual(await migrate(opts), { applied: MIGRATIONS.slice(1) });
    assert.ok((await objects()).v);
    await db.pool.query(`DROP SCHEMA "${schema}" CASCADE`);
  });
});
