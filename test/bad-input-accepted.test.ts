/**
 * §6 accepted safely: the inputs near the bad-input table's edges that must
 * work: long schema names end to end, a __proto__ payload, every allowed
 * queue character, payloads exactly at the cap, timeout 0, maxRetry 0, and a
 * garbage NOTIFY on the library's channel.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import * as lib from '../src/index.js';
import { Client, Inspector, MAX_PAYLOAD_BYTES, ServeMux, Server, Task, type TaskInfo } from '../src/index.js';
import { client, db, inspector, MIB, pool, runtimeServer, setupBadInput, stillWorking, taskRow } from './bad-input-kit.js';
import { DATABASE_URL, test, testDb, waitFor } from './helpers.js';

setupBadInput('bad_input_accepted');

describe('§6 accepted safely', () => {
  // Issue #26 finding 11: 56–63 characters broke every enqueue (channel names), ~47 and up the prepared statements (42P05).
  for (const length of [48, 55]) {
    test(`a schema name of ${length} characters works end to end: migrate, enqueue, a Server runs the tasks`, { timeout: 60_000 }, async () => {
      const suffix = process.env.TEST_SCHEMA_SUFFIX ?? '';
      const long = await testDb(`long_${'s'.repeat(length - 5 - suffix.length)}`);
      assert.equal(long.schema.length, length);
      const c = new Client({ connectionString: DATABASE_URL, schema: long.schema, logger: false });
      let ran = 0;
      const server = new Server({
        connectionString: DATABASE_URL,
        schema: long.schema,
        concurrency: 4,
        taskCheckInterval: 50,
        delayedTaskCheckInterval: 50,
        logger: false,
      });
      await server.start(
        new ServeMux().handle('long', () => {
          ran++;
        }),
      );
      try {
        // Kept and deleted on completion, pending and scheduled: the statements whose names, cut at 63 bytes, were one.
        const n = 20;
        await c.enqueueMany(Array.from({ length: n }, (_, i) => new Task('long', i, i % 2 === 0 ? { retention: 60_000 } : {})));
        await c.enqueueMany(Array.from({ length: n }, (_, i) => new Task('long', n + i, { processIn: 100 })));
        await waitFor(() => ran === 2 * n, 30_000, `${2 * n} tasks run`);
        // A handler's return comes before its completion commits: wait for the rows.
        const counts = async () =>
          (
            await long.query<{ completed: number; left: number }>(
              "SELECT count(*) FILTER (WHERE state = 'completed')::int AS completed, count(*) FILTER (WHERE state <> 'completed')::int AS left FROM {{schema}}.tasks",
            )
          )[0];
        await waitFor(async () => (await counts())?.left === 0, 10_000, 'every completion written');
        assert.deepEqual(await counts(), { completed: n / 2, left: 0 });
      } finally {
        await server.shutdown();
        await c.close();
        await long.query(`DROP SCHEMA "${long.schema}" CASCADE`);
        await long.close();
      }
    });
  }

  test('payload {"__proto__":{"polluted":true}}: stored and read back as own data, no pollution', async () => {
    const payload = JSON.parse('{"__proto__":{"polluted":true},"constructor":{"prototype":{"x":1}}}') as Record<string, unknown>;
    const info = await client.enqueue(new Task('proto', payload));
    const read = await inspector.getTaskInfo(info.queue, info.id);
    const p = read.payload as Record<string, unknown>;
    assert.ok(Object.hasOwn(p, '__proto__'), '__proto__ is an own key');
    assert.deepEqual(Object.getOwnPropertyDescriptor(p, '__proto__')?.value, { polluted: true });
    assert.equal(Object.getPrototypeOf(p), Object.prototype, 'the key did not set the prototype');
    assert.equal(({} as Record<string, unknown>).polluted, undefined);
    assert.equal(({} as Record<string, unknown>).x, undefined);
  });

  test('queue name "a:b.c-d_e": every allowed character round-trips', async () => {
    const info = await client.enqueue(new Task('chars'), { queue: 'a:b.c-d_e' });
    assert.equal(info.queue, 'a:b.c-d_e');
    assert.ok((await inspector.queues()).includes('a:b.c-d_e'));
    assert.equal((await inspector.getTaskInfo('a:b.c-d_e', info.id)).queue, 'a:b.c-d_e');
  });

  test('a payload exactly at the cap is accepted (default 1 MiB, and a Client maxPayloadBytes)', async () => {
    const atCap = await client.enqueue(new Task('cap', 'x'.repeat(MAX_PAYLOAD_BYTES - 2))); // with its quotes: exactly 1 MiB
    assert.equal((atCap.payload as string).length, MIB - 2);
    const [stored] = await db.query<{ n: number }>('SELECT octet_length(payload::text)::int AS n FROM {{schema}}.tasks WHERE id = $1', [atCap.id]);
    assert.equal(stored?.n, MIB);
    const small = new Client({ pool, schema: db.schema, maxPayloadBytes: 100 });
    assert.equal(((await small.enqueue(new Task('cap', 'x'.repeat(98)))).payload as string).length, 98);
    assert.equal(((await small.enqueue(new Task('cap', new Uint8Array(100)))).payload as Buffer).length, 100);
    // A Client with a larger cap takes what the default refuses.
    const big = new Client({ pool, schema: db.schema, maxPayloadBytes: 2 * MIB });
    assert.equal(((await big.enqueue(new Task('cap', 'x'.repeat(MIB)))).payload as string).length, MIB);
  });

  test('the Inspector applies its maxPayloadBytes to updateTaskPayload, before any SQL', async () => {
    const info = await client.enqueue(new Task('upd', { a: 1 }), { processIn: 3_600_000 });
    const small = new Inspector({ pool, schema: db.schema, maxPayloadBytes: 10 });
    const sentBefore = pool.sent;
    await assert.rejects(
      small.updateTaskPayload(info.queue, info.id, 'x'.repeat(20)),
      (err: unknown) =>
        err instanceof lib.PayloadTooLargeError && /^payload is 22 bytes as JSON; the limit is 10 \(option maxPayloadBytes\)$/.test(err.message),
    );
    assert.equal(pool.sent, sentBefore);
    await small.updateTaskPayload(info.queue, info.id, 'x'.repeat(8));
    assert.equal((await inspector.getTaskInfo(info.queue, info.id)).payload, 'x'.repeat(8));
  });

  test('timeout: 0 is accepted and means "not set" (EnqueueOptions.timeout), the 30 min default', async () => {
    const info = await client.enqueue(new Task('t0'), { timeout: 0 });
    assert.equal(info.timeout, 30 * 60_000);
  });

  test('maxRetry: 0 runs once, then archives', { timeout: 30_000 }, async () => {
    const { client: c } = await runtimeServer();
    const info: TaskInfo = await c.enqueue(new Task('throw:string'), { maxRetry: 0 });
    const r = await waitFor(async () => {
      const row = await taskRow(info.id);
      return row?.state === 'archived' ? row : undefined;
    });
    assert.equal(r.retried, 0);
    assert.equal(r.error_msg, 'non-Error thrown: "boom"');
  });

  test('a 7,999-byte garbage NOTIFY on our channel is only a hint (SEC6 floods it)', { timeout: 30_000 }, async () => {
    await runtimeServer();
    const garbage = Array.from({ length: 7999 }, (_, i) => String.fromCharCode(33 + ((i * 7919) % 90))).join('');
    await db.pool.query('SELECT pg_notify($1, $2)', [`${db.schema}_tasks`, garbage]);
    await db.pool.query('SELECT pg_notify($1, $2)', [`${db.schema}_tasks`, '']);
    await stillWorking();
  });
});
