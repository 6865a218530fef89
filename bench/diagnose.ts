/**
 * Where pgasynq's time goes: runs one W1- or W2-shaped workload with a pool
 * whose clients log every statement (kind, round-trip ms, rows), then prints
 * per kind: how many, how long, how many rows each. Not part of the suite.
 *
 *   node --import tsx bench/diagnose.ts drain [--n 50000] [--concurrency 10]
 *   node --import tsx bench/diagnose.ts enqueue [--bulk 50000] [--single 2000]
 * --explain adds EXPLAIN (ANALYZE, BUFFERS) of the last bulk enqueue / claim.
 */
import pg from 'pg';
import { Client, Server, Task, migrate } from '../src/index.js';
import { DATABASE_URL, adminPool, dropSchema, now, parseArgs, sleep } from './lib/common.js';
import { instrumentPool } from './lib/instrument.js';

const SCHEMA = 'bench_diagnose';
const args = parseArgs(process.argv.slice(3));
const mode = process.argv[2] ?? 'drain';

interface Stat {
  count: number;
  ms: number;
  rows: number;
  max: number;
}
const stats = new Map<string, Stat>();
/** The last statement of each kind, for EXPLAIN ANALYZE. */
const last = new Map<string, { text: string; values: unknown[] }>();

function kind(text: string): string {
  const t = text.replace(/\s+/g, ' ').trim();
  if (/skip locked/i.test(t) && /state = 'active'/i.test(t)) return 'claim';
  if (/^WITH h AS MATERIALIZED/i.test(t) && /DELETE FROM/i.test(t)) return 'complete (fenced delete)';
  if (/^WITH input AS/i.test(t)) return 'enqueue';
  if (/lease_expires_at = now\(\) \+/i.test(t) && /^UPDATE/i.test(t)) return 'extend leases';
  return t.slice(0, 70);
}

function loggingPool(): pg.Pool {
  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 10, keepAlive: true });
  pool.on('error', () => {});
  return instrumentPool(pool, (text, values, ms, r) => {
    const k = kind(text);
    last.set(k, { text, values });
    const s = stats.get(k) ?? { count: 0, ms: 0, rows: 0, max: 0 };
    s.count++;
    s.ms += ms;
    s.max = Math.max(s.max, ms);
    s.rows += r.rowCount ?? 0;
    stats.set(k, s);
  });
}

/** EXPLAIN (ANALYZE, BUFFERS) of the last statement of a kind, rolled back; prints the plan's first lines. */
async function explain(k: string, lines = 40, before?: string): Promise<void> {
  const st = last.get(k);
  if (!st) return;
  const c = await admin.connect();
  try {
    await c.query('BEGIN');
    if (before) await c.query(before);
    const { rows } = await c.query(`EXPLAIN (ANALYZE, BUFFERS) ${st.text}`, st.values);
    console.log(`\nEXPLAIN (ANALYZE, BUFFERS) of the last "${k}" (rolled back):`);
    for (const r of rows.slice(0, lines)) console.log(`  ${r['QUERY PLAN']}`);
    const tail = rows.slice(-3).map((r) => r['QUERY PLAN']);
    if (rows.length > lines) console.log(`  …\n  ${tail.join('\n  ')}`);
  } finally {
    await c.query('ROLLBACK');
    c.release();
  }
}

function report(wallMs: number, tasks: number): void {
  console.log(`\n${tasks} tasks in ${wallMs.toFixed(0)} ms: ${Math.round(tasks / (wallMs / 1000))} tasks/s`);
  console.log('statement kind | count | per task | total ms | mean ms | max ms | mean rows');
  for (const [k, s] of [...stats].sort((a, b) => b[1].ms - a[1].ms)) {
    console.log(
      `${k} | ${s.count} | ${(s.count / tasks).toFixed(3)} | ${s.ms.toFixed(0)} | ${(s.ms / s.count).toFixed(2)} | ${s.max.toFixed(1)} | ${(s.rows / s.count).toFixed(1)}`,
    );
  }
}

const admin = adminPool(2);
await dropSchema(admin, SCHEMA);
await migrate({ connectionString: DATABASE_URL, schema: SCHEMA });
const pool = loggingPool();
const client = new Client({ pool, schema: SCHEMA });

if (mode === 'enqueue') {
  const bulk = Number(args.bulk ?? 50_000);
  const single = Number(args.single ?? 2000);
  await client.enqueueMany(Array.from({ length: 100 }, (_, i) => new Task('noop', { i })));
  stats.clear();
  const tasks = Array.from({ length: bulk }, (_, i) => ({ i }));
  const t0 = now();
  await client.enqueueMany(tasks.map((p) => new Task('noop', p)));
  const bulkMs = now() - t0;
  console.log(`bulk: ${bulk} in ${bulkMs.toFixed(0)} ms (${Math.round(bulk / (bulkMs / 1000))}/s); of which the statement's round trip:`);
  report(bulkMs, bulk);
  if (args.explain === 'true') await explain('enqueue', 30, `DELETE FROM "${SCHEMA}".tasks`);
  stats.clear();
  const t1 = now();
  for (let i = 0; i < single; i++) await client.enqueue(new Task('noop', { i }));
  report(now() - t1, single);
} else {
  const n = Number(args.n ?? 50_000);
  const concurrency = Number(args.concurrency ?? 10);
  for (let i = 0; i < n; i += 10_000) await client.enqueueMany(Array.from({ length: Math.min(10_000, n - i) }, (_, j) => new Task('noop', { i: i + j })));
  stats.clear();
  let handled = 0;
  let first = 0;
  const seen = new Set<number>();
  const server = new Server({ pool, schema: SCHEMA, concurrency, ...(args.prefetch === undefined ? {} : { prefetch: Number(args.prefetch) }) });
  await server.start((task) => {
    if (handled++ === 0) first = now();
    seen.add((task.payload as { i: number }).i);
  });
  while (handled < n) await sleep(10);
  for (;;) {
    const { rows } = await admin.query(`SELECT count(*)::int AS n FROM "${SCHEMA}".tasks`);
    if (rows[0].n === 0) break;
    await sleep(2);
  }
  const wall = now() - first;
  await server.shutdown();
  report(wall, n);
  if (args.explain === 'true') {
    await client.enqueueMany(Array.from({ length: 200 }, (_, i) => new Task('noop', { i })));
    await explain('claim');
  }
  console.log(`handler runs: ${handled}, distinct tasks: ${seen.size} (a difference means tasks ran twice)`);
  console.log('server.metrics():', JSON.stringify(server.metrics()));
}
await client.close();
await pool.end();
await dropSchema(admin, SCHEMA);
await admin.end();
