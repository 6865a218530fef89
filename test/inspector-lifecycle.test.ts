/**
 * The Inspector's edges: bad arguments refused before any SQL, close(), a
 * schema never migrated, a borrowed pool, and migrations rolled back and
 * applied again.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import pg from 'pg';
import { ClientClosedError, FailedPreconditionError, Inspector, ValidationError, migrate, migrateDown } from '../src/index.js';
import { MIGRATIONS, test } from './helpers.js';
import { QUEUE_METHODS, setupInspector } from './inspector-kit.js';

const { db } = setupInspector('t_inspector_lifecycle');

describe('validation, closing, migration', () => {
  test('bad arguments are ValidationErrors naming the field, raised before any SQL', async () => {
    // Nothing listens on port 1: a method that reached the database would fail with ECONNREFUSED instead.
    const offline = new Inspector({ connectionString: 'postgres://u@127.0.0.1:1/x', schema: db.schema });
    try {
      for (const [name, call] of QUEUE_METHODS) {
        for (const bad of ['', 'a b', 42, undefined, 'x'.repeat(101)]) {
          await assert.rejects(call(offline, bad as string), (e: unknown) => e instanceof ValidationError && e.field === 'queue', `${name}(${String(bad)})`);
        }
      }
      const calls: [string, () => Promise<unknown>][] = [
        ['taskId', () => offline.getTaskInfo('q', '../x')],
        ['taskId', () => offline.deleteTask('q', '')],
        ['taskId', () => offline.runTask('q', 7 as never)],
        ['taskId', () => offline.archiveTask('q', 'a b')],
        ['taskId', () => offline.updateTaskPayload('q', 'x y', {})],
        ['taskId', () => offline.cancelProcessing('')],
        ['payload', () => offline.updateTaskPayload('q', 'x', () => 1)],
        ['group', () => offline.listAggregatingTasks('q', '')],
        ['group', () => offline.deleteAllAggregatingTasks('q', undefined as never)],
        ['group', () => offline.runAllAggregatingTasks('q', 'a/b')],
        ['group', () => offline.archiveAllAggregatingTasks('q', 3 as never)],
        ['days', () => offline.history('q', 0)],
        ['force', () => offline.deleteQueue('q', 'yes' as never)],
        ['pageSize', () => offline.listRetryTasks('q', { pageSize: 5000 })],
        ['entryId', () => offline.listSchedulerEnqueueEvents(5 as never)],
      ];
      for (const [field, call] of calls) {
        await assert.rejects(call(), (e: unknown) => e instanceof ValidationError && e.field === field, field);
      }
    } finally {
      await offline.close();
    }
  });

  test('after close() every method rejects with ClientClosedError; close twice is fine', async () => {
    const ins = new Inspector({ connectionString: db.connectionString, schema: db.schema });
    await ins.queues();
    await ins[Symbol.asyncDispose]();
    await ins.close();
    await assert.rejects(ins.queues(), ClientClosedError);
    await assert.rejects(ins.getQueueInfo('default'), ClientClosedError);
    await assert.rejects(ins.servers(), ClientClosedError);
    await assert.rejects(ins.cancelProcessing('x'), ClientClosedError);
  });

  test('a schema that was never migrated: reads and actions reject with FailedPreconditionError saying to migrate; nothing is created', async () => {
    const schema = `${db.schema}_never`;
    await db.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    const ins = new Inspector({ connectionString: db.connectionString, schema, logger: false });
    const calls: [string, () => Promise<unknown>][] = [
      ['queues', () => ins.queues()],
      ['getQueueInfo', () => ins.getQueueInfo('default')],
      ['history', () => ins.history('default', 7)],
      ['getTaskInfo', () => ins.getTaskInfo('default', 'x')],
      ['listPendingTasks', () => ins.listPendingTasks('default')],
      ['listArchivedTasks', () => ins.listArchivedTasks('default', { page: 2 })],
      ['servers', () => ins.servers()],
      ['schedulerEntries', () => ins.schedulerEntries()],
      ['pauseQueue', () => ins.pauseQueue('default')],
      ['deleteQueue', () => ins.deleteQueue('default', true)],
      ['runAllArchivedTasks', () => ins.runAllArchivedTasks('default')],
      ['deleteTask', () => ins.deleteTask('default', 'x')],
      ['cancelProcessing', () => ins.cancelProcessing('x')],
    ];
    try {
      for (const [name, call] of calls) {
        await assert.rejects(call(), (e: unknown) => {
          assert.ok(e instanceof FailedPreconditionError, `${name}: ${String(e)}`);
          assert.match(e.message, /^schema "\w+_never" is not migrated \(.* does not exist\): run `pgasynq migrate` \(or migrate\(\)\) first$/, name);
          return true;
        });
      }
      assert.equal((await db.pool.query('SELECT 1 FROM pg_namespace WHERE nspname = $1', [schema])).rowCount, 0, 'no schema was created');
    } finally {
      await ins.close();
    }
  });

  test('a borrowed pool is not ended by close()', async () => {
    const pool = new pg.Pool({ connectionString: db.connectionString, max: 1 });
    const ins = new Inspector({ pool, schema: db.schema });
    await ins.queues();
    await ins.close();
    assert.deepEqual((await pool.query('SELECT 1 AS one')).rows, [{ one: 1 }]);
    await pool.end();
  });

  test('every migration down to 0002 rolls back, and all apply again', async () => {
    const schema = `${db.schema}_mig`;
    await db.pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    const opts = { connectionString: db.connectionString, schema, logger: false as const };
    await migrate(opts);
    const objects = () =>
      db.pool
        .query(
          `SELECT to_regclass('"${schema}".queue_stats')::text AS v, to_regclass('"${schema}".active_tasks')::text AS a, to_regclass('"${schema}".tasks_due_queue_idx')::text AS i`,
        )
        .then((r) => r.rows[0]);
    const activeIndex = () => db.pool.query(`SELECT pg_get_indexdef(to_regclass('"${schema}".tasks_active_idx')) AS def`).then((r) => r.rows[0].def as string);
    // Each migration after 0004 in turn, newest first, the views standing throughout.
    for (const name of MIGRATIONS.slice(4).reverse()) assert.equal(await migrateDown(opts), name);
    assert.ok((await objects()).v);
    assert.equal(await migrateDown(opts), '0004_storage_v2');
    assert.ok((await objects()).v && (await objects()).a && (await objects()).i);
    assert.match(await activeIndex(), /\(queue, started_at, seq\) WHERE \(\(state = 'active'::text\) AND \(lease_owner IS NOT NULL\)\)/);
    assert.equal(await migrateDown(opts), '0003_active_index');
    assert.match(await activeIndex(), /\(lease_expires_at\) WHERE \(state = 'active'::text\)$/);
    assert.equal(await migrateDown(opts), '0002_views');
    assert.deepEqual(await objects(), { v: null, a: null, i: null });
    assert.deepEqual(await migrate(opts), { applied: MIGRATIONS.slice(1) });
    assert.ok((await objects()).v);
    await db.pool.query(`DROP SCHEMA "${schema}" CASCADE`);
  });
});
