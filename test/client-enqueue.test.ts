/**
 * Client.enqueue against the real database: defaults and overrides, routing
 * by processAt, processIn and group, retention and headers stored, and
 * inputs at the edges accepted safely. Assertions are made on the rows.
 */
import { describe } from 'node:test';
import assert from 'node:assert/strict';
import { Task } from '../src/index.js';
import { countByState, test } from './helpers.js';
import { near, setupClient } from './client-kit.js';

const { db, client, mustRow, counts, countIn } = setupClient('t_client_enqueue');

/** A UUID version 7: 48 bits of Unix ms first, so ids sort by creation time. */
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const THIRTY_MIN = 1_800_000;

/** Asserts that `actual` has each field of `expected` (compared as assert.deepEqual compares them). */
function assertFields(actual: object, expected: Record<string, unknown>): void {
  assert.deepEqual(Object.fromEntries(Object.keys(expected).map((k) => [k, (actual as Record<string, unknown>)[k]])), expected);
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
