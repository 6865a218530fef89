/**
 * The quick drain figure: N pre-enqueued no-op tasks, one server at a given
 * concurrency, default settings otherwise; prints tasks/s until the last
 * completion is recorded in the database (no task left in the table).
 *
 *   node --import tsx bench/quick-drain.ts [tasks=10000] [concurrency=20] [prefetch=0]
 */
import pg from 'pg';
import { Client, Server, Task, migrate } from '../src/index.js';

const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const schema = 'bench_quick_drain';
const [n = 10_000, concurrency = 20, prefetch = 0] = process.argv.slice(2).map(Number);

const pool = new pg.Pool({ connectionString: url });
await pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await migrate({ connectionString: url, schema });
const client = new Client({ connectionString: url, schema });
for (let i = 0; i < n; i += 10_000) {
  await client.enqueueMany(Array.from({ length: Math.min(10_000, n - i) }, (_, j) => new Task('noop', { i: i + j })));
}
await pool.query('VACUUM ANALYZE ' + schema + '.tasks');

const server = new Server({ connectionString: url, schema, concurrency, prefetch });
const t0 = performance.now();
await server.start(() => {});
for (;;) {
  const { rows } = await pool.query(`SELECT count(*)::int AS n FROM ${schema}.tasks`);
  if (rows[0].n === 0) break;
  await new Promise((r) => setTimeout(r, 5));
}
const seconds = (performance.now() - t0) / 1000;
console.log(JSON.stringify({ tasks: n, concurrency, prefetch, seconds: Number(seconds.toFixed(2)), tasksPerSecond: Math.round(n / seconds) }));
await server.shutdown();
await client.close();
await pool.end();
