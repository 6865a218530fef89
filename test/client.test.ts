/**
 * Client: enqueue and enqueueMany against the real database. Every assertion
 * that matters is made on the rows (db.query), not only on the returned TaskInfo.
 */
import { describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import {
  Client,
  ClientClosedError,
  DatabaseUnavailableError,
  DuplicateTaskError,
  FailedPreconditionError,
  InvalidOptionError,
  InvalidQueueNameError,
  InvalidSchemaNameError,
  InvalidTaskIdError,
  InvalidTaskTypeError,
  PayloadSerializationError,
  PayloadTooLargeError,
  Task,
  TaskIdConflictError,
  ValidationError,
  type EnqueueOptions,
  type TaskInfo,
} from '../src/index.js';
import { caught, countByState, dsnWith, setupDb, test, waitFor } from './helpers.js';

const SCHEMA = 't_client';
/** A UUID version 7: 48 bits of Unix ms first, so ids sort by creation time. */
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const MIB = 1_048_576;
const THIRTY_MIN = 1_800_000;

const { db, client } = setupDb(SCHEMA);

/** Asserts that `actual` has each field of `expected` (compared as assert.deepEqual compares them). */
function assertFields(actual: object, expected: Record<string, unknown>): void {
  assert.deepEqual(Object.fromEntries(Object.keys(expected).map((k) => [k, (actual as Record<string, unknown>)[k]])), expected);
}

interface Row {
  queue: string;
  id: string;
  type: string;
  payload: unknown;
  payload_bytes: Buffer | null;
  headers: Record<string, string>;
  state: string;
  max_retry: number;
  retried: number;
  timeout_ms: number;
  deadline: Date | null;
  unique_key: string | null;
  group_key: string | null;
  retention_ms: number;
  run_at: Date | null;
}

/** The stored row of one task, with intervals as ms; undefined when absent. */
async function row(queue: string, id: string): Promise<Row | undefined> {
  const rows = await db.query<Row>(
    `SELECT queue, id, type, payload, payload_bytes, headers, state, max_retry, retried,
            (extract(epoch FROM timeout) * 1000)::float8 AS timeout_ms, deadline, unique_key, group_key,
            (extract(epoch FROM retention) * 1000)::float8 AS retention_ms, run_at
       FROM {{schema}}.tasks WHERE queue = $1 AND id = $2`,
    [queue, id],
  );
  return rows[0];
}

async function mustRow(info: Pick<TaskInfo, 'queue' | 'id'>): Promise<Row> {
  const r = await row(info.queue, info.id);
  assert.ok(r, `row ${info.queue}/${info.id} exists`);
  return r;
}

/** Row counts of the tables an enqueue writes. */
async function counts(): Promise<{ tasks: number; locks: number; queues: number }> {
  const [r] = await db.query<{ tasks: number; locks: number; queues: number }>(
    `SELECT (SELECT count(*) FROM {{schema}}.tasks)::int AS tasks,
            (SELECT count(*) FROM {{schema}}.unique_locks)::int AS locks,
            (SELECT count(*) FROM {{schema}}.queues)::int AS queues`,
  );
  assert.ok(r);
  return r;
}

async function lockRows(): Promise<{ queue: string; key: string; task_id: string; expires_at: Date }[]> {
  return db.query('SELECT queue, key, task_id, expires_at FROM {{schema}}.unique_locks ORDER BY queue, key');
}

async function countIn(queue: string): Promise<number> {
  const [r] = await db.query<{ n: number }>('SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE queue = $1', [queue]);
  return r?.n ?? -1;
}

function near(actual: Date | null | undefined, expectedMs: number, toleranceMs = 5_000, what = 'instant'): void {
  assert.ok(actual instanceof Date, `${what} is a Date (got ${String(actual)})`);
  assert.ok(
    Math.abs(actual.getTime() - expectedMs) <= toleranceMs,
    `${what} ${actual.toISOString()} is within ${toleranceMs} ms of ${new Date(expectedMs).toISOString()}`,
  );
}

// ---------------------------------------------------------------------------
describe('enqueue: defaults and overrides', () => {
  test('a bare task gets queue default, maxRetry 25, 30 min timeout, a UUID, pending', async () => {
    const before = Date.now();
    const info = await client.enqueue(new Task('defaults:plain', { a: 1 }));
    assertFields(info, {
      queue: 'default',
      type: 'defaults:plain',
      payload: { a: 1 },
      state: 'pending',
      maxRetry: 25,
      retried: 0,
      timeout: THIRTY_MIN,
      deadline: null,
      group: null,
      lastError: null,
      lastFailedAt: null,
      retention: 0,
      completedAt: null,
      result: null,
      isOrphaned: false,
      headers: {},
    });
    assert.match(info.id, UUID);
    near(info.nextProcessAt, before, 5_000, 'nextProcessAt');

    const r = await mustRow(info);
    assertFields(r, {
      state: 'pending',
      type: 'defaults:plain',
      payload: { a: 1 },
      payload_bytes: null,
      max_retry: 25,
      retried: 0,
      timeout_ms: THIRTY_MIN,
      deadline: null,
      unique_key: null,
      group_key: null,
      retention_ms: 0,
      headers: {},
    });
    near(r.run_at, before, 5_000, 'run_at');
    const queues = await db.query('SELECT name FROM {{schema}}.queues WHERE name = $1', ['default']);
    assert.equal(queues.length, 1, 'the queue is registered');
  });

  test('generated ids are distinct UUIDs (version 7) carrying their creation time', async () => {
    const before = Date.now();
    const infos = await Promise.all([1, 2, 3].map(() => client.enqueue(new Task('defaults:ids'))));
    for (const info of infos) assert.match(info.id, UUID);
    assert.equal(new Set(infos.map((i) => i.id)).size, 3);
    const ms = (id: string) => parseInt(id.replaceAll('-', '').slice(0, 12), 16);
    for (const info of infos) assert.ok(ms(info.id) >= before && ms(info.id) <= Date.now(), `${info.id} carries ${ms(info.id)}`);
    const many = await client.enqueueMany(Array.from({ length: 50 }, () => new Task('defaults:ids')));
    const stamps = many.map((i) => ms(i.id));
    assert.deepEqual(
      stamps,
      [...stamps].sort((a, b) => a - b),
      'ids of one batch in creation order, to the millisecond',
    );
  });

  test('only a deadline: TaskInfo.timeout is 0 and the deadline is stored', async () => {
    const deadline = new Date(Date.now() + 3_600_000);
    const info = await client.enqueue(new Task('defaults:deadline'), { deadline });
    assert.equal(info.timeout, 0);
    assert.equal(info.deadline?.getTime(), deadline.getTime());
    const r = await mustRow(info);
    assert.equal(r.timeout_ms, 0);
    assert.equal(r.deadline?.getTime(), deadline.getTime());
  });

  test('timeout and deadline together: both kept', async () => {
    const deadline = new Date(Date.now() + 3_600_000);
    const info = await client.enqueue(new Task('defaults:both'), { timeout: 5_000, deadline });
    assert.equal(info.timeout, 5_000);
    assert.equal(info.deadline?.getTime(), deadline.getTime());
    const r = await mustRow(info);
    assert.equal(r.timeout_ms, 5_000);
  });

  test('timeout: 0 means not set (30 min)', async () => {
    const info = await client.enqueue(new Task('defaults:zero'), { timeout: 0 });
    assert.equal(info.timeout, THIRTY_MIN);
    assert.equal((await mustRow(info)).timeout_ms, THIRTY_MIN);
  });

  test('headers round trip (TaskInfo, row, Task.headers)', async () => {
    const headers = { trace: 'abc-123', 'x-unicode': 'héllo ✓ 😀', empty: '', quote: `it's "quoted"` };
    const task = new Task('defaults:headers', null, { headers });
    assert.deepEqual({ ...task.headers }, headers);
    const info = await client.enqueue(task);
    assert.deepEqual(info.headers, headers);
    assert.deepEqual((await mustRow(info)).headers, headers);
  });

  test('options given to enqueue override those of new Task', async () => {
    const task = new Task(
      'override:t',
      { n: 1 },
      {
        queue: 'ovr_a',
        maxRetry: 3,
        timeout: 5_000,
        retention: 1_000,
        headers: { k: 'task' },
      },
    );
    const info = await client.enqueue(task, { queue: 'ovr_b', maxRetry: 7, headers: { k: 'call' } });
    assert.equal(info.queue, 'ovr_b');
    assert.equal(info.maxRetry, 7);
    assert.equal(info.timeout, 5_000, 'options not overridden are kept from the Task');
    assert.equal(info.retention, 1_000);
    assert.equal(info.headers.k, 'call');
    const r = await mustRow(info);
    assert.equal(r.max_retry, 7);
    assert.equal(r.timeout_ms, 5_000);
    assert.equal(r.headers.k, 'call');
    assert.equal(await countIn('ovr_a'), 0, 'nothing went to the Task queue');
    assert.equal(task.options.queue, 'ovr_a', 'the Task itself is unchanged');
    assert.equal(task.options.maxRetry, 3);

    // Without enqueue-time options the Task's own apply.
    const info2 = await client.enqueue(task);
    assert.equal(info2.queue, 'ovr_a');
    assert.equal(info2.maxRetry, 3);
    assert.equal((await mustRow(info2)).max_retry, 3);
  });
});

// ---------------------------------------------------------------------------
describe('enqueue: routing by processAt, processIn and group', () => {
  test('processAt in the future → scheduled, nextProcessAt = processAt', async () => {
    const at = new Date(Date.now() + 3_600_000);
    const info = await client.enqueue(new Task('route:at'), { processAt: at });
    assert.equal(info.state, 'scheduled');
    assert.equal(info.nextProcessAt?.getTime(), at.getTime());
    const r = await mustRow(info);
    assert.equal(r.state, 'scheduled');
    assert.equal(r.run_at?.getTime(), at.getTime());
  });

  test('processIn → scheduled, nextProcessAt ≈ now + processIn', async () => {
    const before = Date.now();
    const info = await client.enqueue(new Task('route:in'), { processIn: 60_000 });
    assert.equal(info.state, 'scheduled');
    near(info.nextProcessAt, before + 60_000, 5_000, 'nextProcessAt');
    const r = await mustRow(info);
    assert.equal(r.state, 'scheduled');
    near(r.run_at, before + 60_000, 5_000, 'run_at');
  });

  test('processIn given to new Task routes too', async () => {
    const info = await client.enqueue(new Task('route:in-task', null, { processIn: 120_000 }));
    assert.equal(info.state, 'scheduled');
    assert.equal((await mustRow(info)).state, 'scheduled');
  });

  test('processIn: 0 → pending', async () => {
    const info = await client.enqueue(new Task('route:in0'), { processIn: 0 });
    assert.equal(info.state, 'pending');
    assert.equal((await mustRow(info)).state, 'pending');
  });

  test('processAt in the past → pending, nextProcessAt ≈ now', async () => {
    const now = Date.now();
    const info = await client.enqueue(new Task('route:past'), { processAt: new Date(now - 3_600_000) });
    assert.equal(info.state, 'pending');
    near(info.nextProcessAt, now, 5_000, 'nextProcessAt');
    const r = await mustRow(info);
    assert.equal(r.state, 'pending');
    near(r.run_at, now, 5_000, 'run_at');
  });

  test('group → aggregating', async () => {
    const info = await client.enqueue(new Task('route:group', { n: 1 }), { group: 'g1', queue: 'route_q' });
    assert.equal(info.state, 'aggregating');
    assert.equal(info.group, 'g1');
    assert.equal(info.nextProcessAt, null);
    const r = await mustRow(info);
    assert.equal(r.state, 'aggregating');
    assert.equal(r.group_key, 'g1');
  });

  test('group + future processAt → scheduled (group kept)', async () => {
    const at = new Date(Date.now() + 3_600_000);
    const info = await client.enqueue(new Task('route:group-later'), { group: 'g2', queue: 'route_q', processAt: at });
    assert.equal(info.state, 'scheduled');
    assert.equal(info.group, 'g2');
    assert.equal(info.nextProcessAt?.getTime(), at.getTime());
    const r = await mustRow(info);
    assert.equal(r.state, 'scheduled');
    assert.equal(r.group_key, 'g2');
    assert.equal(r.run_at?.getTime(), at.getTime());
  });
});

// ---------------------------------------------------------------------------
describe('payloads round trip', () => {
  const jsonCases: [string, unknown, unknown][] = [
    ['object', { a: 1, nested: { b: [1, 'x', null, true], c: { d: -2.5 } } }, { a: 1, nested: { b: [1, 'x', null, true], c: { d: -2.5 } } }],
    ['empty object', {}, {}],
    ['array', [1, 'two', { three: 3 }, [4]], [1, 'two', { three: 3 }, [4]]],
    ['empty array', [], []],
    ['string', 'hello', 'hello'],
    ['empty string', '', ''],
    ['unicode string', 'héllo ✓ 😀 \u2028', 'héllo ✓ 😀 \u2028'],
    ['string that looks like JSON', '{"a":1}', '{"a":1}'],
    ['integer', 42, 42],
    ['zero', 0, 0],
    ['negative float', -1.5, -1.5],
    ['true', true, true],
    ['false', false, false],
    ['null', null, null],
    ['undefined', undefined, null],
    ['undefined members as JSON.stringify does', { a: undefined, b: [undefined, 1] }, { b: [null, 1] }],
    ['a Date inside becomes its ISO string', { at: new Date(0) }, { at: '1970-01-01T00:00:00.000Z' }],
  ];
  for (const [name, payload, expected] of jsonCases) {
    test(`JSON: ${name}`, async () => {
      const info = await client.enqueue(new Task('payload:json', payload));
      assert.deepEqual(info.payload, expected);
      const r = await mustRow(info);
      assert.deepEqual(r.payload, expected);
      assert.equal(r.payload_bytes, null);
    });
  }

  const bytes = new Uint8Array([0, 1, 2, 127, 128, 254, 255]);
  const binaryCases: [string, Uint8Array, Buffer][] = [
    ['Uint8Array', bytes, Buffer.from(bytes)],
    ['Buffer', Buffer.from('binary\0data\xff', 'latin1'), Buffer.from('binary\0data\xff', 'latin1')],
    ['Uint8Array view with an offset', new Uint8Array([9, 9, 1, 2, 3, 9]).subarray(2, 5), Buffer.from([1, 2, 3])],
    ['empty Uint8Array', new Uint8Array(0), Buffer.alloc(0)],
  ];
  for (const [name, payload, expected] of binaryCases) {
    test(`binary: ${name} comes back as a Buffer with equal bytes`, async () => {
      const info = await client.enqueue(new Task('payload:bytes', payload));
      assert.ok(Buffer.isBuffer(info.payload), 'TaskInfo.payload is a Buffer');
      assert.ok(info.payload.equals(expected));
      const r = await mustRow(info);
      assert.equal(r.payload, null);
      assert.ok(Buffer.isBuffer(r.payload_bytes));
      assert.ok(r.payload_bytes.equals(expected));
    });
  }

  test('the payload is taken when the Task is made: later changes to the bytes or object are not enqueued', async () => {
    const bytes = new Uint8Array([1, 2, 3]);
    const obj = { a: 1 };
    const tb = new Task('payload:snapshot', bytes);
    const tj = new Task('payload:snapshot', obj);
    bytes[0] = 99;
    obj.a = 99;
    const [ib, ij] = await client.enqueueMany([tb, tj]);
    assert.ok((ib?.payload as Buffer).equals(Buffer.from([1, 2, 3])));
    assert.ok((await mustRow(ib as TaskInfo)).payload_bytes?.equals(Buffer.from([1, 2, 3])));
    assert.deepEqual(ij?.payload, { a: 1 });
  });

  test('a payload of exactly 1 MiB is accepted (JSON and bytes)', async () => {
    const json = 'x'.repeat(MIB - 2); // with its quotes: exactly MIB bytes
    const a = await client.enqueue(new Task('payload:cap', json));
    assert.equal((a.payload as string).length, MIB - 2);
    const b = await client.enqueue(new Task('payload:cap', new Uint8Array(MIB)));
    assert.equal((b.payload as Buffer).length, MIB);
    assert.equal((await mustRow(b)).payload_bytes?.length, MIB);
  });
});

// ---------------------------------------------------------------------------
describe('retention and headers are stored', () => {
  test('retention is stored and returned in ms', async () => {
    for (const retention of [0, 1_500, 60_000, 86_400_000, 30 * 86_400_000]) {
      const info = await client.enqueue(new Task('retention:t'), { retention, headers: { r: String(retention) } });
      assert.equal(info.retention, retention);
      const r = await mustRow(info);
      assert.equal(r.retention_ms, retention);
      assert.deepEqual(r.headers, { r: String(retention) });
      assert.deepEqual(info.headers, { r: String(retention) });
    }
  });
});

// ---------------------------------------------------------------------------
describe('taskId conflicts', () => {
  test('the same id in the same queue → TaskIdConflictError; nothing overwritten', async () => {
    const first = await client.enqueue(new Task('conflict:first', { v: 1 }), { taskId: 'dup-1', queue: 'conflict_q' });
    assert.equal(first.id, 'dup-1');
    const before = await counts();
    const err = await caught(() => client.enqueue(new Task('conflict:second', { v: 2 }), { taskId: 'dup-1', queue: 'conflict_q' }));
    assert.ok(err instanceof TaskIdConflictError, `got ${String(err)}`);
    assert.equal(err.queue, 'conflict_q');
    assert.equal(err.taskId, 'dup-1');
    assert.deepEqual(await counts(), before);
    const r = await row('conflict_q', 'dup-1');
    assert.equal(r?.type, 'conflict:first');
    assert.deepEqual(r?.payload, { v: 1 });
  });

  for (const state of ['archived', 'completed'] as const) {
    test(`the existing task is ${state}: still a TaskIdConflictError`, async () => {
      const id = `dup-${state}`;
      await client.enqueue(new Task('conflict:state'), { taskId: id, queue: 'conflict_q' });
      await db.query(`UPDATE {{schema}}.tasks SET state = $3 WHERE queue = $1 AND id = $2`, ['conflict_q', id, state]);
      const before = await counts();
      const err = await caught(() => client.enqueue(new Task('conflict:state'), { taskId: id, queue: 'conflict_q' }));
      assert.ok(err instanceof TaskIdConflictError, `got ${String(err)}`);
      assert.deepEqual(await counts(), before);
      assert.equal((await row('conflict_q', id))?.state, state);
    });
  }

  test('the same id in another queue is fine', async () => {
    await client.enqueue(new Task('conflict:q1'), { taskId: 'shared-id', queue: 'conflict_q1' });
    const info = await client.enqueue(new Task('conflict:q2'), { taskId: 'shared-id', queue: 'conflict_q2' });
    assert.equal(info.id, 'shared-id');
    assert.equal(info.queue, 'conflict_q2');
    const rows = await db.query('SELECT queue, type FROM {{schema}}.tasks WHERE id = $1 ORDER BY queue', ['shared-id']);
    assert.deepEqual(rows, [
      { queue: 'conflict_q1', type: 'conflict:q1' },
      { queue: 'conflict_q2', type: 'conflict:q2' },
    ]);
  });
});

// ---------------------------------------------------------------------------
describe('unique', () => {
  const Q = 'uq';

  test('a second enqueue of the same type+payload → DuplicateTaskError, and writes nothing', async () => {
    const before = Date.now();
    const first = await client.enqueue(new Task('uniq:report', { day: '2024-01-01' }), { unique: 60_000, queue: Q });
    const r = await mustRow(first);
    assert.ok(r.unique_key, 'the task row carries its unique key');
    const locks = await lockRows();
    const mine = locks.find((l) => l.queue === Q && l.key === r.unique_key);
    assert.ok(mine, 'a lock row exists');
    assert.equal(mine.task_id, first.id);
    near(mine.expires_at, before + 60_000, 5_000, 'lock expires_at');

    const countsBefore = await counts();
    for (const opts of [
      { unique: 60_000, queue: Q },
      { unique: 5_000, queue: Q, headers: { other: 'headers' } },
    ]) {
      const err = await caught(() => client.enqueue(new Task('uniq:report', { day: '2024-01-01' }), opts));
      assert.ok(err instanceof DuplicateTaskError, `got ${String(err)}`);
      assert.equal(err.queue, Q);
      assert.deepEqual(await counts(), countsBefore, 'no task row, no lock row');
      assert.deepEqual(await lockRows(), locks, 'the lock row is unchanged');
    }
    assert.equal(await countIn(Q), 1);
  });

  test('a different payload, or another queue, is accepted', async () => {
    const a = await client.enqueue(new Task('uniq:report', { day: '2024-01-02' }), { unique: 60_000, queue: Q });
    const b = await client.enqueue(new Task('uniq:report', { day: '2024-01-01' }), { unique: 60_000, queue: 'uq_other' });
    const c = await client.enqueue(new Task('uniq:other-type', { day: '2024-01-01' }), { unique: 60_000, queue: Q });
    for (const info of [a, b, c]) assert.equal((await mustRow(info)).state, 'pending');
    // And without `unique` the same task may be enqueued any number of times.
    await client.enqueue(new Task('uniq:report', { day: '2024-01-01' }), { queue: Q });
    await client.enqueue(new Task('uniq:report', { day: '2024-01-01' }), { queue: Q });
  });

  test('once the lock has expired the same task is accepted again', async () => {
    const task = () => new Task('uniq:expiring', [1, 2, 3]);
    const first = await client.enqueue(task(), { unique: 60_000, queue: Q });
    await assert.rejects(client.enqueue(task(), { unique: 60_000, queue: Q }), DuplicateTaskError);
    const key = (await mustRow(first)).unique_key;
    const updated = await db.query(`UPDATE {{schema}}.unique_locks SET expires_at = now() - interval '1s' WHERE queue = $1 AND key = $2 RETURNING 1`, [Q, key]);
    assert.equal(updated.length, 1);
    const before = Date.now();
    const second = await client.enqueue(task(), { unique: 60_000, queue: Q });
    assert.notEqual(second.id, first.id);
    const lock = (await lockRows()).find((l) => l.queue === Q && l.key === key);
    assert.equal(lock?.task_id, second.id, 'the lock now belongs to the new task');
    near(lock?.expires_at, before + 60_000, 5_000, 'renewed lock');
  });

  test('the lock of a scheduled task lasts from processAt', async () => {
    const at = new Date(Date.now() + 3_600_000);
    const info = await client.enqueue(new Task('uniq:scheduled', { s: 1 }), { unique: 60_000, queue: Q, processAt: at });
    assert.equal(info.state, 'scheduled');
    const key = (await mustRow(info)).unique_key;
    const lock = (await lockRows()).find((l) => l.queue === Q && l.key === key);
    near(lock?.expires_at, at.getTime() + 60_000, 1_000, 'lock expires_at');
  });

  test('unique: 1000 (the minimum) is accepted', async () => {
    const info = await client.enqueue(new Task('uniq:min'), { unique: 1_000, queue: Q });
    assert.equal(info.state, 'pending');
  });
});

// ---------------------------------------------------------------------------
describe('enqueueMany', () => {
  test('one call; results are index-aligned with the input', async () => {
    const queues = ['many_a', 'many_b', 'many_c'];
    const tasks = Array.from(
      { length: 20 },
      (_, i) =>
        new Task(`many:t${i % 4}`, { i }, { queue: queues[i % 3], ...(i === 7 ? { taskId: 'many-seven' } : {}), ...(i === 11 ? { processIn: 60_000 } : {}) }),
    );
    const infos = await client.enqueueMany(tasks);
    assert.equal(infos.length, tasks.length);
    for (const [i, info] of infos.entries()) {
      assert.equal(info.type, `many:t${i % 4}`);
      assert.equal(info.queue, queues[i % 3]);
      assert.deepEqual(info.payload, { i });
      assert.equal(info.state, i === 11 ? 'scheduled' : 'pending');
      const r = await mustRow(info);
      assert.deepEqual(r.payload, { i });
      assert.equal(r.type, `many:t${i % 4}`);
    }
    assert.equal(infos[7]?.id, 'many-seven');
    assert.equal(new Set(infos.map((i) => `${i.queue}/${i.id}`)).size, 20);
  });

  test("tasks of one batch run in the caller's order, given ids and unique keys included", async () => {
    // Given ids go in in key order (lock order), so their FIFO number must come from the caller's order.
    const given = ['z-3', 'a-1', 'm-2', 'b-0'].map((taskId, i) => new Task('fifo:given', { i }, { queue: 'fifo_given', taskId }));
    const unique = [3, 1, 2, 0].map((n, i) => new Task('fifo:unique', { n, i }, { queue: 'fifo_unique', unique: 60_000 }));
    for (const [queue, tasks] of [
      ['fifo_given', given],
      ['fifo_unique', unique],
    ] as const) {
      const infos = await client.enqueueMany([...tasks]);
      const order = await db.query<{ id: string }>('SELECT id FROM {{schema}}.tasks WHERE queue = $1 AND state = $2 ORDER BY run_at, seq', [queue, 'pending']);
      assert.deepEqual(
        order.map((r) => r.id),
        infos.map((i) => i.id),
        queue,
      );
    }
  });

  test('enqueueMany options apply to every task and override the Task options', async () => {
    const tasks = [new Task('many:o', 1, { queue: 'many_x', maxRetry: 1 }), new Task('many:o', 2)];
    const infos = await client.enqueueMany(tasks, { queue: 'many_y', retention: 5_000 });
    assert.deepEqual(
      infos.map((i) => [i.queue, i.maxRetry, i.retention, i.payload]),
      [
        ['many_y', 1, 5_000, 1],
        ['many_y', 25, 5_000, 2],
      ],
    );
    assert.equal(await countIn('many_x'), 0);
  });

  test('an empty array → [] and nothing written', async () => {
    const before = await counts();
    assert.deepEqual(await client.enqueueMany([]), []);
    assert.deepEqual(await counts(), before);
  });

  /** Runs a batch that must fail with `Err` and write nothing at all. */
  async function allOrNothing(tasks: Task[], Err: new (...a: any[]) => Error, opts?: EnqueueOptions): Promise<Error> {
    const before = await counts();
    const locks = await lockRows();
    const err = await caught(() => client.enqueueMany(tasks, opts));
    assert.ok(err instanceof Err, `expected ${Err.name}, got ${String(err)}`);
    assert.deepEqual(await counts(), before, 'no task, lock or queue row written');
    assert.deepEqual(await lockRows(), locks, 'unique_locks unchanged');
    for (const q of ['aon_new_1', 'aon_new_2', 'aon_new_3']) assert.equal(await countIn(q), 0);
    return err;
  }

  test('all-or-nothing: one id that already exists', async () => {
    await client.enqueue(new Task('aon:existing'), { taskId: 'aon-existing', queue: 'aon_q' });
    const err = await allOrNothing(
      [
        new Task('aon:ok', { n: 1 }, { queue: 'aon_new_1', unique: 60_000 }),
        new Task('aon:conflict', null, { queue: 'aon_q', taskId: 'aon-existing' }),
        new Task('aon:ok', { n: 2 }, { queue: 'aon_new_2', processIn: 60_000 }),
      ],
      TaskIdConflictError,
    );
    assert.equal((err as TaskIdConflictError).queue, 'aon_q');
    assert.equal((err as TaskIdConflictError).taskId, 'aon-existing');
  });

  test('all-or-nothing: the same id twice inside the batch', async () => {
    await allOrNothing(
      [
        new Task('aon:a', null, { queue: 'aon_new_1', taskId: 'aon-twice', unique: 60_000 }),
        new Task('aon:b', null, { queue: 'aon_new_1', taskId: 'aon-twice' }),
      ],
      TaskIdConflictError,
    );
  });

  test('all-or-nothing: one unique duplicate of a held lock', async () => {
    await client.enqueue(new Task('aon:uniq', { held: true }), { unique: 60_000, queue: 'aon_q' });
    await allOrNothing(
      [
        new Task('aon:uniq', { fresh: 1 }, { queue: 'aon_q', unique: 60_000 }),
        new Task('aon:plain', null, { queue: 'aon_new_1' }),
        new Task('aon:uniq', { held: true }, { queue: 'aon_q', unique: 60_000 }),
        new Task('aon:uniq', { fresh: 2 }, { queue: 'aon_new_2', unique: 60_000 }),
      ],
      DuplicateTaskError,
    );
  });

  test('all-or-nothing: two unique tasks with the same key inside the batch', async () => {
    await allOrNothing(
      [new Task('aon:same', { k: 1 }, { queue: 'aon_new_1', unique: 60_000 }), new Task('aon:same', { k: 1 }, { queue: 'aon_new_1', unique: 60_000 })],
      DuplicateTaskError,
    );
  });

  test('all-or-nothing: one invalid Task (not a Task) → ValidationError naming its index', async () => {
    const err = await allOrNothing(
      [
        new Task('aon:ok', null, { queue: 'aon_new_1' }),
        { type: 'aon:fake', payload: null } as unknown as Task,
        new Task('aon:ok', null, { queue: 'aon_new_2' }),
      ],
      ValidationError,
    );
    assert.equal((err as ValidationError).field, 'tasks[1]');
  });

  test('all-or-nothing: one invalid option (a deadline already past; processAt with processIn)', async () => {
    const e1 = await allOrNothing(
      [new Task('aon:ok', null, { queue: 'aon_new_1' }), new Task('aon:late', null, { queue: 'aon_new_2', deadline: new Date(Date.now() - 1_000) })],
      ValidationError,
    );
    assert.equal((e1 as ValidationError).field, 'deadline');
    const e2 = await allOrNothing(
      [new Task('aon:ok', null, { queue: 'aon_new_1' }), new Task('aon:at', null, { queue: 'aon_new_2', processAt: new Date(Date.now() + 60_000) })],
      ValidationError,
      { processIn: 1_000 },
    );
    assert.equal((e2 as ValidationError).field, 'processAt');
    const e3 = await allOrNothing([new Task('aon:ok', null, { queue: 'aon_new_3' })], ValidationError, { maxRetries: 3 } as any);
    assert.equal((e3 as ValidationError).field, 'options.maxRetries');
  });
});

// ---------------------------------------------------------------------------
describe('transactional enqueue (tx)', () => {
  test('pg PoolClient after BEGIN: invisible before COMMIT, visible after', async () => {
    const conn = await db.pool.connect();
    try {
      await conn.query('BEGIN');
      const info = await client.enqueue(new Task('tx:pg', { n: 1 }), { tx: conn, queue: 'tx_q' });
      const many = await client.enqueueMany([new Task('tx:pg', { n: 2 }), new Task('tx:pg', { n: 3 })], { tx: conn, queue: 'tx_q' });
      assert.equal(info.state, 'pending');
      assert.equal(many.length, 2);
      assert.equal(await row('tx_q', info.id), undefined, 'not visible from another connection before COMMIT');
      assert.equal(await countIn('tx_q'), 0);
      const inside = await conn.query(`SELECT count(*)::int AS n FROM "${db.schema}".tasks WHERE queue = 'tx_q'`);
      assert.equal(inside.rows[0].n, 3, 'visible inside the transaction');
      await conn.query('COMMIT');
      assert.equal((await mustRow(info)).state, 'pending');
      assert.equal(await countIn('tx_q'), 3);
    } finally {
      conn.release();
    }
  });

  test('pg PoolClient: ROLLBACK leaves nothing (no task, no lock, no queue)', async () => {
    const before = await counts();
    const conn = await db.pool.connect();
    let id: string;
    try {
      await conn.query('BEGIN');
      const info = await client.enqueue(new Task('tx:rollback', { n: 1 }), { tx: conn, queue: 'tx_rb', unique: 60_000 });
      id = info.id;
      await client.enqueueMany([new Task('tx:rollback', { n: 2 })], { tx: conn, queue: 'tx_rb' });
      await conn.query('ROLLBACK');
    } finally {
      conn.release();
    }
    assert.equal(await row('tx_rb', id), undefined);
    assert.deepEqual(await counts(), before);
    // The unique lock taken in the rolled-back transaction is gone too.
    const again = await client.enqueue(new Task('tx:rollback', { n: 1 }), { queue: 'tx_rb', unique: 60_000 });
    assert.equal(again.state, 'pending');
  });

  test('Kysely Transaction: committed', async () => {
    const kysely = new Kysely<any>({ dialect: new PostgresDialect({ pool: db.pool }) });
    const info = await kysely.transaction().execute(async (trx) => {
      const i = await client.enqueue(new Task('tx:kysely', { k: 1 }), { tx: trx, queue: 'tx_k' });
      const m = await client.enqueueMany([new Task('tx:kysely', { k: 2 })], { tx: trx, queue: 'tx_k' });
      assert.equal(m.length, 1);
      assert.equal(await countIn('tx_k'), 0, 'not visible from another connection before commit');
      return i;
    });
    assert.equal((await mustRow(info)).state, 'pending');
    assert.equal(await countIn('tx_k'), 2);
  });

  test('Kysely Transaction: rolled back', async () => {
    const kysely = new Kysely<any>({ dialect: new PostgresDialect({ pool: db.pool }) });
    const before = await counts();
    let id = '';
    await assert.rejects(
      kysely.transaction().execute(async (trx) => {
        id = (await client.enqueue(new Task('tx:kysely-rb'), { tx: trx, queue: 'tx_k_rb', unique: 60_000 })).id;
        throw new Error('roll it back');
      }),
      /roll it back/,
    );
    assert.notEqual(id, '');
    assert.equal(await row('tx_k_rb', id), undefined);
    assert.deepEqual(await counts(), before);
  });
});

// ---------------------------------------------------------------------------
describe('NOTIFY', () => {
  let listener: pg.Client;
  const notes: { channel: string; payload: string | undefined }[] = [];

  before(async () => {
    listener = new pg.Client({ connectionString: db.connectionString });
    await listener.connect();
    listener.on('notification', (m) => notes.push({ channel: m.channel, payload: m.payload }));
    await listener.query(`LISTEN ${db.schema}_tasks`);
    await listener.query(`LISTEN ${db.schema}_delayed`);
  });

  after(async () => {
    await listener?.end();
  });

  /**
   * Resolves once every notification committed before it has arrived: PostgreSQL
   * delivers a listener's notifications in commit order, so a marker sent now
   * comes after all of them. What has not arrived by then was never sent.
   */
  let barriers = 0;
  const barrier = async () => {
    const marker = `barrier:${++barriers}`;
    await db.query('SELECT pg_notify($1, $2)', [`${db.schema}_tasks`, marker]);
    await waitFor(() => notes.some((n) => n.payload === marker), 5_000, 'the barrier notification');
  };

  const on = (channel: string, prefix: string) =>
    notes
      .filter((n) => n.channel === channel && n.payload?.startsWith(prefix))
      .map((n) => n.payload)
      .sort();

  test('enqueueMany of 3 tasks into 2 queues: one notification per queue, payload = queue name', async () => {
    await client.enqueueMany([
      new Task('notify:t', 1, { queue: 'nq_a' }),
      new Task('notify:t', 2, { queue: 'nq_a' }),
      new Task('notify:t', 3, { queue: 'nq_b' }),
    ]);
    await waitFor(() => on(`${db.schema}_tasks`, 'nq_').length >= 2, 5_000, 'two notifications');
    await barrier(); // any extra (per-task) notification has arrived by now
    assert.deepEqual(on(`${db.schema}_tasks`, 'nq_'), ['nq_a', 'nq_b']);
    assert.deepEqual(on(`${db.schema}_delayed`, 'nq_'), []);
  });

  test('a scheduled task notifies on the delayed channel', async () => {
    await client.enqueue(new Task('notify:later'), { queue: 'nd_c', processIn: 60_000 });
    await waitFor(() => on(`${db.schema}_delayed`, 'nd_').length >= 1, 5_000, 'a delayed notification');
    await barrier();
    assert.deepEqual(on(`${db.schema}_delayed`, 'nd_'), ['nd_c']);
    assert.deepEqual(on(`${db.schema}_tasks`, 'nd_'), []);
  });

  test('with tx, the notification comes at COMMIT, and never after ROLLBACK', async () => {
    const conn = await db.pool.connect();
    try {
      await conn.query('BEGIN');
      await client.enqueue(new Task('notify:rb'), { tx: conn, queue: 'nt_rb' });
      await conn.query('ROLLBACK');
      await conn.query('BEGIN');
      await client.enqueue(new Task('notify:tx'), { tx: conn, queue: 'nt_ok' });
      await barrier();
      assert.deepEqual(on(`${db.schema}_tasks`, 'nt_'), [], 'nothing before COMMIT');
      await conn.query('COMMIT');
    } finally {
      conn.release();
    }
    await waitFor(() => on(`${db.schema}_tasks`, 'nt_').length >= 1, 5_000, 'notification after commit');
    await barrier();
    assert.deepEqual(on(`${db.schema}_tasks`, 'nt_'), ['nt_ok']);
  });
});

// ---------------------------------------------------------------------------
describe('bad input: ValidationError naming the field, nothing written, no SQL sent', () => {
  // A client on a pool of our own, so we can see that a refused call never
  // even checks out a connection (the check happens before any SQL).
  let pool: pg.Pool;
  let bad: Client;
  let acquired = 0;

  before(() => {
    pool = new pg.Pool({ connectionString: db.connectionString, max: 2 });
    pool.on('acquire', () => acquired++);
    bad = new Client({ pool, schema: db.schema });
  });

  after(async () => {
    await bad?.close();
    await pool?.end();
  });

  type ErrClass = new (...args: any[]) => ValidationError;
  interface Case {
    name: string;
    run: (c: Client) => unknown;
    field: string;
    cls: ErrClass;
  }
  const cases: Case[] = [];
  const add = (name: string, run: Case['run'], field: string, cls: ErrClass) => cases.push({ name, run, field, cls });
  /** An option refused both on new Task, on enqueue and on enqueueMany. */
  const opt = (name: string, options: Record<string, unknown>, field: string, cls: ErrClass = InvalidOptionError) => {
    add(`${name} (new Task options)`, (c) => c.enqueue(new Task('bad:t', null, options)), field, cls);
    add(`${name} (enqueue options)`, (c) => c.enqueue(new Task('bad:t'), options), field, cls);
    add(`${name} (enqueueMany options)`, (c) => c.enqueueMany([new Task('bad:t')], options), field, cls);
  };
  const payload = (name: string, value: unknown, cls: ErrClass = PayloadSerializationError) =>
    add(`payload: ${name}`, (c) => c.enqueue(new Task('bad:p', value)), 'payload', cls);

  // Task types.
  for (const [name, type] of [
    ['empty', ''],
    ['blank', '  '],
    ['control character', 'email\nwelcome'],
    ['DEL character', 'email\u007f'],
    ['C1 control character (8-bit CSI)', 'email\u009b31m'],
    ['C1 control character (NEL)', 'email\u0085x'],
    ['NUL character', 'email\u0000'],
    ['lone surrogate', 'email:\uD800'],
    ['101 characters', 'a'.repeat(101)],
    ['not a string', 42],
  ] as const) {
    add(`type: ${name}`, (c) => c.enqueue(new Task(type as string)), 'type', InvalidTaskTypeError);
  }

  // Queue names.
  for (const [name, queue] of [
    ['empty', ''],
    ['101 characters', 'q'.repeat(101)],
    ['leading space', ' default'],
    ['SQL injection', "default'; DROP TABLE x;--"],
    ['NUL character', 'a\u0000b'],
    ['slash', 'a/b'],
    ['not a string', 1],
  ] as const) {
    opt(`queue: ${name}`, { queue }, 'queue', InvalidQueueNameError);
  }

  // Numbers are never coerced.
  const show = (v: unknown) => (typeof v === 'string' ? JSON.stringify(v) : String(v));
  for (const maxRetry of [-1, 2.5, '3', 1001, Number.NaN, null]) opt(`maxRetry: ${show(maxRetry)}`, { maxRetry }, 'maxRetry');
  for (const timeout of [-1, Number.NaN, Number.POSITIVE_INFINITY, '10']) opt(`timeout: ${show(timeout)}`, { timeout }, 'timeout');
  for (const retention of [-1, Number.NaN, '1000']) opt(`retention: ${show(retention)}`, { retention }, 'retention');
  for (const unique of [0, 999, -1, Number.NaN, Number.POSITIVE_INFINITY, '60000']) opt(`unique: ${show(unique)}`, { unique }, 'unique');
  opt('processIn: -5000', { processIn: -5_000 }, 'processIn');
  opt('processIn: "1000"', { processIn: '1000' }, 'processIn');

  // Dates.
  opt('deadline in the past', { deadline: new Date(Date.now() - 60_000) }, 'deadline');
  opt('deadline Invalid Date', { deadline: new Date('nope') }, 'deadline');
  opt('deadline as a string', { deadline: '2099-01-01T00:00:00Z' }, 'deadline');
  opt('processAt Invalid Date', { processAt: new Date('nope') }, 'processAt');
  opt('processAt as a number', { processAt: Date.now() + 60_000 }, 'processAt');
  opt('processAt and processIn together', { processAt: new Date(Date.now() + 60_000), processIn: 1_000 }, 'processAt');
  add(
    'processAt on the Task, processIn on enqueue',
    (c) => c.enqueue(new Task('bad:t', null, { processAt: new Date(Date.now() + 60_000) }), { processIn: 1_000 }),
    'processAt',
    InvalidOptionError,
  );

  // Task ids.
  for (const [name, taskId] of [
    ['path traversal', '../etc/passwd'],
    ['space', 'a b'],
    ['200 characters', 'i'.repeat(200)],
    ['empty', ''],
    ['NUL character', 'a\u0000b'],
    ['not a string', 7],
  ] as const) {
    opt(`taskId: ${name}`, { taskId }, 'taskId', InvalidTaskIdError);
  }

  // Option keys and shapes.
  opt('misspelt option key', { maxRetries: 3 }, 'options.maxRetries');
  opt('group with a space', { group: 'a b' }, 'group');
  add('options not an object (new Task)', (c) => c.enqueue(new Task('bad:t', null, 'critical' as unknown as EnqueueOptions)), 'options', InvalidOptionError);
  add('options null (new Task)', (c) => c.enqueue(new Task('bad:t', null, null as unknown as EnqueueOptions)), 'options', InvalidOptionError);
  add('options not an object (enqueue)', (c) => c.enqueue(new Task('bad:t'), 'critical' as unknown as EnqueueOptions), 'options', InvalidOptionError);
  add('options null (enqueue)', (c) => c.enqueue(new Task('bad:t'), null as unknown as EnqueueOptions), 'options', InvalidOptionError);
  add('options null (enqueueMany)', (c) => c.enqueueMany([new Task('bad:t')], null as unknown as EnqueueOptions), 'options', InvalidOptionError);
  add('options an array (enqueue)', (c) => c.enqueue(new Task('bad:t'), [] as unknown as EnqueueOptions), 'options', InvalidOptionError);
  add('tx not a transaction', (c) => c.enqueue(new Task('bad:t'), { tx: 'BEGIN' as any }), 'tx', InvalidOptionError);

  // Headers.
  opt('headers with a non-string value', { headers: { x: 1 } }, 'headers.x');
  opt('headers with a null value', { headers: { x: null } }, 'headers.x');
  opt('headers value with a NUL character', { headers: { x: 'a\u0000b' } }, 'headers.x');
  opt('headers not an object', { headers: 'x=1' }, 'headers');

  // Payloads.
  const cycle: Record<string, unknown> = { a: 1 };
  cycle.self = cycle;
  let deep: Record<string, unknown> = {};
  const root = deep;
  for (let i = 0; i < 100; i++) deep = deep.a = {};
  payload('BigInt', { amount: 10n });
  payload('a cycle', cycle);
  payload('a function', { f: () => 1 });
  payload('a bare function', () => 1);
  payload('NaN', { ratio: Number.NaN });
  payload('Infinity', [Number.POSITIVE_INFINITY]);
  payload('a Map', new Map([['a', 1]]));
  payload('a Set inside', { s: new Set([1]) });
  payload('a symbol', { s: Symbol('x') });
  payload('nested 100 deep', root);
  payload('a string containing NUL', { s: 'a\u0000b' });
  payload('a key containing NUL', { 'a\u0000b': 1 });
  payload('a lone surrogate', 'x\uD800');
  payload('JSON over 1 MiB', 'x'.repeat(MIB - 1), PayloadTooLargeError); // 1 MiB + 1 byte with its quotes
  payload('bytes over 1 MiB', new Uint8Array(MIB + 1), PayloadTooLargeError);

  // Schema names.
  for (const schema of ['public; DROP SCHEMA public CASCADE', "o'brien", 'a$$b', 'Queue', 'x.job', 'pg_catalog', 'pg_pgq', '', 'a'.repeat(64), '1abc', 'a b']) {
    add(
      `schema: ${JSON.stringify(schema.length > 20 ? `${schema.slice(0, 20)}…` : schema)}`,
      () => new Client({ connectionString: db.connectionString, schema }),
      'schema',
      InvalidSchemaNameError,
    );
  }

  // Arguments that are not Tasks.
  add('enqueue of a plain object', (c) => c.enqueue({ type: 'x', payload: null } as unknown as Task), 'task', ValidationError);
  add('enqueueMany of a non-array', (c) => c.enqueueMany(new Task('x') as unknown as Task[]), 'tasks', ValidationError);

  for (const c of cases) {
    test(c.name, async () => {
      const before = await counts();
      const acquiredBefore = acquired;
      const err = await caught(() => c.run(bad));
      assert.ok(err instanceof ValidationError, `expected a ValidationError, got ${String(err)}`);
      assert.ok(err instanceof c.cls, `expected ${c.cls.name}, got ${(err as Error).name}: ${(err as Error).message}`);
      assert.equal(err.field, c.field);
      assert.ok(err.message.includes(c.field), `message names the field: ${err.message}`);
      assert.deepEqual(await counts(), before, 'nothing written');
      assert.equal(acquired, acquiredBefore, 'no connection checked out: refused before any SQL');
    });
  }

  test('the table above ran on this client and nothing reached the database', async () => {
    assert.ok(cases.length >= 100, `${cases.length} cases`);
    assert.equal(acquired, 0);
  });
});

// ---------------------------------------------------------------------------
describe('closed client', () => {
  test('enqueue and enqueueMany after close() → ClientClosedError', async () => {
    const c = new Client({ connectionString: db.connectionString, schema: db.schema });
    await c.enqueue(new Task('closed:before'), { queue: 'closed_q' });
    await c.close();
    const before = await counts();
    const e1 = await caught(() => c.enqueue(new Task('closed:after'), { queue: 'closed_q' }));
    assert.ok(e1 instanceof ClientClosedError, `got ${String(e1)}`);
    assert.equal(e1.message, 'client is closed');
    const e2 = await caught(() => c.enqueueMany([new Task('closed:after')], { queue: 'closed_q' }));
    assert.ok(e2 instanceof ClientClosedError, `got ${String(e2)}`);
    await c.close(); // a second close is harmless
    assert.deepEqual(await counts(), before);
    assert.equal(await countIn('closed_q'), 1);
  });
});

// ---------------------------------------------------------------------------
describe('accepted safely', () => {
  test("queue 'a:b.c-d_e' round-trips", async () => {
    const info = await client.enqueue(new Task('safe:queue'), { queue: 'a:b.c-d_e' });
    assert.equal(info.queue, 'a:b.c-d_e');
    assert.equal((await mustRow(info)).queue, 'a:b.c-d_e');
    assert.equal((await db.query('SELECT 1 FROM {{schema}}.queues WHERE name = $1', ['a:b.c-d_e'])).length, 1);
  });

  test('payload {"__proto__": {"polluted": true}} from JSON: no prototype pollution', async () => {
    const payload = JSON.parse('{"__proto__": {"polluted": true}, "ok": 1}') as Record<string, unknown>;
    const info = await client.enqueue(new Task('safe:proto', payload));
    const back = info.payload as Record<string, unknown>;
    assert.equal(back.ok, 1);
    const stored = (await mustRow(info)).payload as Record<string, unknown>;
    assert.equal(stored.ok, 1);
    // Whatever was done with the key, reading it back polluted nothing.
    assert.equal(({} as any).polluted, undefined);
    assert.equal(Object.prototype.hasOwnProperty.call(Object.prototype, 'polluted'), false);
    const merged = Object.assign({}, back, stored);
    assert.equal((merged as any).ok, 1);
    assert.equal(({} as any).polluted, undefined);
  });

  test('maxRetry 0 and maxRetry 1000 are accepted', async () => {
    for (const maxRetry of [0, 1000]) {
      const info = await client.enqueue(new Task('safe:maxretry'), { maxRetry });
      assert.equal(info.maxRetry, maxRetry);
      assert.equal((await mustRow(info)).max_retry, maxRetry);
    }
  });

  test('a Unicode task type, a 100-character type and queue, a 128-character id', async () => {
    const info = await client.enqueue(new Task('email:wélcome ✓'), { queue: 'q'.repeat(100), taskId: 'i'.repeat(128) });
    const r = await mustRow(info);
    assert.equal(r.type, 'email:wélcome ✓');
    assert.equal(r.queue.length, 100);
    assert.equal(r.id.length, 128);
    const t2 = await client.enqueue(new Task('t'.repeat(100)));
    assert.equal((await mustRow(t2)).type.length, 100);
  });

  test('state counts add up: every accepted enqueue of this file is a row', async () => {
    const byState = await countByState(db);
    const total = Object.values(byState).reduce((a, b) => a + b, 0);
    assert.equal(total, (await counts()).tasks);
    assert.ok((byState.pending ?? 0) > 0 && (byState.scheduled ?? 0) > 0 && (byState.aggregating ?? 0) > 0);
  });
});

describe('a schema that was never migrated, a database that does not exist', () => {
  const NEVER = `${SCHEMA}${process.env.TEST_SCHEMA_SUFFIX ?? ''}_never`;
  const notMigrated = (err: unknown): boolean => {
    assert.ok(err instanceof FailedPreconditionError, String(err));
    assert.match(
      err.message,
      /^schema "t_client\w*_never" is not migrated \((?:relation "t_client\w*_never\.\w+"|schema "t_client\w*_never"|function t_client\w*_never\.enqueue_tasks\(.*\)) does not exist\): run `pgasynq migrate` \(or migrate\(\)\) first$/,
    );
    assert.ok(['42P01', '3F000', '42883'].includes((err.cause as { code: string }).code));
    return true;
  };
  const tablesIn = async (schema: string) =>
    (await db.pool.query('SELECT count(*)::int AS n FROM pg_tables WHERE schemaname = $1', [schema])).rows[0].n as number;
  const schemaExists = async (schema: string) => (await db.pool.query('SELECT 1 FROM pg_namespace WHERE nspname = $1', [schema])).rowCount === 1;

  test('enqueue, unique enqueue, enqueueMany, enqueue in a transaction: FailedPreconditionError saying to migrate; nothing written', async () => {
    await db.pool.query(`DROP SCHEMA IF EXISTS "${NEVER}" CASCADE`);
    const c = new Client({ connectionString: db.connectionString, schema: NEVER, logger: false });
    try {
      await assert.rejects(c.enqueue(new Task('t', { a: 1 })), notMigrated);
      await assert.rejects(c.enqueue(new Task('t', { a: 1 }), { unique: 60_000, queue: 'q' }), notMigrated);
      await assert.rejects(c.enqueueMany([new Task('a'), new Task('b', null, { queue: 'other' })]), notMigrated);
      const tx = await db.pool.connect();
      try {
        await tx.query('BEGIN');
        await assert.rejects(c.enqueue(new Task('t'), { tx }), notMigrated);
        await tx.query('ROLLBACK');
      } finally {
        tx.release();
      }
      assert.equal(await schemaExists(NEVER), false, 'no schema was created');
      // An empty schema (created by hand, never migrated): the same, and it stays empty.
      await db.pool.query(`CREATE SCHEMA "${NEVER}"`);
      await assert.rejects(c.enqueue(new Task('t')), notMigrated);
      await assert.rejects(c.enqueueMany([new Task('a')]), notMigrated);
      assert.equal(await tablesIn(NEVER), 0);
    } finally {
      await c.close();
      await db.pool.query(`DROP SCHEMA IF EXISTS "${NEVER}" CASCADE`);
    }
  });

  test('an unknown database: DatabaseUnavailableError naming it', async () => {
    const c = new Client({ connectionString: dsnWith({ database: 'no_such_db_client' }), schema: SCHEMA, logger: false });
    try {
      const err = await caught(() => c.enqueue(new Task('t')));
      assert.ok(err instanceof DatabaseUnavailableError, String(err));
      assert.equal(err.reason, 'database-not-found');
      assert.match(err.message, /^database "no_such_db_client" does not exist/);
    } finally {
      await c.close();
    }
  });
});

describe('durability of an acknowledged enqueue', () => {
  test("a Client's own pool commits with synchronous_commit on whatever PGOPTIONS says (and keeps the rest of it); a pool of yours keeps its settings", async () => {
    // A trigger notes the settings of the session that inserts each task: the enqueue's own.
    await db.query(`CREATE TABLE {{schema}}.commit_settings (id text, synchronous_commit text, work_mem text);
      CREATE FUNCTION {{schema}}.note_commit_settings() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        INSERT INTO ${`"${db.schema}"`}.commit_settings VALUES (NEW.id, current_setting('synchronous_commit'), current_setting('work_mem'));
        RETURN NEW;
      END $$;
      CREATE TRIGGER note_commit_settings AFTER INSERT ON {{schema}}.task_inputs FOR EACH ROW EXECUTE FUNCTION {{schema}}.note_commit_settings()`);
    const saved = process.env.PGOPTIONS;
    process.env.PGOPTIONS = '-c synchronous_commit=off -c work_mem=12345kB';
    const own = new Client({ connectionString: db.connectionString, schema: db.schema });
    const yours = new pg.Pool({ connectionString: db.connectionString, max: 1 });
    const onYours = new Client({ pool: yours, schema: db.schema });
    try {
      const a = await own.enqueue(new Task('durable:own'));
      const b = await onYours.enqueue(new Task('durable:yours'));
      const rows = await db.query<{ id: string; synchronous_commit: string; work_mem: string }>('SELECT * FROM {{schema}}.commit_settings');
      const by = new Map(rows.map((r) => [r.id, r]));
      assert.equal(by.get(a.id)?.synchronous_commit, 'on', "the Client's own session waits for the WAL flush");
      assert.equal(by.get(a.id)?.work_mem, '12345kB', 'the rest of PGOPTIONS is kept');
      assert.equal(by.get(b.id)?.synchronous_commit, 'off', 'a pool of yours keeps its own settings');
    } finally {
      if (saved === undefined) delete process.env.PGOPTIONS;
      else process.env.PGOPTIONS = saved;
      await own.close();
      await onYours.close();
      await yours.end();
      await db.query(
        'DROP TRIGGER note_commit_settings ON {{schema}}.task_inputs; DROP FUNCTION {{schema}}.note_commit_settings(); DROP TABLE {{schema}}.commit_settings',
      );
    }
  });
});
