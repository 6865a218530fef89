/**
 * What one watcher costs the database, by case: a vacuumed backlog of N no-op
 * tasks drained by one server at concurrency 10, timed from server.start() to
 * an empty table, with the CPU of every PostgreSQL process read from /proc
 * (the whole server's) and, with PERPID=1, split by application name (the
 * server's own sessions against its listener and the rest). Not part of the
 * suite: the cases differ by a few µs a task, under this machine's noise
 * between single runs, so run them interleaved and compare medians.
 *
 *   node --import tsx bench/watch-cost.ts CASE [tasks=50000] [reps=3]
 *
 * CASE: none (nobody watches), row (a watcher's registration, nobody
 * listening: what the servers pay to send), raw (a plain LISTEN client
 * counting the notifications and their events), watch (Inspector.watch()).
 * VARIANT=FILE applies FILE's SQL after the migrations ({{schema}} replaced),
 * to measure a function's variant without a migration.
 */
import { readdirSync, readFileSync } from 'node:fs';
import pg from 'pg';
import { Client, Inspector, Server, Task, migrate } from '../src/index.js';
import { count, processCpu, sleep, waitFor } from './lib/common.js';

const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const schema = 'bench_watch_cost';
const kase = process.argv[2] ?? 'none';
const tasks = Number(process.argv[3] ?? 50_000);
const reps = Number(process.argv[4] ?? 3);
if (!['none', 'row', 'raw', 'watch'].includes(kase)) throw new Error(`unknown case ${kase}: none, row, raw or watch`);

/** CPU ms of each PostgreSQL process by pid (a process that exits in between takes its time with it). */
function postgresCpu(): Map<number, number> {
  const cpu = new Map<number, number>();
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      const p = processCpu(pid);
      if (p.name === 'postgres') cpu.set(Number(pid), p.cpuMs);
    } catch {
      // Gone between the listing and the read.
    }
  }
  return cpu;
}

const total = (cpu: Map<number, number>) => [...cpu.values()].reduce((a, b) => a + b, 0);
const pool = new pg.Pool({ connectionString: url });

for (let rep = 0; rep < reps; rep++) {
  await pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  await migrate({ connectionString: url, schema });
  if (process.env.VARIANT) await pool.query(readFileSync(process.env.VARIANT, 'utf8').replaceAll('{{schema}}', schema));
  const client = new Client({ connectionString: url, schema });
  for (let i = 0; i < tasks; i += 10_000) {
    await client.enqueueMany(Array.from({ length: Math.min(10_000, tasks - i) }, (_, j) => new Task('noop', { i: i + j })));
  }
  await pool.query(`VACUUM ANALYZE ${schema}.task_states, ${schema}.task_inputs`);

  let events = 0;
  let notifications = 0;
  const stop = new AbortController();
  const inspector = new Inspector({ connectionString: url, schema });
  let listener: pg.Client | undefined;
  let watching: Promise<void> | undefined;
  if (kase === 'row' || kase === 'raw') await pool.query(`SELECT ${schema}.watch_tasks(null, null, 600000)`);
  if (kase === 'raw') {
    listener = new pg.Client({ connectionString: url });
    await listener.connect();
    listener.on('notification', (m) => {
      notifications++;
      events += (JSON.parse(m.payload ?? '[]') as unknown[]).length;
    });
    await listener.query(`LISTEN "${schema}_events"`);
  }
  if (kase === 'watch') {
    const stream = inspector.watch({ signal: stop.signal });
    watching = (async () => {
      for await (const _ of stream) events++;
    })().catch(() => {});
    // Its registration is in before the server starts.
    await waitFor(async () => (await count(pool, `SELECT count(*) AS n FROM ${schema}.watchers`)) > 0, 10_000, 20, 'the watcher registered');
  }

  const server = new Server({ connectionString: url, schema, concurrency: 10 });
  const before = postgresCpu();
  const node0 = process.cpuUsage();
  const t0 = performance.now();
  await server.start(() => {});
  for (;;) {
    const { rows } = await pool.query(`SELECT EXISTS (SELECT 1 FROM ${schema}.task_states) AS any`);
    if (!rows[0].any) break;
    await sleep(20);
  }
  const seconds = (performance.now() - t0) / 1000;
  const after = postgresCpu();
  const node = process.cpuUsage(node0);
  if (process.env.PERPID) {
    const names = await pool.query<{ pid: number; name: string }>(
      `SELECT pid, coalesce(nullif(application_name, ''), backend_type) AS name FROM pg_stat_activity`,
    );
    const byName = new Map<string, number>();
    for (const [pid, ms] of after) {
      const name = names.rows.find((r) => r.pid === pid)?.name ?? 'other';
      byName.set(name, (byName.get(name) ?? 0) + ms - (before.get(pid) ?? 0));
    }
    console.log(JSON.stringify(Object.fromEntries([...byName].filter(([, ms]) => ms > 0))));
  }
  await server.shutdown();
  stop.abort();
  await watching;
  await listener?.end();
  await inspector.close();
  await client.close();
  console.log(
    JSON.stringify({
      case: kase,
      variant: process.env.VARIANT ?? 'shipped',
      tasks,
      seconds: Number(seconds.toFixed(2)),
      tasksPerSecond: Math.round(tasks / seconds),
      postgresCpuMs: total(after) - total(before),
      nodeCpuMs: Math.round((node.user + node.system) / 1000),
      events,
      notifications,
    }),
  );
}
await pool.end();
