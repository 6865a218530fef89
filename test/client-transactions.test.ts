/**
 * The Client and commits: enqueue inside your transaction (a pg client after
 * BEGIN, a Kysely Transaction), the NOTIFY an enqueue sends (at COMMIT, never
 * after ROLLBACK), and synchronous_commit on the Client's own pool.
 */
import { describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import { Client, Task } from '../src/index.js';
import { test, waitFor } from './helpers.js';
import { setupClient } from './client-kit.js';

const { db, client, row, mustRow, counts, countIn } = setupClient('t_client_transactions');

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

describe('durability of an acknowledged enqueue', () => {
  test("a Client's own pool commits with synchronous_commit on whatever PGOPTIONS says (and keeps the rest of it); a pool of yours keeps its settings", async () => {
    // A trigger notes the settings of the session that inserts each task: the enqueue's own.
    await db.query(`CREATE TABLE {{schema}}.commit_settings (id text, synchronous_commit text, lock_timeout text);
      CREATE FUNCTION {{schema}}.note_commit_settings() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        INSERT INTO ${`"${db.schema}"`}.commit_settings VALUES (NEW.id, current_setting('synchronous_commit'), current_setting('lock_timeout'));
        RETURN NEW;
      END $$;
      CREATE TRIGGER note_commit_settings AFTER INSERT ON {{schema}}.task_inputs FOR EACH ROW EXECUTE FUNCTION {{schema}}.note_commit_settings()`);
    const saved = process.env.PGOPTIONS;
    process.env.PGOPTIONS = '-c synchronous_commit=off -c lock_timeout=12345ms';
    const own = new Client({ connectionString: db.connectionString, schema: db.schema });
    const yours = new pg.Pool({ connectionString: db.connectionString, max: 1 });
    const onYours = new Client({ pool: yours, schema: db.schema });
    try {
      const a = await own.enqueue(new Task('durable:own'));
      const b = await onYours.enqueue(new Task('durable:yours'));
      const rows = await db.query<{ id: string; synchronous_commit: string; lock_timeout: string }>('SELECT * FROM {{schema}}.commit_settings');
      const by = new Map(rows.map((r) => [r.id, r]));
      assert.equal(by.get(a.id)?.synchronous_commit, 'on', "the Client's own session waits for the WAL flush");
      assert.equal(by.get(a.id)?.lock_timeout, '12345ms', 'the rest of PGOPTIONS is kept');
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
