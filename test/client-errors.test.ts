/**
 * What the Client refuses: bad input (a ValidationError naming the field,
 * nothing written, no SQL sent), a closed Client, a schema that was never
 * migrated, and a database that does not exist.
 */
import { describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import {
  Client,
  ClientClosedError,
  DatabaseUnavailableError,
  FailedPreconditionError,
  InvalidOptionError,
  InvalidQueueNameError,
  InvalidSchemaNameError,
  InvalidTaskIdError,
  InvalidTaskTypeError,
  PayloadSerializationError,
  PayloadTooLargeError,
  Task,
  ValidationError,
  type EnqueueOptions,
} from '../src/index.js';
import { caught, dsnWith, test } from './helpers.js';
import { MIB, setupClient } from './client-kit.js';

const SCHEMA = 't_client_errors';
const { db, counts, countIn } = setupClient(SCHEMA);

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
