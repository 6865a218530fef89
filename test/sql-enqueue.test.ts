/**
 * enqueue() in SQL (migration 0008): from psql with named arguments and from
 * a trigger, with the library's defaults, validation, conflicts, routing
 * (pending or scheduled), priority and wake-up, checked against what the
 * library's own enqueue writes and says.
 */
import assert from 'node:assert/strict';
import { before, beforeEach, describe } from 'node:test';
import pg from 'pg';
import { Task, TaskIdConflictError, ValidationError, type TaskInfo } from '../src/index.js';
import { toRecord, validateOptions } from '../src/model/task.js';
import { caught, setupDb, test, waitFor } from './helpers.js';

const { db, client, inspector, startServer } = setupDb('t_sql_enqueue', {
  resetEach: true,
  teardown: () => db.pool.query(`DROP SCHEMA IF EXISTS "${app}" CASCADE`),
  server: { concurrency: 2 },
});
/** The schema of the application's own tables (the trigger test's orders). */
const app = `${db.schema}_app`;

/** `SELECT schema.enqueue(<args>)`: the task id. */
async function enqueueSql(args: string, values?: unknown[]): Promise<string> {
  const rows = await db.query<{ id: string }>(`SELECT {{schema}}.enqueue(${args}) AS id`, values);
  return rows[0]!.id;
}

/** What the rows hold of a task, without what differs from one enqueue to the next (ids, positions, times). */
const stored = async (queue: string, id: string) =>
  (
    await db.query(
      `SELECT i.type, i.payload, i.payload_bytes, i.headers, i.max_retry, extract(epoch FROM i.timeout)::int AS timeout_s, i.deadline,
              i.unique_key, extract(epoch FROM i.retention)::int AS retention_s, s.state, s.pending_seq = s.seq AS own_position,
              s.run_at = i.enqueued_at AS due_at_enqueue, s.retried, s.group_key,
              s.lease_owner, s.cancel_requested, s.waiting_for, s.has_dependents, s.priority, s.concurrency_key
       FROM {{schema}}.task_inputs i JOIN {{schema}}.task_states s ON s.seq = i.seq WHERE i.queue = $1 AND i.id = $2`,
      [queue, id],
    )
  )[0];

const counts = async () =>
  (
    await db.query<{ inputs: number; states: number; queues: number }>(
      `SELECT (SELECT count(*) FROM {{schema}}.task_inputs)::int AS inputs, (SELECT count(*) FROM {{schema}}.task_states)::int AS states,
              (SELECT count(*) FROM {{schema}}.queues)::int AS queues`,
    )
  )[0];

const UUID_V7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

describe('enqueue() from psql', () => {
  test('named arguments, the library defaults: the same rows and TaskInfo as Client.enqueue', async () => {
    const id = await enqueueSql(`'email:welcome', '{"user": 42}'`);
    assert.match(id, UUID_V7, 'a UUID version 7, as the library generates');
    const lib = await client.enqueue(new Task('email:welcome', { user: 42 }));
    assert.deepEqual(await stored('default', id), await stored('default', lib.id));
    assert.deepEqual([(await stored('default', id))!.timeout_s, (await stored('default', id))!.state], [1800, 'pending']);

    // Every option, by name and in any order.
    const named = await enqueueSql(
      `type => 'report:daily', concurrency_key => 'tenant-7', priority => 7, max_retry => 3, task_id => 'r-1', queue => 'reports', payload => $1::jsonb`,
      [JSON.stringify({ day: '2026-12-01' })],
    );
    assert.equal(named, 'r-1');
    await client.enqueue(new Task('report:daily', { day: '2026-12-01' }), {
      queue: 'reports',
      taskId: 'r-2',
      maxRetry: 3,
      priority: 7,
      concurrencyKey: 'tenant-7',
    });
    assert.deepEqual(await stored('reports', 'r-1'), await stored('reports', 'r-2'));

    // Read back through the Inspector: priority and concurrencyKey included.
    const strip = ({ id: _id, enqueuedAt: _e, nextProcessAt: _n, ...rest }: TaskInfo) => rest;
    const bySql = await inspector.getTaskInfo('reports', 'r-1');
    assert.deepEqual([bySql.priority, bySql.concurrencyKey, bySql.maxRetry, bySql.timeout, bySql.state], [7, 'tenant-7', 3, 1_800_000, 'pending']);
    assert.deepEqual(strip(bySql), strip(await inspector.getTaskInfo('reports', 'r-2')));
    assert.deepEqual((await inspector.queues()).sort(), ['default', 'reports'], 'the queue registry');

    // No payload: SQL NULL and JSON null alike, as the library stores null.
    const none = await enqueueSql(`'t', NULL`);
    const jsonNull = await enqueueSql(`'t', 'null'`);
    for (const t of [none, jsonNull]) assert.equal((await stored('default', t))!.payload, null);
    assert.equal((await inspector.getTaskInfo('default', jsonNull)).payload, null);
  });

  test('process_at later than now(): scheduled, due then; else pending; each wakes its channel at commit', async () => {
    const listener = new pg.Client({ connectionString: db.connectionString });
    await listener.connect();
    const heard: [string, string][] = [];
    listener.on('notification', (n) => heard.push([n.channel, n.payload ?? '']));
    await listener.query(`LISTEN "${db.schema}_tasks"; LISTEN "${db.schema}_delayed"`);
    try {
      const c = await db.pool.connect();
      try {
        await c.query('BEGIN');
        const [{ later, due }] = (
          await c.query(`SELECT "${db.schema}".enqueue('t', process_at => now() + interval '1 hour') AS later, now() + interval '1 hour' AS due`)
        ).rows;
        await c.query(`SELECT "${db.schema}".enqueue('t', queue => 'now', process_at => now())`);
        await c.query(`SELECT "${db.schema}".enqueue('t', queue => 'past', process_at => now() - interval '1 day')`);
        const info = await inspector.getTaskInfo('default', later).catch((err: unknown) => err);
        assert.ok(info instanceof Error, 'not visible before the commit');
        assert.deepEqual(heard, [], 'nothing heard before the commit');
        await c.query('COMMIT');
        const scheduled = await inspector.getTaskInfo('default', later);
        assert.equal(scheduled.state, 'scheduled');
        assert.equal(scheduled.nextProcessAt?.getTime(), (due as Date).getTime());
      } finally {
        c.release();
      }
      await waitFor(() => heard.length === 3, 5000, 'three notifications');
      assert.deepEqual(
        heard.sort(),
        [
          [`${db.schema}_delayed`, 'default'],
          [`${db.schema}_tasks`, 'now'],
          [`${db.schema}_tasks`, 'past'],
        ].sort(),
      );
      assert.deepEqual((await inspector.listPendingTasks('now')).length, 1);
      assert.deepEqual((await inspector.listPendingTasks('past')).length, 1);
    } finally {
      await listener.end();
    }
  });

  test('a scheduled task runs when due: its notification wakes the forwarder', { timeout: 30_000 }, async () => {
    const ran: string[] = [];
    // The forwarder and the claim loop sleep a minute unless woken.
    await startServer((_t, ctx) => void ran.push(ctx.taskId), { taskCheckInterval: 60_000, delayedTaskCheckInterval: 60_000 });
    await enqueueSql(`'t', task_id => 'soon', process_at => now() + interval '500 milliseconds'`);
    await waitFor(() => ran.includes('soon'), 10_000, 'the scheduled task run');
  });

  test('a task id already in the queue: 23505, as TaskIdConflictError says it; nothing written', async () => {
    await client.enqueue(new Task('t', null), { queue: 'q', taskId: 'dup' });
    await enqueueSql(`'t', queue => 'other', task_id => 'dup'`); // another queue: fine
    const before = await counts();
    for (const args of [`'t', queue => 'q', task_id => 'dup'`, `'x', '{"a": 1}', queue => 'q', task_id => 'dup', process_at => now() + interval '1 hour'`]) {
      const err = (await caught(() => enqueueSql(args))) as pg.DatabaseError;
      assert.equal(err.code, '23505');
      assert.equal(err.message, `pgasynq: ${new TaskIdConflictError('q', 'dup').message}`);
      assert.deepEqual([err.column, err.constraint, err.table, err.schema], ['task_id', 'task_inputs_queue_id_key', 'task_inputs', db.schema]);
      assert.equal(err.detail, 'Key (queue, id)=(q, dup) already exists.');
    }
    assert.deepEqual(await counts(), before);
    assert.equal((await inspector.getTaskInfo('q', 'dup')).type, 't');
  });
});

/** The library's rule for the same input, from the error it throws. */
function libraryRule(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof ValidationError, String(err));
    return err.rule;
  }
  assert.fail('the library accepted it');
}

describe('refusals', () => {
  // Each case: the arguments, the field, and the library's rule for the same value
  // (or its opening, where the library's message goes on: a path, an option name).
  // A good queue is given where the queue is not the bad field: a registry row would show.
  const big = 'x'.repeat(1_048_575); // 1,048,577 bytes as JSON
  // The innermost array 65 levels below the top: one too deep.
  const deep = '['.repeat(66) + ']'.repeat(66);
  type Case = { name: string; args: string; values?: unknown[]; field: string; rule: string; prefix?: boolean };
  /**
   * A case of one bad option (`arg` is `field => value`) on an otherwise good
   * call; `rule` is the message's, or the options whose refusal by the library gives it.
   */
  const refused = (name: string, arg: string, rule: string | Record<string, unknown>): Case => ({
    name,
    args: `'t', queue => 'refused', ${arg}`,
    field: arg.split(' => ')[0]!,
    rule: typeof rule === 'string' ? rule : libraryRule(() => validateOptions(rule)),
  });
  const cases: Case[] = [
    { name: 'type NULL', args: `NULL, queue => 'refused'`, field: 'type', rule: 'must not be NULL' },
    { name: 'type empty', args: `'', queue => 'refused'`, field: 'type', rule: libraryRule(() => new Task('')) },
    { name: 'type blank', args: `E' \\t\\u3000', queue => 'refused'`, field: 'type', rule: libraryRule(() => new Task(' \t\u3000')) },
    { name: 'type too long', args: `repeat('😀', 51), queue => 'refused'`, field: 'type', rule: libraryRule(() => new Task('😀'.repeat(51))) },
    { name: 'type control', args: `E'a\\u0085b', queue => 'refused'`, field: 'type', rule: libraryRule(() => new Task('a\u0085b')) },
    {
      name: 'payload too deep',
      args: `'t', $1::jsonb, queue => 'refused'`,
      values: [deep],
      field: 'payload',
      rule: libraryRule(() => new Task('t', JSON.parse(deep))),
      prefix: true,
    },
    {
      name: 'payload too large',
      args: `'t', $1::jsonb, queue => 'refused'`,
      values: [JSON.stringify(big)],
      field: 'payload',
      rule: libraryRule(() => toRecord(new Task('t', big), {})).replace(' (option maxPayloadBytes)', ''),
    },
    { name: 'queue NULL', args: `'t', queue => NULL`, field: 'queue', rule: 'must not be NULL' },
    { name: 'queue empty', args: `'t', queue => ''`, field: 'queue', rule: libraryRule(() => validateOptions({ queue: '' })) },
    { name: 'queue too long', args: `'t', queue => repeat('q', 101)`, field: 'queue', rule: libraryRule(() => validateOptions({ queue: 'q'.repeat(101) })) },
    { name: 'queue charset', args: `'t', queue => 'a b'`, field: 'queue', rule: libraryRule(() => validateOptions({ queue: 'a b' })) },
    { name: 'queue astral', args: `'t', queue => 'a😀'`, field: 'queue', rule: libraryRule(() => validateOptions({ queue: 'a😀' })) },
    refused('max_retry high', `max_retry => 1001`, { maxRetry: 1001 }),
    refused('max_retry negative', `max_retry => -1`, { maxRetry: -1 }),
    refused('max_retry NULL', `max_retry => NULL`, 'must be an integer in [0, 1000] (got NULL)'),
    refused('task_id empty', `task_id => ''`, { taskId: '' }),
    refused('task_id first', `task_id => '../x'`, { taskId: '../x' }),
    refused('task_id charset', `task_id => E'x\\n'`, { taskId: 'x\n' }),
    refused('task_id too long', `task_id => repeat('i', 129)`, { taskId: 'i'.repeat(129) }),
    refused('process_at infinity', `process_at => 'infinity'`, 'must be a time in years 1–9999 (got infinity)'),
    // Past what a JavaScript Date holds: every reader (CLI, dashboard) would fail on it.
    refused('process_at past year 9999', `process_at => '280000-01-01 00:00:00+00'`, 'must be a time in years 1–9999 (got 280000-01-01 00:00:00+00)'),
    refused('priority high', `priority => 101`, { priority: 101 }),
    refused('priority low', `priority => -101`, { priority: -101 }),
    refused('priority NULL', `priority => NULL`, 'must be an integer in [-100, 100] (got NULL)'),
    refused('concurrency_key blank', `concurrency_key => '  '`, { concurrencyKey: '  ' }),
    refused('concurrency_key too long', `concurrency_key => repeat('k', 201)`, { concurrencyKey: 'k'.repeat(201) }),
    refused('concurrency_key control', `concurrency_key => E'k\\x7f'`, { concurrencyKey: 'k\x7f' }),
  ];

  for (const c of cases) {
    test(`${c.name}: SQLSTATE 22023, the field in COLUMN, the library's rule; nothing written`, async () => {
      await client.enqueue(new Task('kept', null), { queue: 'default' });
      const before = await counts();
      const err = (await caught(() => enqueueSql(c.args, c.values))) as pg.DatabaseError;
      assert.equal(err.code, '22023', err.message);
      assert.equal(err.column, c.field);
      if (c.prefix) assert.ok(err.message.startsWith(`pgasynq: invalid ${c.field}: ${c.rule.replace(/ at \$.*$/, '')}`), err.message);
      else assert.equal(err.message, `pgasynq: invalid ${c.field}: ${c.rule}`);
      assert.deepEqual(await counts(), before, 'nothing written');
    });
  }

  // The other side of each rule: the last value both take. Each case runs through
  // the library (new Task, validateOptions) and enqueue(), and both must take it.
  const taken: { name: string; args: string; library: () => unknown }[] = [
    { name: 'type of 100 characters', args: `repeat('t', 100)`, library: () => new Task('t'.repeat(100)) },
    { name: 'type of 50 astral characters (100 UTF-16 units)', args: `repeat('😀', 50)`, library: () => new Task('😀'.repeat(50)) },
    { name: 'queue of 100 characters', args: `'t', queue => repeat('q', 100)`, library: () => validateOptions({ queue: 'q'.repeat(100) }) },
    { name: 'queue of every allowed character', args: `'t', queue => 'aZ09_.:-'`, library: () => validateOptions({ queue: 'aZ09_.:-' }) },
    { name: 'max_retry 0', args: `'t', max_retry => 0`, library: () => validateOptions({ maxRetry: 0 }) },
    { name: 'max_retry 1000', args: `'t', max_retry => 1000`, library: () => validateOptions({ maxRetry: 1000 }) },
    { name: 'task_id of 128 characters', args: `'t', task_id => repeat('i', 128)`, library: () => validateOptions({ taskId: 'i'.repeat(128) }) },
    { name: 'priority 100', args: `'t', priority => 100`, library: () => validateOptions({ priority: 100 }) },
    { name: 'priority -100', args: `'t', priority => -100`, library: () => validateOptions({ priority: -100 }) },
    {
      name: 'concurrency_key of 200 characters',
      args: `'t', concurrency_key => repeat('k', 200)`,
      library: () => validateOptions({ concurrencyKey: 'k'.repeat(200) }),
    },
    {
      name: 'process_at in year 9999',
      args: `'t', process_at => '9999-12-31 23:59:59+00'`,
      library: () => validateOptions({ processAt: new Date('9999-12-31T23:59:59Z') }),
    },
  ];
  for (const c of taken) {
    test(`${c.name}: taken by the library and by enqueue()`, async () => {
      c.library();
      const id = await enqueueSql(c.args);
      assert.ok(id.length > 0);
    });
  }

  test('the largest payload the library takes is taken: its size is JSON.stringify’s, not jsonb’s spaced text', async () => {
    // 1,045 strings of 1,000: 1,048,136 bytes compact (the library's measure), 1,049,180 as jsonb prints it.
    const payload = Array.from({ length: 1045 }, () => 'x'.repeat(1000));
    toRecord(new Task('t', payload), {});
    const id = await enqueueSql(`'t', $1::jsonb`, [JSON.stringify(payload)]);
    assert.equal(((await inspector.getTaskInfo('default', id)).payload as string[]).length, 1045);
    // And 64 levels deep is as deep as it goes.
    const deepest = '['.repeat(65) + ']'.repeat(65);
    new Task('t', JSON.parse(deepest));
    await enqueueSql(`'t', $1::jsonb`, [deepest]);
  });
});

describe('enqueue() from a trigger', () => {
  before(async () => {
    await db.pool.query(`DROP SCHEMA IF EXISTS "${app}" CASCADE; CREATE SCHEMA "${app}"`);
    await db.pool.query(`
      CREATE TABLE "${app}".orders (id int PRIMARY KEY, customer text NOT NULL, total numeric NOT NULL, priority int NOT NULL DEFAULT 0);
      CREATE FUNCTION "${app}".orders_confirm() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        PERFORM "${db.schema}".enqueue('order:confirm', jsonb_build_object('order', NEW.id, 'total', NEW.total),
                                       queue => 'orders', task_id => 'order-' || NEW.id, priority => NEW.priority,
                                       concurrency_key => NEW.customer);
        RETURN NEW;
      END
      $$;
      CREATE TRIGGER orders_confirm AFTER INSERT ON "${app}".orders FOR EACH ROW EXECUTE FUNCTION "${app}".orders_confirm();`);
  });

  beforeEach(async () => {
    await db.pool.query(`TRUNCATE "${app}".orders`);
  });

  test('an AFTER INSERT trigger enqueues, and a running Server processes the task (woken by its notification)', { timeout: 30_000 }, async () => {
    const confirmed: unknown[] = [];
    // Claims only when woken: the claim loop sleeps a minute otherwise.
    await startServer((task) => void confirmed.push(task.payload), { queues: { orders: 1 }, taskCheckInterval: 60_000 });
    await db.pool.query(`INSERT INTO "${app}".orders (id, customer, total) VALUES (1, 'ada', 12.5), (2, 'bob', 30)`);
    await waitFor(() => confirmed.length === 2, 10_000, 'both orders confirmed');
    assert.deepEqual(
      confirmed.sort((a, b) => (a as { order: number }).order - (b as { order: number }).order),
      [
        { order: 1, total: 12.5 },
        { order: 2, total: 30 },
      ],
    );

    // The enqueue is part of the insert's transaction: rolled back with it.
    const c = await db.pool.connect();
    try {
      await c.query('BEGIN');
      await c.query(`INSERT INTO "${app}".orders (id, customer, total) VALUES (3, 'cy', 1)`);
      await c.query('ROLLBACK');
    } finally {
      c.release();
    }
    await db.pool.query(`INSERT INTO "${app}".orders (id, customer, total) VALUES (4, 'dee', 2)`);
    await waitFor(() => confirmed.length === 3, 10_000, 'the committed order confirmed');
    assert.deepEqual(confirmed[2], { order: 4, total: 2 });
    await waitFor(async () => (await counts())!.states === 0, 5000, 'each ran once and is gone; order 3 never was');
  });

  test('a refused enqueue fails the insert: the row is not written either', async () => {
    const err = (await caught(() =>
      db.pool.query(`INSERT INTO "${app}".orders (id, customer, total, priority) VALUES (1, 'ada', 1, 500)`),
    )) as pg.DatabaseError;
    assert.deepEqual([err.code, err.column], ['22023', 'priority']);
    assert.deepEqual(await counts(), { inputs: 0, states: 0, queues: 0 });
    // Order 1 again, after its row was deleted: its task id is taken.
    await db.pool.query(`INSERT INTO "${app}".orders (id, customer, total) VALUES (1, 'ada', 1)`);
    await db.pool.query(`DELETE FROM "${app}".orders`);
    const dup = (await caught(() => db.pool.query(`INSERT INTO "${app}".orders (id, customer, total) VALUES (1, 'ada', 1)`))) as pg.DatabaseError;
    assert.deepEqual([dup.code, dup.column], ['23505', 'task_id']);
    assert.equal((await db.pool.query(`SELECT count(*)::int AS n FROM "${app}".orders`)).rows[0].n, 0);
    assert.deepEqual(await counts(), { inputs: 1, states: 1, queues: 1 });
  });

  test('priority: the higher priorities enqueued by the trigger are claimed first, FIFO within one', { timeout: 30_000 }, async () => {
    const rows: [number, number][] = [
      [1, 0],
      [2, 5],
      [3, 0],
      [4, -3],
      [5, 5],
      [6, 100],
      [7, 0],
      [8, -100],
    ];
    // One statement, rows in id order: the trigger fires for each in turn.
    await db.pool.query(
      `INSERT INTO "${app}".orders (id, customer, total, priority) SELECT id, 'c' || id, 1, p FROM unnest($1::int[], $2::int[]) AS r(id, p) ORDER BY id`,
      [rows.map(([id]) => id), rows.map(([, p]) => p)],
    );
    const six = await inspector.getTaskInfo('orders', 'order-6');
    assert.deepEqual([six.priority, six.concurrencyKey], [100, 'c6']);
    const ran: string[] = [];
    await startServer((_t, ctx) => void ran.push(ctx.taskId), { queues: { orders: 1 }, concurrency: 1 });
    await waitFor(() => ran.length === rows.length, 10_000, 'every order');
    assert.deepEqual(ran, ['order-6', 'order-2', 'order-5', 'order-1', 'order-3', 'order-7', 'order-4', 'order-8']);
  });
});
