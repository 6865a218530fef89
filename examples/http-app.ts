/**
 * An HTTP app (Express) that enqueues inside its own database transaction:
 * POST /orders inserts the order and enqueues its confirmation task in one
 * transaction, so there is never an order without its task, nor a task without
 * its order. The handler marks the order confirmed in ctx.transaction, which
 * commits together with the task's completion. The orders table is the app's
 * own, examples.orders, created on start.
 *
 *   npx tsx examples/http-app.ts            # serves on http://127.0.0.1:3000 until Ctrl-C (SIGINT)
 *   npx tsx examples/http-app.ts --smoke    # places 5 orders itself, waits for their confirmations, exits
 *
 * (From the repository root.) Runs on an embedded PostgreSQL when DATABASE_URL
 * is unset (see connect.ts); copied into a project, it also needs
 * `npm install express pg` (and @types/express for tsc).
 */
import express from 'express';
import type { AddressInfo } from 'node:net';
import pg from 'pg';
import { Client, Server, Task, type EmbeddedClient } from 'pgasynq';
import { connect } from './connect.js';

const { conn, embedded } = await connect();
const pool = embedded ? undefined : new pg.Pool({ connectionString: conn.connectionString });
/** A connection of the app's own: from the embedded database or from the app's pool. */
const begin = async (): Promise<EmbeddedClient | pg.PoolClient> => (embedded ? embedded.connect() : pool!.connect());

const setup = await begin();
await setup.query('CREATE TABLE IF NOT EXISTS examples.orders (id serial PRIMARY KEY, item text NOT NULL, confirmed boolean NOT NULL DEFAULT false)');
setup.release();

const client = new Client(conn);
const server = new Server({
  ...conn,
  concurrency: 2,
});
const confirmed: number[] = [];
await server.start(async (task, ctx) => {
  const { orderId } = task.payload as { orderId: number };
  // The confirmation and the email's bookkeeping commit together, fenced by the lease.
  await ctx.transaction(async (trx) => {
    await trx.updateTable('examples.orders').set({ confirmed: true }).where('id', '=', orderId).execute();
  });
  confirmed.push(orderId);
  console.log(`order ${orderId} confirmed`);
});

const app = express().use(express.json());
app.post('/orders', async (req, res) => {
  const item = String(req.body?.item ?? '');
  if (item === '') return void res.status(400).json({ error: 'item is required' });
  const db = await begin();
  try {
    await db.query('BEGIN');
    const { rows } = await db.query('INSERT INTO examples.orders (item) VALUES ($1) RETURNING id', [item]);
    const orderId = (rows[0] as { id: number }).id;
    await client.enqueue(new Task('order:confirm', { orderId }), { tx: db });
    await db.query('COMMIT');
    res.status(201).json({ orderId });
  } catch (err) {
    await db.query('ROLLBACK');
    res.status(500).json({ error: (err as Error).message });
  } finally {
    db.release();
  }
});

const http = app.listen(process.argv.includes('--smoke') ? 0 : 3000, '127.0.0.1');
await new Promise((r) => http.once('listening', r));
const base = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;
console.log(`listening on ${base}: curl -XPOST ${base}/orders -H 'content-type: application/json' -d '{"item":"book"}'`);

async function stop(): Promise<void> {
  http.close();
  await server.shutdown();
  await client.close();
  await pool?.end();
  await embedded?.close();
}

if (process.argv.includes('--smoke')) {
  for (const item of ['book', 'lamp', 'mug', 'pen', 'desk']) {
    const r = await fetch(`${base}/orders`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ item }) });
    if (r.status !== 201) throw new Error(`POST /orders answered ${r.status}`);
  }
  const deadline = Date.now() + 30_000;
  while (confirmed.length < 5 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  await stop();
  if (confirmed.length < 5) throw new Error(`only ${confirmed.length} of 5 orders confirmed`);
  console.log('smoke: 5 orders placed and confirmed');
} else {
  process.once('SIGINT', () => void stop());
}
