/**
 * How late a cron tick is enqueued: three schedulers (in one process, each
 * with its own pool) run one `@every 1s` entry for 60 s; prints the p50, p99
 * and max of (task enqueued_at − tick_at), both on the database clock, and
 * checks there is exactly one task per tick.
 *
 *   node --import tsx bench/cron-delay.ts              # 60 s, 3 schedulers
 *   node --import tsx bench/cron-delay.ts 20 5         # seconds, schedulers
 */
import pg from 'pg';
import { Scheduler, Task, migrate } from '../src/index.js';

const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const schema = 'bench_cron_delay';
const [seconds = 60, count = 3] = process.argv.slice(2).map(Number);

const pool = new pg.Pool({ connectionString: url });
await pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await migrate({ connectionString: url, schema });

const schedulers = Array.from({ length: count }, () => new Scheduler({ connectionString: url, schema }));
const ids = new Set(schedulers.map((s) => s.register('@every 1s', new Task('bench:tick'))));
await Promise.all(schedulers.map((s) => s.start()));
await new Promise((r) => setTimeout(r, seconds * 1000));
await Promise.all(schedulers.map((s) => s.shutdown()));

const { rows } = await pool.query<{ tick_at: Date; delay_ms: number }>(`
  SELECT e.tick_at, (extract(epoch FROM t.enqueued_at - e.tick_at) * 1000)::float8 AS delay_ms
  FROM ${schema}.scheduler_events e JOIN ${schema}.tasks t ON t.id = e.task_id
  ORDER BY e.tick_at`);
const [{ n: tasks }] = (await pool.query(`SELECT count(*)::int AS n FROM ${schema}.tasks`)).rows;
await pool.end();

const delays = rows.map((r) => r.delay_ms).sort((a, b) => a - b);
const pct = (p: number) => delays[Math.min(delays.length - 1, Math.floor((p / 100) * delays.length))] ?? NaN;
const span = rows.length > 1 ? (rows.at(-1)!.tick_at.getTime() - rows[0]!.tick_at.getTime()) / 1000 + 1 : rows.length;
console.log(
  JSON.stringify({
    schedulers: count,
    entries: ids.size,
    seconds,
    ticks: rows.length,
    tasks,
    missedTicks: span - rows.length,
    p50Ms: Number(pct(50).toFixed(2)),
    p99Ms: Number(pct(99).toFixed(2)),
    maxMs: Number((delays.at(-1) ?? NaN).toFixed(2)),
  }),
);
