/**
 * The Server: what becomes of a task after its handler ran (success,
 * retention, failure and retries, archive, SkipRetry, RevokeTask, isFailure,
 * errorHandler, a missing handler) and asynq's retry delay.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import {
  HandlerNotFoundError,
  RevokeTask,
  ServeMux,
  SkipRetry,
  Task,
  defaultRetryDelay,
  type EnqueueOptions,
  type ServerConfig,
  type TaskContext,
} from '../src/index.js';
import { deferred, test, waitFor } from './helpers.js';
import { serverFile } from './shared.js';

const { db, client, startServer, reset, taskRow, taskIn } = serverFile('t_server_outcomes');

/** A handler that records each attempt's retry count in `attempts`, then throws `error(retryCount)`. */
const failing = (attempts: number[], error: (retryCount: number) => Error) => (_t: Task, ctx: TaskContext) => {
  attempts.push(ctx.retryCount);
  throw error(ctx.retryCount);
};

/** Enqueues a task of `type` (with `opts`), starts a server with `handler` and `config`, and returns the task's row once it waits for a retry. */
async function retried(
  type: string,
  handler: Parameters<typeof startServer>[0],
  config: ServerConfig = { retryDelay: () => 3_600_000 },
  opts: EnqueueOptions = {},
) {
  await reset();
  const info = await client.enqueue(new Task(type), opts);
  await startServer(handler, config);
  return taskIn(info.id, 'retry');
}

describe('outcomes', () => {
  test('success deletes the row and releases the unique lock', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('ok', { a: 1 }), { unique: 60_000 });
    const seen = deferred<unknown>();
    const server = await startServer((task) => seen.resolve(task.payload));
    assert.deepEqual(await seen.promise, { a: 1 });
    await waitFor(async () => (await taskRow(info.id)) === undefined, 5000, 'row deleted');
    assert.equal((await db.query('SELECT * FROM {{schema}}.unique_locks')).length, 0);
    await server.shutdown();
  });

  test('success with retention keeps the task completed, with its result', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('keep'), { retention: 60_000 });
    const server = await startServer(async (_t, ctx) => ctx.writeResult({ answer: 42 }));
    const row = await taskIn(info.id, 'completed');
    assert.deepEqual(row.result, { answer: 42 });
    assert.ok(row.completed_at instanceof Date);
    assert.equal(row.lease_token, null);
    const [{ secs }] = await db.query('SELECT extract(epoch FROM run_at - completed_at)::int AS secs FROM {{schema}}.tasks WHERE id = $1', [info.id]);
    assert.equal(secs, 60, 'kept until completed_at + retention');
    await server.shutdown();
  });

  test('failure retries with retried + 1, the error and the retry delay', { timeout: 30_000 }, async () => {
    const seen: number[] = [];
    const row = await retried(
      'boom',
      failing(seen, () => new Error('kaput')),
      { retryDelay: (n) => (n === 0 ? 3_600_000 : 0) },
      { maxRetry: 3 },
    );
    assert.equal(row.retried, 1);
    assert.equal(row.error_msg, 'kaput');
    assert.ok(row.last_failed_at instanceof Date);
    const [{ mins }] = await db.query('SELECT round(extract(epoch FROM run_at - now()) / 60)::int AS mins FROM {{schema}}.tasks WHERE id = $1', [row.id]);
    assert.equal(mins, 60);
    assert.deepEqual(seen, [0]);
  });

  test('retries run again once due, and the task is archived when retried reaches maxRetry', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('always-fails'), { maxRetry: 2 });
    const attempts: number[] = [];
    const server = await startServer(
      failing(attempts, (n) => new Error(`attempt ${n}`)),
      { retryDelay: () => 0 },
    );
    const row = await taskIn(info.id, 'archived');
    assert.deepEqual(attempts, [0, 1, 2], 'maxRetry 2 runs the task 3 times');
    assert.equal(row.retried, 2);
    assert.equal(row.error_msg, 'attempt 2');
    await server.shutdown();
    const [stats] = await db.query('SELECT processed::int, failed::int FROM {{schema}}.daily_stats WHERE queue = $1', ['default']);
    assert.deepEqual(stats, { processed: 3, failed: 3 });
  });

  test('maxRetry 0 runs once, then archives', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('once'), { maxRetry: 0 });
    let runs = 0;
    const server = await startServer(() => {
      runs++;
      throw new Error('no');
    });
    await waitFor(async () => (await taskRow(info.id))?.state === 'archived');
    assert.equal(runs, 1);
    await server.shutdown();
  });

  test('SkipRetry archives at once, also when found on the cause chain', { timeout: 30_000 }, async () => {
    await reset();
    const a = await client.enqueue(new Task('skip'));
    const b = await client.enqueue(new Task('skip-wrapped'));
    const server = await startServer((t) => {
      if (t.type === 'skip') throw new SkipRetry('bad input');
      throw new Error('wrapper', { cause: new SkipRetry() });
    });
    await waitFor(async () => (await taskRow(a.id))?.state === 'archived' && (await taskRow(b.id))?.state === 'archived');
    assert.equal((await taskRow(a.id)).retried, 0);
    assert.equal((await taskRow(a.id)).error_msg, 'bad input');
    await server.shutdown();
  });

  test('RevokeTask deletes the task, even with retention', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('revoke'), { retention: 60_000 });
    const ran = deferred();
    const server = await startServer(() => {
      ran.resolve();
      throw new RevokeTask();
    });
    await ran.promise;
    await waitFor(async () => (await taskRow(info.id)) === undefined);
    await server.shutdown();
  });

  test('an error isFailure rejects retries without using a retry', { timeout: 30_000 }, async () => {
    await reset();
    const info = await client.enqueue(new Task('transient'), { maxRetry: 1 });
    const server = await startServer(
      () => {
        throw new Error('rate limited');
      },
      { isFailure: (err) => err.message !== 'rate limited', retryDelay: () => 3_600_000 },
    );
    const row = await taskIn(info.id, 'retry');
    assert.equal(row.retried, 0);
    await server.shutdown();
    assert.equal((await db.query('SELECT * FROM {{schema}}.daily_stats')).length, 0, 'not counted as processed or failed');
  });

  test('errorHandler sees every failed attempt', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueue(new Task('err'), { maxRetry: 0 });
    const seen = deferred<[string, string]>();
    const server = await startServer(
      () => {
        throw new Error('handler said no');
      },
      { errorHandler: (err, task) => seen.resolve([err.message, task.type]) },
    );
    assert.deepEqual(await seen.promise, ['handler said no', 'err']);
    await server.shutdown();
  });

  test('a task with no handler fails like asynq NotFound and is retried', { timeout: 30_000 }, async () => {
    const row = await retried(
      'nobody:handles',
      new ServeMux().handle('email:', () => {}),
    );
    assert.equal(row.error_msg, new HandlerNotFoundError('nobody:handles').message);
    assert.equal(row.error_msg, 'handler not found for task "nobody:handles"');
  });

  test('a non-Error thrown is retried with its text', { timeout: 30_000 }, async () => {
    const row = await retried('throws-string', () => {
      throw 'boom';
    });
    assert.equal(row.error_msg, 'non-Error thrown: "boom"');
  });

  test('a retryDelay returning NaN falls back to the default delay', { timeout: 30_000 }, async () => {
    const row = await retried(
      'nan-delay',
      () => {
        throw new Error('x');
      },
      { retryDelay: () => Number.NaN },
    );
    const [{ secs }] = await db.query('SELECT extract(epoch FROM run_at - last_failed_at)::float8 AS secs FROM {{schema}}.tasks WHERE id = $1', [row.id]);
    assert.ok(secs >= 15 && secs < 45, `default delay for n = 0 is 15–44 s, got ${secs}`);
  });
});

describe('retry delay', () => {
  test("asynq's formula n^4 + 15 + rand(30)·(n + 1) seconds", { timeout: 30_000 }, () => {
    assert.equal(
      defaultRetryDelay(0, () => 0),
      15_000,
    );
    assert.equal(
      defaultRetryDelay(0, () => 0.999),
      44_000,
    );
    assert.equal(
      defaultRetryDelay(1, () => 0.5),
      (1 + 15 + 15 * 2) * 1000,
    );
    assert.equal(
      defaultRetryDelay(5, () => 0),
      (625 + 15) * 1000,
    );
    assert.equal(
      defaultRetryDelay(10, () => 0.999),
      (10_000 + 15 + 29 * 11) * 1000,
    );
  });
});
