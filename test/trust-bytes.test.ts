/**
 * Large values a producer can store must not break a worker or a page
 * (issue #26, findings 5 and 3): the recoverer reads payloads and headers only
 * for a retryDelay of the user's, and then in batches bounded by bytes; a
 * claim brings at most MAX_CLAIM_BYTES of them; the dashboard's task page
 * reads a bounded excerpt, and with hidePayloads none; an active state row
 * without inputs is recovered, and a pending one is never claimed.
 * The large rows are written as the owner in SQL (repeat() in PostgreSQL),
 * so the test process never holds them.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import pg from 'pg';
import { Inspector, Server, Task, createDashboard } from '../src/index.js';
import { Db } from '../src/broker/db.js';
import { claim } from './broker-helpers.js';
import { exited, setupDb, spawnFixture, test, waitFor } from './helpers.js';

const { db, client } = setupDb('trust_bytes');
const MB = 1_000_000;

/** Plants, as the owner, `n` active tasks of `queue` whose lease expired an hour ago, each with `headerBytes` of headers. */
async function plantExpired(queue: string, n: number, headerBytes: number): Promise<void> {
  await db.query(
    `WITH i AS (
       INSERT INTO {{schema}}.task_inputs (queue, id, type, payload, headers, max_retry)
       SELECT $1, 'big-' || g, 'big', '{"n":1}', jsonb_build_object('h', repeat('x', $2::int)), 5 FROM generate_series(1, $3::int) g
       RETURNING seq, queue)
     INSERT INTO {{schema}}.task_states (seq, queue, state, lease_owner, lease_token, lease_expires_at, started_at)
     SELECT seq, queue, 'active', 'gone', gen_random_uuid(), now() - interval '1 hour', now() - interval '2 hours' FROM i`,
    [queue, headerBytes, n],
  );
  await db.query(`INSERT INTO {{schema}}.queues (name) VALUES ($1) ON CONFLICT DO NOTHING`, [queue]);
}

describe('the recoverer under a small heap', () => {
  for (const custom of [false, true]) {
    test(
      `a worker of another queue (${custom ? 'a retryDelay of its own' : 'the default retryDelay'}) recovers ${custom ? '8 tasks with 20' : '3 tasks with 60'} MB headers and stays up`,
      { timeout: 120_000 },
      async () => {
        await db.query('DELETE FROM {{schema}}.task_states');
        await db.query('DELETE FROM {{schema}}.task_inputs');
        // A retryDelay of the user's is handed each task whole (headers as a string, and parsed):
        // 8 of 20 MB, so that 128 MB holds one at a time with room to spare, never the eight
        // the recoverer used to load at once. The default retryDelay needs none of them loaded.
        const [n, size] = custom ? [8, 20] : [3, 60];
        await plantExpired('big', n, size * MB);
        const worker = spawnFixture('test/fixtures/bytes-worker.ts', {
          DATABASE_URL: db.connectionString,
          SCHEMA: db.schema,
          QUEUE: 'other',
          RETRY_DELAY: custom ? '1' : '',
          NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --max-old-space-size=128`,
        });
        // An out-of-memory abort ends the process by SIGABRT (a shell shows exit 134).
        const died = exited(worker.child).then(() => worker.child.exitCode ?? worker.child.signalCode);
        try {
          await Promise.race([worker.next('ready'), died.then((code) => assert.fail(`the worker exited (${code}) before it was ready`))]);
          const recovered = async () =>
            (await db.query(`SELECT count(*)::int AS n FROM {{schema}}.task_states WHERE state = 'retry' AND error_msg = 'task lease expired'`))[0].n === n;
          await Promise.race([waitFor(recovered, 60_000, 'the tasks recovered'), died.then((code) => assert.fail(`the worker died (exit ${code})`))]);
          assert.deepEqual([worker.child.exitCode, worker.child.signalCode], [null, null], 'the worker is still running');
          const calls = worker.events.filter((e) => e.event === 'retryDelay');
          assert.equal(calls.length, custom ? n : 0, 'the retryDelay was handed each task (and the default needs none)');
          if (custom) {
            const after = await db.query(`SELECT extract(epoch FROM run_at - last_failed_at)::float8 AS s FROM {{schema}}.task_states`);
            for (const r of after) assert.ok(Math.abs(r.s - 60) < 1, 'the delay the retryDelay gave');
          }
        } finally {
          worker.child.kill('SIGKILL');
          await died;
        }
      },
    );
  }
});

describe('claims bounded by bytes', () => {
  test('a claim of 10 tasks of 20 MB stops at 64 MiB, and a server runs them all', { timeout: 120_000 }, async () => {
    await db.query('DELETE FROM {{schema}}.task_states');
    await db.query('DELETE FROM {{schema}}.task_inputs');
    for (let i = 0; i < 10; i++) await client.enqueue(new Task('large', { i }), { queue: 'large', taskId: `large-${i}` });
    // 20 MB of JSON each, written in PostgreSQL (the Client's cap is 1 MiB).
    await db.query(`UPDATE {{schema}}.task_inputs SET payload = jsonb_build_object('blob', repeat('y', $1::int), 'i', payload->'i') WHERE queue = 'large'`, [
      20 * MB,
    ]);
    const broker = new Db({ connectionString: db.connectionString, schema: db.schema }, 'test');
    try {
      const rows = await claim(broker, ['large'], 10, 'test-claimer', 30_000);
      assert.equal(rows.length, 3, '3 × 20 MB fit in 64 MiB, a fourth would not');
      assert.deepEqual(
        rows.map((r) => (r.payload as { i: number }).i),
        [0, 1, 2],
        'the first ones, in order',
      );
      const states = await db.query(`SELECT state, count(*)::int AS n FROM {{schema}}.task_states GROUP BY state ORDER BY state`);
      assert.deepEqual(states, [
        { state: 'active', n: 3 },
        { state: 'pending', n: 7 },
      ]);
      await db.query(
        `UPDATE {{schema}}.task_states SET state = 'archived', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, run_at = now() WHERE state = 'active'`,
      );
    } finally {
      await broker.close();
    }
    const seen = new Set<number>();
    const server = new Server({ connectionString: db.connectionString, schema: db.schema, logLevel: 'error', queues: { large: 1 }, concurrency: 10 });
    await server.start((task) => void seen.add((task.payload as { i: number }).i));
    try {
      await waitFor(() => seen.size === 7, 60_000, 'all run');
      assert.deepEqual(
        [...seen].sort((a, b) => a - b),
        [3, 4, 5, 6, 7, 8, 9],
      );
    } finally {
      await server.shutdown();
    }
  });
});

describe('the task page of a 50 MB task', () => {
  /** A pool that counts the bytes of the rows it returns. */
  function countingPool(): { pool: pg.Pool; bytes: () => number; reset: () => void } {
    const pool = new pg.Pool({ connectionString: db.connectionString, max: 2 });
    let bytes = 0;
    pool.on('connect', (c) => {
      const query = c.query.bind(c) as (...args: unknown[]) => unknown;
      (c as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
        const out = query(...args);
        if (out instanceof Promise) {
          return out.then((r: pg.QueryResult) => {
            for (const row of r?.rows ?? []) bytes += JSON.stringify(row).length;
            return r;
          });
        }
        return out;
      };
    });
    return { pool, bytes: () => bytes, reset: () => void (bytes = 0) };
  }

  test('answers with an excerpt that says it is cut; with hidePayloads it reads no payload', { timeout: 120_000 }, async () => {
    const info = await client.enqueue(new Task('huge', { small: true }, { headers: { trace: 'abc' } }), { queue: 'pages', taskId: 'huge-1' });
    await db.query(`UPDATE {{schema}}.task_inputs SET payload = jsonb_build_object('blob', repeat('z', $1::int)) WHERE id = $2`, [50 * MB, info.id]);
    for (const hide of [false, true]) {
      const counted = countingPool();
      const dash = createDashboard({ pool: counted.pool, schema: db.schema, hidePayloads: hide });
      try {
        const url = (await dash.listen(0, '127.0.0.1')).url.replace(/\/$/, '');
        counted.reset();
        const res = await fetch(`${url}/queues/pages/tasks/huge-1`);
        const body = await res.text();
        assert.equal(res.status, 200, body.slice(0, 2000));
        assert.ok(counted.bytes() < 1 * MB, `the page read ${counted.bytes()} bytes from the database`);
        assert.ok(body.length < 1 * MB, `the page is ${body.length} bytes`);
        if (hide) {
          assert.ok(!body.includes('zzzz'), 'no part of the payload');
          assert.ok(!body.includes('abc'), 'nor of the headers');
          assert.ok(counted.bytes() < 20_000, `the page read ${counted.bytes()} bytes`);
          assert.match(body, /Hidden: the dashboard runs with --hide-payloads/);
        } else {
          assert.match(body, /data-truncated="payload"/);
          assert.match(body, /Truncated: the first 65,536 characters of 50,000,012 bytes/);
          const shown = body.match(/z{1000,}/g) ?? [];
          assert.equal(shown.length, 1, 'the start of the payload, once');
          assert.equal(shown[0].length, 65_536 - '{"blob": "'.length, 'its first 64 Ki characters');
          assert.match(body, /<code>trace<\/code>/, 'the headers, whole, as a table');
        }
        // A search by the task's id redirects without reading the payload either.
        counted.reset();
        const search = await fetch(`${url}/queues/pages?search=huge-1`, { redirect: 'manual' });
        assert.equal(search.status, 303);
        assert.ok(counted.bytes() < 20_000, `the search read ${counted.bytes()} bytes`);
      } finally {
        await dash.close();
        await counted.pool.end();
      }
    }
    // The Inspector's getTaskInfo still returns the whole task.
    const inspector = new Inspector({ connectionString: db.connectionString, schema: db.schema });
    try {
      const whole = await inspector.getTaskInfo('pages', 'huge-1');
      assert.equal((whole.payload as { blob: string }).blob.length, 50 * MB);
    } finally {
      await inspector.close();
    }
  });
});

describe('state rows without inputs', () => {
  test('in a queue with concurrency 2 they are recovered (deleted) and the other tasks run; a pending one is never claimed', { timeout: 120_000 }, async () => {
    await db.query('DELETE FROM {{schema}}.task_states');
    await db.query('DELETE FROM {{schema}}.task_inputs');
    const inspector = new Inspector({ connectionString: db.connectionString, schema: db.schema });
    await client.enqueue(new Task('seed'), { queue: 'orphans', taskId: 'seed' });
    await db.query('DELETE FROM {{schema}}.task_states');
    await db.query('DELETE FROM {{schema}}.task_inputs');
    await inspector.setQueueLimits('orphans', { concurrency: 2 });
    // Two planted pending state rows, as a producer with INSERT on task_states wrote them:
    // the limited claim takes them into both slots of the queue.
    await db.query(`INSERT INTO {{schema}}.task_states (seq, queue, state, pending_seq, run_at)
                    SELECT s, 'orphans', 'pending', s, now() FROM (SELECT nextval('{{schema}}.task_seq') AS s FROM generate_series(1, 2)) x`);
    for (let i = 0; i < 4; i++) await client.enqueue(new Task('real', { i }), { queue: 'orphans', taskId: `real-${i}` });
    // And one in a queue without limits, which the plain claim must leave alone.
    await db.query(`INSERT INTO {{schema}}.task_states (seq, queue, state, pending_seq, run_at)
                    SELECT s, 'plain', 'pending', s, now() FROM (SELECT nextval('{{schema}}.task_seq') AS s) x`);
    await client.enqueue(new Task('real'), { queue: 'plain', taskId: 'plain-1' });
    const ran: string[] = [];
    const server = new Server({
      connectionString: db.connectionString,
      schema: db.schema,
      logLevel: 'error',
      queues: { orphans: 1, plain: 1 },
      concurrency: 4,
      leaseDuration: 1000,
      heartbeatInterval: 200,
      recoverInterval: 100,
      recoverCutoff: 100,
    });
    await server.start((_task, ctx) => void ran.push(ctx.taskId));
    try {
      await waitFor(() => ran.length === 5, 30_000, 'every real task run');
      await waitFor(
        async () => (await db.query(`SELECT count(*)::int AS n FROM {{schema}}.task_states WHERE queue = 'orphans'`))[0].n === 0,
        30_000,
        'the orphans gone, and the real tasks done',
      );
      const plain = await db.query(`SELECT state FROM {{schema}}.task_states s WHERE queue = 'plain'
                                    AND NOT EXISTS (SELECT 1 FROM {{schema}}.task_inputs i WHERE i.seq = s.seq)`);
      assert.deepEqual(plain, [{ state: 'pending' }], 'the plain claim did not take the state row without inputs');
    } finally {
      await server.shutdown();
      await inspector.close();
    }
  });
});
