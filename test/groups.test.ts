import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { Inspector, Server, Task, type ServerConfig, type TaskContext } from '../src/index.js';
import { countByState, deferred, setupDb, test, waitFor } from './helpers.js';
import { noLockWaitPool } from './shared.js';

const {
  db,
  client,
  startServer: serve,
  reset,
} = setupDb('t_groups', {
  server: { concurrency: 4, taskCheckInterval: 50, delayedTaskCheckInterval: 50, leaseDuration: 5000, heartbeatInterval: 200, groupGracePeriod: 250 },
});

interface Ran {
  type: string;
  payload: any;
  queue: string;
}

/** A server whose handler records every task it runs; the aggregator batches payloads by default. */
async function startServer(config: ServerConfig = {}): Promise<{ server: Server; ran: Ran[]; calls: { group: string; payloads: unknown[] }[] }> {
  const ran: Ran[] = [];
  const calls: { group: string; payloads: unknown[] }[] = [];
  const server = await serve(
    (task: Task, ctx: TaskContext) => {
      ran.push({ type: task.type, payload: task.payload, queue: ctx.queue });
    },
    {
      groupAggregator: (group, tasks) => {
        calls.push({ group, payloads: tasks.map((t) => t.payload) });
        return new Task('batch', { group, items: tasks.map((t) => t.payload) });
      },
      ...config,
    },
  );
  return { server, ran, calls };
}

const aggregating = async (group: string) =>
  (await db.query<{ n: number }>("SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE state = 'aggregating' AND group_key = $1", [group]))[0]?.n ?? 0;

describe('closing a group', () => {
  test('by size: groupMaxSize members close it at once, the oldest first; the rest wait', { timeout: 30_000 }, async () => {
    await reset();
    for (let i = 0; i < 7; i++) await client.enqueue(new Task('item', { i }), { group: 'sized' });
    assert.equal(await aggregating('sized'), 7);
    // A grace period far longer than the test: only the size can close the group.
    const { ran } = await startServer({ groupMaxSize: 3, groupGracePeriod: 600_000 });
    await waitFor(() => ran.length === 2, 20_000, 'two batches');
    assert.deepEqual(
      ran.map((r) => r.payload.items).sort((x, y) => x[0].i - y[0].i),
      [
        [{ i: 0 }, { i: 1 }, { i: 2 }],
        [{ i: 3 }, { i: 4 }, { i: 5 }],
      ],
    );
    await waitFor(async () => (await aggregating('sized')) === 1, 20_000, 'the seventh waits');
    const [last] = await db.query("SELECT payload FROM {{schema}}.tasks WHERE state = 'aggregating'");
    assert.deepEqual(last.payload, { i: 6 });
  });

  test('by grace period: no member arrived for groupGracePeriod', { timeout: 30_000 }, async () => {
    await reset();
    const { ran, calls } = await startServer({ groupGracePeriod: 250 });
    await client.enqueueMany([new Task('item', 'a'), new Task('item', 'b')], { group: 'quiet' });
    await waitFor(() => ran.length === 1, 20_000, 'the batch ran');
    assert.deepEqual(ran[0], { type: 'batch', payload: { group: 'quiet', items: ['a', 'b'] }, queue: 'default' });
    assert.deepEqual(calls, [{ group: 'quiet', payloads: ['a', 'b'] }]);
    assert.equal(await aggregating('quiet'), 0, 'members deleted');
  });

  test('by max delay: the oldest member waited groupMaxDelay, however recent the newest', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueue(new Task('item', 1), { group: 'slow' });
    await client.enqueue(new Task('item', 2), { group: 'slow' });
    // A grace period far longer than the test: only the max delay can close the group. Both members
    // are in before the server starts: a pause between the enqueues cannot close the group on one.
    const { ran } = await startServer({ groupGracePeriod: 600_000, groupMaxDelay: 500 });
    await waitFor(() => ran.length === 1, 20_000, 'the batch ran');
    assert.deepEqual(ran[0]?.payload, { group: 'slow', items: [1, 2] });
    assert.equal(await aggregating('slow'), 0);
  });

  test('members are handed over in enqueue order, payloads and headers intact', { timeout: 30_000 }, async () => {
    await reset();
    const tasks = Array.from({ length: 10 }, (_, i) => new Task('item', { i }, { headers: { n: String(i) } }));
    await client.enqueueMany(tasks.slice(0, 5), { group: 'ordered' });
    for (const t of tasks.slice(5)) await client.enqueue(t, { group: 'ordered' });
    await client.enqueue(new Task('item', Buffer.from([1, 2, 3])), { group: 'ordered' });
    let seen: Task[] = [];
    const { ran } = await startServer({
      groupAggregator: (_group, members) => {
        seen = members;
        return new Task('batch', members.length);
      },
    });
    await waitFor(() => ran.length === 1, 20_000, 'the batch ran');
    assert.deepEqual(
      seen.slice(0, 10).map((t) => t.payload),
      tasks.map((t) => t.payload),
    );
    assert.deepEqual(
      seen.slice(0, 10).map((t) => t.headers.n),
      tasks.map((_, i) => String(i)),
    );
    assert.deepEqual(seen[10]?.payload, Buffer.from([1, 2, 3]));
    assert.ok(seen.every((t) => t instanceof Task && t.type === 'item'));
  });

  test('2,000 members on stale statistics go to the aggregator in one call, in enqueue order; only their own locks go', { timeout: 60_000 }, async () => {
    await reset();
    // Statistics that say the tables are empty, as after a deploy with autovacuum behind:
    // the planner then takes the group for one row.
    await db.query('ANALYZE {{schema}}.task_states, {{schema}}.task_inputs, {{schema}}.unique_locks');
    // A member whose unique lock expired and was taken by another task with the same key.
    const stale = await client.enqueue(new Task('item', { i: -1 }), { group: 'big', unique: 60_000 });
    await db.query("UPDATE {{schema}}.unique_locks SET expires_at = now() - interval '1 second' WHERE task_id = $1", [stale.id]);
    const holder = await client.enqueue(new Task('item', { i: -1 }), { unique: 60_000, processIn: 3_600_000 });
    for (let b = 0; b < 2; b++) {
      await client.enqueueMany(
        Array.from({ length: 1000 }, (_, k) => new Task('item', { i: b * 1000 + k })),
        { group: 'big', unique: 60_000 },
      );
    }
    assert.equal((await db.query('SELECT * FROM {{schema}}.unique_locks')).length, 2001);
    const { ran, calls } = await startServer({ groupGracePeriod: 100 });
    await waitFor(() => ran.length === 1, 50_000, 'the batch ran');
    assert.equal(calls.length, 1, 'one call');
    assert.deepEqual(calls[0]?.payloads, [{ i: -1 }, ...Array.from({ length: 2000 }, (_, i) => ({ i }))]);
    assert.equal(await aggregating('big'), 0);
    assert.deepEqual(
      (await db.query('SELECT task_id FROM {{schema}}.unique_locks')).map((r) => r.task_id),
      [holder.id],
      "the members' locks are released; the other task's lock on the stale member's key stays",
    );
  });

  test("the aggregate goes to the group's queue, whatever its own options say; other queues' groups are not touched", { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueue(new Task('item', 'x'), { queue: 'foreign', group: 'g' }); // a queue this server does not serve
    await client.enqueue(new Task('item', 'y'), { queue: 'other', group: 'g' });
    const { ran } = await startServer({
      queues: { default: 1, other: 1 },
      groupAggregator: (_group, members) =>
        new Task(
          'batch',
          members.map((m) => m.payload),
          { queue: 'default', maxRetry: 2 },
        ),
    });
    await waitFor(() => ran.length === 1, 20_000, 'the batch ran');
    assert.deepEqual(ran[0], { type: 'batch', payload: ['y'], queue: 'other' });
    const rows = await db.query("SELECT queue, payload FROM {{schema}}.tasks WHERE state = 'aggregating'");
    assert.deepEqual(rows, [{ queue: 'foreign', payload: 'x' }], "the foreign queue's group waits (it is older, so it would have closed first)");
  });

  test('a scheduled task with a group is aggregated once due', { timeout: 30_000 }, async () => {
    await reset();
    const { ran } = await startServer();
    const info = await client.enqueue(new Task('item', 'later'), { group: 'timed', processIn: 600 });
    assert.equal(info.state, 'scheduled');
    assert.equal(info.group, 'timed');
    await waitFor(() => ran.length === 1, 20_000, 'the batch ran');
    assert.deepEqual(ran[0]?.payload, { group: 'timed', items: ['later'] });
    const [{ late }] = await db.query('SELECT now() >= $1::timestamptz AS late', [info.nextProcessAt]);
    assert.equal(late, true);
  });
});

describe('atomicity', () => {
  test('an aggregator that throws leaves every member aggregating and enqueues nothing; the next check retries', { timeout: 30_000 }, async () => {
    await reset();
    let fail = true;
    let attempts = 0;
    await client.enqueueMany([new Task('item', 1), new Task('item', 2), new Task('item', 3)], { group: 'fragile', unique: 60_000 });
    const { ran } = await startServer({
      groupGracePeriod: 100,
      groupAggregator: (group, members) => {
        attempts++;
        if (fail) throw new Error('aggregator broke');
        return new Task('batch', { group, items: members.map((m) => m.payload) });
      },
    });
    await waitFor(() => attempts >= 3, 20_000, 'three failed attempts');
    assert.deepEqual(await countByState(db), { aggregating: 3 });
    assert.equal((await db.query('SELECT * FROM {{schema}}.unique_locks')).length, 3, 'member locks held');
    fail = false;
    await waitFor(() => ran.length === 1, 20_000, 'the batch ran');
    assert.deepEqual(ran[0]?.payload, { group: 'fragile', items: [1, 2, 3] });
    await waitFor(async () => Object.keys(await countByState(db)).length === 0, 20_000, 'all rows gone');
    assert.equal((await db.query('SELECT * FROM {{schema}}.unique_locks')).length, 0, 'member locks released with the members');
  });

  test(
    'the aggregator runs holding no lock: a member deleted meanwhile is not aggregated, and the rest are again at the next check',
    { timeout: 30_000 },
    async () => {
      await reset();
      const infos = await client.enqueueMany([new Task('item', 1), new Task('item', 2), new Task('item', 3)], { group: 'slow' });
      // The inspector's sessions may not wait for a lock: a delete that waited for one would fail.
      const pool = noLockWaitPool();
      const inspector = new Inspector({ pool, schema: db.schema, logger: false });
      const first = deferred();
      const release = deferred();
      const calls: unknown[][] = [];
      const { ran } = await startServer({
        groupGracePeriod: 100,
        groupAggregator: async (group, members) => {
          calls.push(members.map((m) => m.payload));
          if (calls.length === 1) {
            first.resolve();
            await release.promise;
          }
          return new Task('batch', { group, items: members.map((m) => m.payload) });
        },
      });
      try {
        await first.promise;
        // While the aggregator runs, the members are not locked: deleting one does not wait for it.
        await inspector.deleteTask('default', infos[1]!.id);
        release.resolve();
        await waitFor(() => ran.length === 1, 20_000, 'one batch ran');
        // The first result, made with the deleted member, never committed: the batch is of the two left.
        assert.deepEqual(calls, [
          [1, 2, 3],
          [1, 3],
        ]);
        assert.deepEqual(ran[0]?.payload, { group: 'slow', items: [1, 3] });
        await waitFor(async () => Object.keys(await countByState(db)).length === 0, 20_000, 'all rows gone');
      } finally {
        release.resolve();
        await inspector.close();
        await pool.end();
      }
    },
  );

  test('an aggregate that cannot be enqueued (its taskId exists) or is not a Task rolls back: members stay', { timeout: 30_000 }, async () => {
    await reset();
    await client.enqueue(new Task('blocker'), { taskId: 'taken', processIn: 3_600_000 });
    await client.enqueueMany([new Task('item', 1), new Task('item', 2)], { group: 'blocked' });
    let mode: 'conflict' | 'not-a-task' | 'ok' = 'conflict';
    let attempts = 0;
    const { ran } = await startServer({
      groupGracePeriod: 100,
      groupAggregator: ((_group: string, members: Task[]) => {
        attempts++;
        if (mode === 'not-a-task') return { type: 'batch' };
        return new Task('batch', members.length, mode === 'conflict' ? { taskId: 'taken' } : {});
      }) as ServerConfig['groupAggregator'],
    });
    for (const next of ['not-a-task', 'ok'] as const) {
      const at = attempts;
      await waitFor(() => attempts >= at + 2, 20_000, `two attempts in mode ${mode}`);
      assert.equal(await aggregating('blocked'), 2, `members stay (${mode})`);
      assert.equal((await db.query("SELECT * FROM {{schema}}.tasks WHERE type = 'batch'")).length, 0);
      mode = next;
    }
    await waitFor(() => ran.length === 1, 20_000, 'the batch ran');
    assert.equal(ran[0]?.payload, 2);
    assert.equal(await aggregating('blocked'), 0);
  });

  test('commit_group() called directly deletes only members still aggregating in the named group, and only their locks', { timeout: 30_000 }, async () => {
    await reset();
    const mine = await client.enqueueMany([new Task('item', 1), new Task('item', 2)], { group: 'mine', unique: 60_000 });
    const theirs = await client.enqueue(new Task('item', 3), { group: 'theirs', unique: 60_000 });
    const pending = await client.enqueue(new Task('item', 4), { unique: 60_000 });
    const seqOf = async (id: string) => (await db.query<{ seq: string }>('SELECT seq::text AS seq FROM {{schema}}.task_inputs WHERE id = $1', [id]))[0]!.seq;
    const seqs = await Promise.all([...mine, theirs, pending].map((t) => seqOf(t.id)));
    const [committed] = await db.query<{ n: number }>("SELECT {{schema}}.commit_group('default', 'mine', $1::bigint[]) AS n", [seqs]);
    assert.equal(committed?.n, 2, 'the two members of the group; the caller rolls back on anything short of all it asked for');
    assert.deepEqual(
      (await db.query<{ id: string }>('SELECT id FROM {{schema}}.tasks ORDER BY id')).map((r) => r.id),
      [theirs.id, pending.id].sort(),
    );
    assert.deepEqual(
      (await db.query<{ task_id: string }>('SELECT task_id FROM {{schema}}.unique_locks ORDER BY task_id')).map((r) => r.task_id),
      [theirs.id, pending.id].sort(),
    );
  });

  test('two servers aggregating the same groups: each group becomes exactly one aggregate, no member lost or doubled', { timeout: 60_000 }, async () => {
    await reset();
    const groups = 20;
    const perGroup = 5;
    const batches: { group: string; items: number[] }[] = [];
    const aggregator = (group: string, members: Task[]) => new Task('batch', { group, items: members.map((m) => m.payload as number) });
    const handler = { groupGracePeriod: 200, groupAggregator: aggregator };
    const a = await startServer(handler);
    const b = await startServer(handler);
    const tasks: Task[] = [];
    for (let g = 0; g < groups; g++) for (let k = 0; k < perGroup; k++) tasks.push(new Task('item', g * perGroup + k));
    await Promise.all(Array.from({ length: groups }, (_, g) => client.enqueueMany(tasks.slice(g * perGroup, (g + 1) * perGroup), { group: `g${g}` })));
    await waitFor(() => a.ran.length + b.ran.length === groups, 30_000, 'one batch per group');
    for (const r of [...a.ran, ...b.ran]) batches.push(r.payload);
    assert.equal(new Set(batches.map((x) => x.group)).size, groups, 'one aggregate per group');
    const items = batches.flatMap((x) => x.items).sort((p, q) => p - q);
    assert.deepEqual(
      items,
      Array.from({ length: groups * perGroup }, (_, i) => i),
      'every member exactly once',
    );
    for (const x of batches)
      assert.deepEqual(
        x.items,
        [...x.items].sort((p, q) => p - q),
        'enqueue order',
      );
    assert.equal((await db.query("SELECT * FROM {{schema}}.tasks WHERE state = 'aggregating'")).length, 0);
  });
});
