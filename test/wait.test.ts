/**
 * Waiting for a task (Client.waitFor, enqueueAndWait; migration 0013): the
 * outcome of every kind, from this process and from another one, the
 * awaited task kept for its waiter, the wait's bounds and its bad input.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import {
  Client,
  QueueNotFoundError,
  SkipRetry,
  Task,
  TaskCanceledError,
  TaskFailedError,
  TaskIdConflictError,
  TaskNotFoundError,
  ValidationError,
  WaitTimeoutError,
} from '../src/index.js';
import { countedPool, deferred, exited, setupDb, spawnFixture, test, waitFor } from './helpers.js';

const { db, client, inspector, startServer } = setupDb('t_wait', {
  resetEach: true,
  server: { concurrency: 4, taskCheckInterval: 50, delayedTaskCheckInterval: 50, retryDelay: () => 0 },
});

describe('waitFor and enqueueAndWait', () => {
  test('enqueueAndWait: the completed task with its result, kept for its waiter although it has no retention', async () => {
    await startServer(async (task, ctx) => ctx.writeResult({ doubled: (task.payload as { n: number }).n * 2 }));
    const done = await client.enqueueAndWait(new Task('double', { n: 21 }), { taskId: 'd1' });
    assert.equal(done.state, 'completed');
    assert.deepEqual(done.result, { doubled: 42 });
    assert.equal(done.retention, 0, "the task's own retention is unchanged");
    const kept = await db.query(
      "SELECT run_at - completed_at AS keep FROM {{schema}}.task_states s JOIN {{schema}}.task_inputs i USING (seq) WHERE i.id = 'd1'",
    );
    assert.equal(kept[0].keep.minutes ?? 0, 1, 'kept 60 s for the waiter');
  });

  test('enqueueAndWait of tasks that complete at once, one after another: each resolves completed (the first look races the completion)', async () => {
    await startServer(async (task, ctx) => ctx.writeResult(task.payload));
    for (let i = 0; i < 40; i++) {
      const done = await client.enqueueAndWait(new Task('echo', i));
      assert.deepEqual([done.state, done.result], ['completed', i]);
    }
  });

  test('waitFor: a task completed earlier with a retention resolves at once; one that fails is TaskFailedError with its last error', async () => {
    await startServer(async (task) => {
      if (task.type === 'fails') throw new SkipRetry('bad input');
    });
    await client.enqueue(new Task('ok', null), { taskId: 'kept', retention: 60_000 });
    await waitFor(async () => (await inspector.getTaskInfo('default', 'kept')).state === 'completed');
    assert.equal((await client.waitFor('default', 'kept')).state, 'completed');
    const err = await client.enqueueAndWait(new Task('fails', null), { taskId: 'f1' }).catch((e: unknown) => e);
    assert.ok(err instanceof TaskFailedError, String(err));
    assert.equal(err.task.state, 'archived');
    assert.equal(err.task.lastError, 'bad input');
  });

  test('a cancelled task that will not run again is TaskCanceledError', async () => {
    const started = deferred();
    await startServer(async (_task, ctx) => {
      started.resolve();
      await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
      throw ctx.signal.reason;
    });
    // Caught at once: it may reject before the assertion below is reached.
    const waiting = client.enqueueAndWait(new Task('long', null), { taskId: 'c1', maxRetry: 0 }).catch((e: unknown) => e);
    await started.promise;
    await waitFor(async () => (await inspector.cancelProcessing('c1')) === 1);
    assert.ok((await waiting) instanceof TaskCanceledError);
  });

  test('a task deleted while waited for, or never there, is TaskNotFoundError; an unknown queue is QueueNotFoundError', async () => {
    await client.enqueue(new Task('later', null), { taskId: 'gone', processIn: 3_600_000 });
    const waiting = client.waitFor('default', 'gone').catch((e: unknown) => e);
    await waitFor(
      async () => (await db.query("SELECT awaited FROM {{schema}}.task_states s JOIN {{schema}}.task_inputs i USING (seq) WHERE i.id = 'gone'"))[0]?.awaited,
    );
    await inspector.deleteTask('default', 'gone');
    assert.ok((await waiting) instanceof TaskNotFoundError);
    await assert.rejects(client.waitFor('default', 'never'), TaskNotFoundError);
    await assert.rejects(client.waitFor('nowhere', 'x'), QueueNotFoundError);
  });

  test('a timeout is WaitTimeoutError, an abort rejects with its reason; the task goes on', async () => {
    await client.enqueue(new Task('later', null), { taskId: 'slow', processIn: 3_600_000 });
    const err = await client.waitFor('default', 'slow', { timeout: 100 }).catch((e: unknown) => e);
    assert.ok(err instanceof WaitTimeoutError, String(err));
    assert.equal(err.timeoutMs, 100);
    const abort = new AbortController();
    const waiting = client.waitFor('default', 'slow', { signal: abort.signal }).catch((e: unknown) => e);
    abort.abort(new Error('no longer needed'));
    assert.match(String(await waiting), /no longer needed/);
    assert.equal((await inspector.getTaskInfo('default', 'slow')).state, 'scheduled');
  });

  test('a waiter in another process resolves when this process completes the task', async () => {
    const go = deferred();
    await startServer(async (_task, ctx) => {
      await go.promise;
      await ctx.writeResult('from the worker');
    });
    await client.enqueue(new Task('remote', null), { taskId: 'r1' });
    const child = spawnFixture('test/fixtures/wait-for.ts', {
      DATABASE_URL: db.connectionString,
      PGASYNQ_SCHEMA: db.schema,
      TASK_QUEUE: 'default',
      TASK_ID: 'r1',
    });
    await child.next('waiting');
    await waitFor(
      async () => (await db.query("SELECT awaited FROM {{schema}}.task_states s JOIN {{schema}}.task_inputs i USING (seq) WHERE i.id = 'r1'"))[0]?.awaited,
    );
    go.resolve();
    assert.deepEqual(await child.next('outcome'), { event: 'outcome', state: 'completed', result: 'from the worker' });
    await exited(child.child);
  });

  test('while nothing happens the wait reads the task no faster than once a second', async () => {
    await client.enqueue(new Task('later', null), { taskId: 'idle', processIn: 3_600_000 });
    const pool = countedPool();
    const watcher = new Client({ pool, schema: db.schema, logger: false });
    try {
      const waiting = watcher.waitFor('default', 'idle', { timeout: 5_000 });
      // The listener is up and the first read marked the task: from here on, only the poll reads.
      await waitFor(
        async () => (await db.query("SELECT awaited FROM {{schema}}.task_states s JOIN {{schema}}.task_inputs i USING (seq) WHERE i.id = 'idle'"))[0]?.awaited,
      );
      const [before, since] = [pool.sent, performance.now()];
      await assert.rejects(waiting, WaitTimeoutError);
      // Each read is a connect and a statement; a slow machine can only read less often.
      const reads = (pool.sent - before) / 2;
      assert.ok(reads <= (performance.now() - since) / 1000 + 1, `${reads} reads in ${Math.round(performance.now() - since)} ms`);
    } finally {
      await watcher.close();
      await pool.end();
    }
  });

  test('enqueueAndWait enqueues its task awaited in the one statement: a row sent with "aw" true is awaited, any other value is not, nor a task archived at once', async () => {
    const enqueue = (rows: object[]) => db.query(`SELECT * FROM {{schema}}.enqueue_tasks($1::json, now(), false)`, [JSON.stringify(rows)]);
    const row = (i: string, more: object = {}) => ({ i, q: 'default', t: 't', m: 0, to: 0, ...more });
    await enqueue([row('aw-true', { aw: true }), row('aw-none'), row('aw-string', { aw: 'yes' }), row('aw-number', { aw: 1 }), row('aw-null', { aw: null })]);
    await enqueue([row('waiting-dep', { aw: true, dp: [['default', 'aw-true']] })]);
    await inspector.archiveTask('default', 'aw-none');
    await enqueue([row('archived-at-once', { aw: true, dp: [['default', 'aw-none']] })]);
    const awaited = await db.query('SELECT i.id, s.state, s.awaited FROM {{schema}}.task_states s JOIN {{schema}}.task_inputs i USING (seq) ORDER BY s.seq');
    assert.deepEqual(
      awaited.map((r: { id: string; state: string; awaited: boolean }) => [r.id, r.state, r.awaited]),
      [
        ['aw-true', 'pending', true],
        ['aw-none', 'archived', false],
        ['aw-string', 'pending', false],
        ['aw-number', 'pending', false],
        ['aw-null', 'pending', false],
        ['waiting-dep', 'waiting', true],
        ['archived-at-once', 'archived', false],
      ],
    );
  });

  test('enqueueAndWait does not read its task before the enqueue returned: a wake while the insert waits on a lock leaves it waiting, and it resolves', async () => {
    await startServer(async () => 'done');
    // Another transaction holds the id, uncommitted: the enqueue waits for it on the unique index.
    const holder = await db.pool.connect();
    try {
      await holder.query('BEGIN');
      await client.enqueue(new Task('held', null), { taskId: 'blocked', tx: holder });
      const waiting = client.enqueueAndWait(new Task('mine', null), { taskId: 'blocked', waitTimeout: 10_000 }).catch((e: unknown) => e);
      // This schema's enqueue, not another test file's (they share the database).
      await waitFor(
        async () =>
          (await db.query(`SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, [`"${db.schema}"."enqueue_tasks"`]))
            .length > 0,
      );
      // A done notification (anyone may send one) wakes the waits while the task is not in:
      // read then, it would be "no such task".
      await db.query(`SELECT pg_notify($1, '0')`, [`${db.schema}_done`]);
      await new Promise((resolve) => setTimeout(resolve, 200));
      await holder.query('ROLLBACK');
      const done = await waiting;
      assert.ok(!(done instanceof Error), String(done));
      assert.equal((done as { state: string }).state, 'completed');
      assert.equal((done as { type: string }).type, 'mine');
    } finally {
      holder.release();
    }
  });

  test('enqueueAndWait: an enqueue refused rejects with its error and leaves no wait; an aborted signal enqueues nothing; replace and dependencies are awaited too', async () => {
    await client.enqueue(new Task('first', null), { taskId: 'taken', processIn: 3_600_000 });
    await assert.rejects(client.enqueueAndWait(new Task('second', null), { taskId: 'taken' }), TaskIdConflictError);
    await assert.rejects(client.enqueueAndWait(new Task('t', null), { dependsOn: [{ queue: 'default', id: 'missing' }] }), TaskNotFoundError);
    const abort = new AbortController();
    abort.abort(new Error('gave up'));
    await assert.rejects(client.enqueueAndWait(new Task('t', null), { taskId: 'never-sent', signal: abort.signal }), /gave up/);
    assert.deepEqual(
      (await db.query('SELECT i.id FROM {{schema}}.task_inputs i ORDER BY seq')).map((r: { id: string }) => r.id),
      ['taken'],
    );
    await startServer(async (task) => task.type);
    const replaced = await client.enqueueAndWait(new Task('replacement', null), { taskId: 'taken', replace: true });
    assert.deepEqual([replaced.state, replaced.type], ['completed', 'replacement']);
    const after = await client.enqueueAndWait(new Task('after', null), { dependsOn: [{ queue: 'default', id: 'taken' }] });
    assert.equal(after.state, 'completed');
  });

  test('bad input: a ValidationError naming the option, nothing enqueued', async () => {
    for (const [opts, field] of [
      [{ timeout: -1 }, 'timeout'],
      [{ timeout: Number.NaN }, 'timeout'],
      [{ signal: 'x' }, 'signal'],
      [{ other: 1 }, 'options.other'],
    ] as const) {
      const err = await client.waitFor('default', 'x', opts as never).catch((e: unknown) => e);
      assert.ok(err instanceof ValidationError && err.field === field, `${JSON.stringify(opts)}: ${String(err)}`);
    }
    await assert.rejects(client.waitFor('', 'x'), ValidationError);
    for (const [opts, field] of [
      [{ tx: {} }, 'tx'],
      [{ waitTimeout: Infinity }, 'waitTimeout'],
      [{ maxRetry: -1 }, 'maxRetry'],
    ] as const) {
      const err = await client.enqueueAndWait(new Task('t', null), opts as never).catch((e: unknown) => e);
      assert.ok(err instanceof ValidationError && err.field === field, `${JSON.stringify(opts)}: ${String(err)}`);
    }
    assert.equal((await db.query('SELECT count(*)::int AS n FROM {{schema}}.tasks'))[0].n, 0);
  });
});
