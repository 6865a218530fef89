/**
 * pgasynq/testing: the test database (a fresh schema on DATABASE_URL, or an
 * embedded PostgreSQL), runTask() without a server, drain() and
 * waitForTask(), and the enqueue assertions, each with its bad inputs.
 */
import assert, { AssertionError } from 'node:assert/strict';
import { after, before, beforeEach, describe } from 'node:test';
import pg from 'pg';
import { sql } from 'kysely';
import {
  ConfigError,
  FailedPreconditionError,
  InvalidOptionError,
  InvalidTaskTypeError,
  RevokeTask,
  ServeMux,
  SkipRetry,
  Snooze,
  Task,
  TaskNotFoundError,
  ValidationError,
  WaitTimeoutError,
} from '../src/index.js';
import {
  createTestDatabase,
  drain,
  DrainTimeoutError,
  payloadMatches,
  requireEnqueued,
  requireNotEnqueued,
  runTask,
  waitForTask,
  type TestDatabase,
} from '../src/testing/index.js';
import { caught, DATABASE_URL, test } from './helpers.js';

const SCHEMA = `t_testing_kit${process.env.TEST_SCHEMA_SUFFIX ?? ''}`;

async function schemaExists(schema: string): Promise<boolean> {
  const c = new pg.Client({ connectionString: DATABASE_URL });
  await c.connect();
  try {
    return (await c.query('SELECT 1 FROM pg_namespace WHERE nspname = $1', [schema])).rowCount === 1;
  } finally {
    await c.end();
  }
}

describe('createTestDatabase', () => {
  test('on DATABASE_URL: a fresh migrated schema, a pool and Kysely for your tables, reset(), and close() drops the schema', async () => {
    const t = await createTestDatabase({ connectionString: DATABASE_URL });
    try {
      assert.match(t.schema, /^pgasynq_test_[0-9a-f]{8}$/);
      assert.equal(await schemaExists(t.schema), true);
      // The application's own table, in a schema of the test's, through the pool and through Kysely.
      const app = `${t.schema}_app`;
      await t.pool.query(`CREATE SCHEMA "${app}"; CREATE TABLE "${app}".users (id int PRIMARY KEY, name text)`);
      await t.kysely.withSchema(app).insertInto('users').values({ id: 1, name: 'ada' }).execute();
      assert.deepEqual(await t.kysely.withSchema(app).selectFrom('users').selectAll().execute(), [{ id: 1, name: 'ada' }]);
      const client = t.client();
      await client.enqueue(new Task('t', { n: 1 }), { queue: 'kit' });
      const inspector = t.inspector();
      await inspector.pauseQueue('kit');
      assert.equal((await inspector.getQueueInfo('kit')).pending, 1);
      await t.reset();
      assert.deepEqual(await inspector.queues(), [], 'tasks and queues are gone');
      // Still migrated: a new task goes in.
      await client.enqueue(new Task('t', null), { queue: 'kit' });
      assert.equal((await inspector.getQueueInfo('kit')).paused, false);
      await t.pool.query(`DROP SCHEMA "${app}" CASCADE`);
    } finally {
      await t.close();
    }
    assert.equal(await schemaExists(t.schema), false);
  });

  test('without DATABASE_URL: an embedded PostgreSQL of its own, removed at close()', { timeout: 120_000 }, async () => {
    const saved = process.env.DATABASE_URL;
    delete process.env.DATABASE_URL;
    let t: TestDatabase;
    try {
      t = await createTestDatabase();
    } finally {
      if (saved !== undefined) process.env.DATABASE_URL = saved;
    }
    try {
      assert.notEqual(new URL(t.connectionString).port, new URL(process.env.DATABASE_URL ?? DATABASE_URL).port, 'a server of its own');
      assert.equal(t.schema.startsWith('pgasynq_test_'), true);
      await t.client().enqueue(new Task('t', null), { taskId: 'e1' });
      assert.deepEqual(await drain(t, () => {}), { runs: 1, errors: 0 });
    } finally {
      await t.close();
    }
    // Kysely never ran a statement here, so it did not end the pool: close() did (an idle
    // connection left open kept a test file's process alive 10 s).
    assert.equal(t.pool.ended, true);
    // The server is gone: nothing answers on its port.
    const c = new pg.Client({ connectionString: t.connectionString, connectionTimeoutMillis: 2000 });
    await assert.rejects(c.connect());
  });

  test('bad options: a ValidationError naming the option, and nothing made', async () => {
    for (const [opts, field] of [
      [{ schema: 'bad name' }, 'schema'],
      [{ schema: '' }, 'schema'],
      [{ connectionString: '' }, 'connectionString'],
      [{ connectionString: 42 }, 'connectionString'],
      [{ shcema: 'x' }, 'options.shcema'],
    ] as const) {
      const err = await caught(() => createTestDatabase(opts as never));
      assert.ok(err instanceof ValidationError, `${JSON.stringify(opts)}: ${String(err)}`);
      assert.equal(err.field, field);
    }
    const err = await caught(() => createTestDatabase(null as never));
    assert.ok(err instanceof ConfigError);
  });
});

describe('runTask', () => {
  test('a completed run: its result, progress, lines and logger calls as the handler wrote them', async () => {
    const run = await runTask(
      async (task, ctx) => {
        ctx.log('starting');
        await ctx.progress(50);
        await ctx.progress({ done: 1, total: 2 });
        ctx.logger.child({ step: 'send' }).info({ to: task.payload.to }, 'sent');
        await ctx.writeResult({ ok: true, id: ctx.taskId, attempt: ctx.attempt, queue: ctx.queue });
        ctx.log('x'.repeat(10_000));
      },
      new Task('email', { to: 'a@example.com' }),
      { taskId: 'e-1', queue: 'mail' },
    );
    assert.equal(run.outcome, 'completed');
    assert.equal(run.next, 'completed');
    assert.equal(run.error, undefined);
    assert.deepEqual(run.result, { ok: true, id: 'e-1', attempt: 1, queue: 'mail' });
    assert.deepEqual(run.progress, [50, { done: 1, total: 2 }]);
    assert.equal(run.logs[0], 'starting');
    assert.equal(run.logs[1]!.length, 4096, 'a long line is cut as a server cuts it');
    assert.deepEqual(run.logged, [{ level: 'info', fields: { step: 'send', to: 'a@example.com' }, msg: 'sent' }]);
    assert.equal(run.transactions, 0);
  });

  test('what a server does with each ending: retry, archive, snooze, revoke', async () => {
    const fail = () => {
      throw new Error('boom');
    };
    const first = await runTask(fail, new Task('t', null));
    assert.deepEqual([first.outcome, first.next, first.error?.message], ['failed', 'retry', 'boom']);
    const last = await runTask(fail, new Task('t', null, { maxRetry: 2 }), { retryCount: 2 });
    assert.deepEqual([last.outcome, last.next], ['failed', 'archived']);
    const skip = await runTask(() => Promise.reject(new SkipRetry('bad input')), new Task('t', null));
    assert.deepEqual([skip.outcome, skip.next], ['failed', 'archived']);
    const snooze = await runTask(
      () => {
        throw new Error('wrapped', { cause: new Snooze(5_000) });
      },
      new Task('t', null),
    );
    assert.deepEqual([snooze.outcome, snooze.next, snooze.snoozeMs], ['snoozed', 'scheduled', 5_000]);
    const revoked = await runTask(
      () => {
        throw new RevokeTask();
      },
      new Task('t', null),
    );
    assert.deepEqual([revoked.outcome, revoked.next], ['completed', 'revoked']);
    const thrownString = await runTask(
      () => {
        throw 'plain';
      },
      new Task('t', null),
    );
    assert.ok(thrownString.error instanceof Error);
  });

  test('a timeout and a cancellation end the run as a server ends it, whether or not the handler heeds the signal', async () => {
    let aborted: unknown;
    const timedOut = await runTask(
      async (_task, ctx) => {
        ctx.signal.addEventListener('abort', () => (aborted = ctx.signal.reason));
        await new Promise(() => {});
      },
      new Task('t', null, { timeout: 50 }),
    );
    assert.deepEqual([timedOut.outcome, timedOut.next, timedOut.error?.name], ['timeout', 'retry', 'TaskTimeoutError']);
    assert.equal((aborted as Error).name, 'TaskTimeoutError');
    const controller = new AbortController();
    const canceled = runTask(async () => new Promise(() => {}), new Task('t', null), { signal: controller.signal });
    controller.abort();
    assert.deepEqual([(await canceled).outcome, (await canceled).error?.name], ['canceled', 'TaskCanceledError']);
    // After the abort, the context writes nothing more, as a server's does.
    let late: unknown;
    await runTask(
      async (_task, ctx) => {
        await new Promise((r) => ctx.signal.addEventListener('abort', r));
        late = await caught(() => ctx.progress(10));
      },
      new Task('t', null),
      { timeout: 10 },
    );
    await new Promise((r) => setTimeout(r, 20));
    assert.equal((late as Error).name, 'TaskTimeoutError');
  });

  test('ctx.transaction commits on options.db; without one it is a ConfigError naming db', async () => {
    const t = await createTestDatabase({ connectionString: DATABASE_URL, schema: `${SCHEMA}_tx` });
    try {
      await t.pool.query(`CREATE TABLE "${t.schema}".sent (id text PRIMARY KEY)`);
      const handler = async (_task: Task, ctx: Parameters<Parameters<typeof runTask>[0]>[1]) => {
        await ctx.transaction((trx) => trx.withSchema(t.schema).insertInto('sent').values({ id: ctx.taskId }).execute());
      };
      const run = await runTask(handler, new Task('t', null), { db: t.kysely, taskId: 's1' });
      assert.equal(run.outcome, 'completed');
      assert.equal(run.transactions, 1);
      assert.deepEqual((await t.pool.query(`SELECT id FROM "${t.schema}".sent`)).rows, [{ id: 's1' }]);
      const without = await runTask(handler, new Task('t', null));
      assert.equal(without.outcome, 'failed');
      assert.ok(without.error instanceof ConfigError);
      assert.equal(without.error.field, 'db');
      // As on a server: writeResult inside the transaction is refused, and the transaction rolls back.
      const inside = await runTask(
        async (_task, ctx) => {
          await ctx.transaction(async (trx) => {
            await trx.withSchema(t.schema).insertInto('sent').values({ id: ctx.taskId }).execute();
            await ctx.writeResult(1);
          });
        },
        new Task('t', null),
        { db: t.kysely, taskId: 's2' },
      );
      assert.ok(inside.error instanceof FailedPreconditionError && /inside ctx.transaction/.test(inside.error.message));
      assert.equal(inside.transactions, 0);
      assert.equal(inside.result, undefined);
      assert.deepEqual((await t.pool.query(`SELECT id FROM "${t.schema}".sent`)).rows, [{ id: 's1' }]);
    } finally {
      await t.close();
    }
  });

  test("bad values inside the handler fail as a server's context fails them; bad options throw before the handler runs", async () => {
    const run = await runTask(
      async (_task, ctx) => {
        await ctx.progress(101);
      },
      new Task('t', null),
    );
    assert.ok(run.error instanceof ValidationError);
    assert.equal(run.error.field, 'progress');
    assert.deepEqual(run.progress, []);
    const log = await runTask((_task, ctx) => ctx.log(42 as never), new Task('t', null));
    assert.ok(log.error instanceof ValidationError);
    let ran = false;
    const handler = () => {
      ran = true;
    };
    for (const [args, field] of [
      [[handler, new Task('t', null), { retryCount: -1 }], 'retryCount'],
      [[handler, new Task('t', null), { maxRetry: 1.5 }], 'maxRetry'],
      [[handler, new Task('t', null), { timeout: -1 }], 'timeout'],
      [[handler, new Task('t', null), { queue: 'a b' }], 'queue'],
      [[handler, new Task('t', null), { taskId: '' }], 'taskId'],
      [[handler, new Task('t', null), { signal: {} }], 'signal'],
      [[handler, new Task('t', null), { db: {} }], 'db'],
      [[handler, new Task('t', null), { dependencyResults: 3 }], 'dependencyResults'],
      [[handler, new Task('t', null), { retries: 1 }], 'options.retries'],
      [[handler, { type: 't' }], 'task'],
      [['nope', new Task('t', null)], 'handler'],
    ] as const) {
      const err = await caught(() => runTask(...(args as unknown as Parameters<typeof runTask>)));
      assert.ok(err instanceof ValidationError, `${field}: ${String(err)}`);
      assert.equal(err.field, field);
    }
    assert.equal(ran, false);
    const deps = await runTask(async (_task, ctx) => ctx.writeResult(Object.fromEntries(await ctx.dependencyResults())), new Task('t', null), {
      dependencyResults: { 'q/a': 1 },
    });
    assert.deepEqual(deps.result, { 'q/a': 1 });
  });
});

describe('drain, waitForTask and the enqueue assertions', () => {
  let t: TestDatabase;
  before(async () => {
    t = await createTestDatabase({ connectionString: DATABASE_URL, schema: SCHEMA });
  });
  beforeEach(() => t.reset());
  after(() => t.close());

  test('drain runs every task that can run now, retries and follow-ups included, then stops its server', async () => {
    const client = t.client();
    await client.enqueueMany([
      new Task('ok', { n: 1 }, { queue: 'a' }),
      new Task('ok', { n: 2 }, { queue: 'b' }),
      new Task('flaky', null, { queue: 'a', taskId: 'flaky', retention: 60_000 }),
      new Task('later', null, { queue: 'a', processIn: 3_600_000 }),
    ]);
    let flaky = 0;
    const mux = new ServeMux();
    mux.handle('ok', async (task) => {
      if ((task.payload as { n: number }).n === 1) await client.enqueue(new Task('ok', { n: 3 }, { queue: 'b' }));
    });
    mux.handle('flaky', () => {
      if (flaky++ === 0) throw new Error('once');
    });
    const result = await drain(t, mux, { server: { retryDelay: () => 0 } });
    assert.deepEqual(result, { runs: 5, errors: 1 });
    const inspector = t.inspector();
    assert.equal((await inspector.getTaskInfo('a', 'flaky')).state, 'completed');
    assert.equal((await inspector.getQueueInfo('a')).scheduled, 1, 'a task due later is not work left');
    assert.equal((await inspector.getQueueInfo('b')).pending, 0);
    // Nothing to do: resolves at once.
    assert.deepEqual(await drain(t, mux, { queues: ['b'] }), { runs: 0, errors: 0 });
  });

  test("drain's timeout: DrainTimeoutError with the tasks left; bad options name the field", async () => {
    await t.client().enqueue(new Task('stuck', null), { queue: 'c' });
    const err = await caught(() => drain(t, () => new Promise(() => {}), { timeout: 300, server: { shutdownTimeout: 100 } }));
    assert.ok(err instanceof DrainTimeoutError, String(err));
    assert.equal(err.remaining, 1);
    for (const [opts, field] of [
      [{ timeout: -1 }, 'timeout'],
      [{ queues: [] }, 'queues'],
      [{ queues: ['ok', 'a b'] }, 'queues[1]'],
      [{ server: 3 }, 'server'],
      [{ wait: 1 }, 'options.wait'],
    ] as const) {
      const e = await caught(() => drain(t, () => {}, opts as never));
      assert.ok(e instanceof ValidationError, `${field}: ${String(e)}`);
      assert.equal(e.field, field);
    }
    const e = await caught(() => drain(t, 'handler' as never));
    assert.ok(e instanceof InvalidOptionError);
    assert.equal(e.field, 'handler');
  });

  test('waitForTask resolves with the finished task, completed or archived; unknown tasks and timeouts reject', async () => {
    const client = t.client();
    await client.enqueue(new Task('done', null), { taskId: 'w1', retention: 60_000 });
    await client.enqueue(new Task('bad', null), { taskId: 'w2' });
    await client.enqueue(new Task('slow', null), { taskId: 'w3', processIn: 3_600_000 });
    const mux = new ServeMux();
    mux.handle('done', () => {});
    mux.handle('bad', () => {
      throw new SkipRetry('no');
    });
    const server = t.server({ logger: false });
    await server.start(mux);
    const [done, bad] = await Promise.all([waitForTask(t, 'default', 'w1'), waitForTask(t, 'default', 'w2')]);
    assert.equal(done.state, 'completed');
    assert.equal(bad.state, 'archived');
    assert.match(bad.lastError ?? '', /no/);
    assert.ok((await caught(() => waitForTask(t, 'default', 'nope', { timeout: 2_000 }))) instanceof TaskNotFoundError);
    assert.ok((await caught(() => waitForTask(t, 'default', 'w3', { timeout: 100 }))) instanceof WaitTimeoutError);
    const e = await caught(() => waitForTask(t, 'default', 'w1', { timeout: -5 }));
    assert.ok(e instanceof ValidationError);
    assert.equal(e.field, 'timeout');
  });

  test('requireEnqueued and requireNotEnqueued: by type, payload subset, queue, state and count; failures are AssertionErrors that list what was enqueued', async () => {
    const client = t.client();
    await client.enqueue(new Task('email:welcome', { userId: 1, address: { city: 'Oslo', zip: '0150' }, tags: ['a'] }));
    await client.enqueue(new Task('email:welcome', { userId: 2 }), { queue: 'mail', processIn: 60_000 });
    const [one] = await requireEnqueued(t, 'email:welcome', { payload: { userId: 1, address: { city: 'Oslo' } } });
    assert.equal(one!.queue, 'default');
    assert.equal((await requireEnqueued(t, 'email:welcome', { count: 2 })).length, 2);
    assert.deepEqual((await requireEnqueued(t, 'email:welcome', { queue: 'mail', state: 'scheduled' }))[0]!.payload, { userId: 2 });
    await requireNotEnqueued(t, 'email:welcome', { payload: { userId: 3 } });
    await requireNotEnqueued(t, 'email:goodbye');
    const none = await caught(() => requireEnqueued(t, 'email:welcome', { payload: { userId: 1, tags: [] } }));
    assert.ok(none instanceof AssertionError);
    assert.match(none.message, /^expected at least one task of type "email:welcome" with a matching payload, found 0; of that type: \[/);
    assert.match(none.message, /"userId":2/);
    const count = await caught(() => requireEnqueued(t, 'email:welcome', { count: 1 }));
    assert.ok(count instanceof AssertionError);
    const some = await caught(() => requireNotEnqueued(t, 'email:welcome', { queue: 'mail' }));
    assert.ok(some instanceof AssertionError);
    assert.match(some.message, /found 1/);
    // Bad inputs name the field.
    assert.ok((await caught(() => requireEnqueued(t, 'bad\ntype'))) instanceof InvalidTaskTypeError);
    for (const [match, field] of [
      [{ state: 'done' }, 'match.state'],
      [{ count: -1 }, 'match.count'],
      [{ queue: 'a b' }, 'match.queue'],
      [{ payloads: 1 }, 'match.payloads'],
    ] as const) {
      const e = await caught(() => requireEnqueued(t, 'x', match as never));
      assert.ok(e instanceof ValidationError, `${field}: ${String(e)}`);
      assert.equal(e.field, field);
    }
    const e = await caught(() => requireNotEnqueued(t, 'x', { count: 1 } as never));
    assert.ok(e instanceof ValidationError);
  });

  test('payloadMatches: a subset of keys, nested; arrays, bytes and other values whole', () => {
    assert.equal(payloadMatches({ a: 1, b: { c: 2, d: 3 } }, { b: { c: 2 } }), true);
    assert.equal(payloadMatches({ a: [1, 2] }, { a: [1] }), false);
    assert.equal(payloadMatches({ a: null }, { a: null }), true);
    assert.equal(payloadMatches({}, { a: undefined }), false);
    assert.equal(payloadMatches('x', 'x'), true);
    assert.equal(payloadMatches(null, {}), false);
    assert.equal(payloadMatches(Buffer.from('ab'), Buffer.from('ab')), true);
  });

  test('the kit on a Kysely instance of yours: sql runs on the same database as the tasks', async () => {
    const { rows } = await sql<{ n: number }>`SELECT count(*)::int AS n FROM ${sql.table(`${t.schema}.tasks`)}`.execute(t.kysely);
    assert.deepEqual(rows, [{ n: 0 }]);
  });
});
