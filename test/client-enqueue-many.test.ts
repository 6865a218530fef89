/**
 * Client.enqueueMany: one call, results aligned with the input, the caller's
 * order kept, options for every task, and all-or-nothing on any refusal.
 */
import { describe } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { DuplicateTaskError, Task, TaskIdConflictError, ValidationError, type EnqueueOptions } from '../src/index.js';
import { caught, test } from './helpers.js';
import { setupClient } from './client-kit.js';

const { db, client, mustRow, counts, lockRows, countIn } = setupClient('t_client_enqueue_many');

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

describe('what an enqueue reads', () => {
  /** In a session of its own (a backend's counts not yet flushed show in pg_stat_xact_* too), the enqueues' seq scans of the task tables. */
  async function seqScans(calls: object[][]): Promise<[string, string][]> {
    const conn = new pg.Client({ connectionString: db.connectionString });
    await conn.connect();
    try {
      await conn.query('BEGIN');
      for (const rows of calls) await conn.query(`SELECT * FROM "${db.schema}".enqueue_tasks($1::json, now(), false)`, [JSON.stringify(rows)]);
      // pg_stat_xact_user_tables: this transaction's own scans, counted as they run.
      const { rows } = await conn.query<{ name: string; n: string }>(
        `SELECT relname AS name, seq_scan::text AS n FROM pg_stat_xact_user_tables
         WHERE schemaname = $1 AND relname IN ('task_states', 'task_inputs', 'unique_locks') ORDER BY 1`,
        [db.schema],
      );
      return rows.map((r) => [r.name, r.n]);
    } finally {
      await conn.query('ROLLBACK');
      await conn.end();
    }
  }
  const none = [
    ['task_inputs', '0'],
    ['task_states', '0'],
    ['unique_locks', '0'],
  ];
  const row = { q: 'scan', t: 'scan:t', m: 1, to: 1000 };

  test('no table is read whole: the stored tasks and unique locks only by key, with or without a unique key or a dependency', async () => {
    // A generic plan read task_states from its start (a hash join) at every enqueue: through
    // every dead row a held transaction kept there (W8, issue 30).
    await client.enqueueMany(Array.from({ length: 50 }, (_, i) => new Task('scan:seed', { i }, { queue: 'scan' })));
    // Planned in a new session on tables never analyzed (as on a new schema): a plain enqueue reads none.
    assert.deepEqual(await seqScans([[{ ...row, i: 'scan-0' }]]), none);
    // With enough rows, analyzed, that reading a table whole is not the planner's cheapest choice:
    // no kind of enqueue reads one whole.
    await client.enqueueMany(Array.from({ length: 5_000 }, (_, i) => new Task('scan:seed', { i }, { queue: 'scan', unique: 60_000 })));
    await client.enqueue(new Task('scan:dep', null), { queue: 'scan', taskId: 'scan-dep' });
    await db.query('ANALYZE {{schema}}.task_states; ANALYZE {{schema}}.task_inputs; ANALYZE {{schema}}.unique_locks');
    assert.deepEqual(
      await seqScans([[{ ...row, i: 'scan-1' }], [{ ...row, i: 'scan-2', u: 'k', ut: 60_000 }], [{ ...row, i: 'scan-3', dp: [['scan', 'scan-dep']] }]]),
      none,
    );
  });
});
