/**
 * How fast the Inspector's counts stay on a big table: fills a schema with
 * N tasks (default 1,000,000: 60 % completed, 30 % archived, 5 % pending,
 * the rest scheduled, retry, aggregating and a few active; 80 % in queue
 * "default", 10 % each in "low" and "critical"), then times getQueueInfo,
 * queues(), the queue_stats view and a few list pages. Each figure is the
 * median of 5 runs, in ms; first right after the insert (as autovacuum has
 * not run yet), then after VACUUM ANALYZE, then again without the two
 * indexes migration 0002 adds (what 0001 alone gives).
 *
 *   node --import tsx bench/inspector-scale.ts            # 1,000,000 tasks
 *   node --import tsx bench/inspector-scale.ts 200000
 */
import pg from 'pg';
import { Inspector, migrate } from '../src/index.js';

const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const schema = 'bench_inspector';
const total = Number(process.argv[2] ?? 1_000_000);

const pool = new pg.Pool({ connectionString: url, max: 2 });
await pool.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
await migrate({ connectionString: url, schema });

const fillStarted = performance.now();
await pool.query(`INSERT INTO ${schema}.queues (name) VALUES ('default'), ('low'), ('critical')`);
await pool.query(
  `INSERT INTO ${schema}.tasks (queue, id, type, payload, state, run_at, completed_at, retention, error_msg, last_failed_at,
                                group_key, lease_owner, lease_expires_at, lease_token, started_at)
   SELECT CASE WHEN i % 10 < 8 THEN 'default' WHEN i % 10 = 8 THEN 'low' ELSE 'critical' END,
          'task-' || i, 'email:send', jsonb_build_object('n', i), s.state,
          CASE s.state
            WHEN 'pending' THEN now() - (i % 1000) * interval '1 ms'
            WHEN 'scheduled' THEN now() + (i % 3600) * interval '1 s'
            WHEN 'retry' THEN now() + (i % 600) * interval '1 s'
            WHEN 'archived' THEN now() - (i % 86400) * interval '1 s'
            WHEN 'completed' THEN now() + interval '1 day' - (i % 86400) * interval '1 s'
          END,
          CASE WHEN s.state = 'completed' THEN now() - (i % 86400) * interval '1 s' END,
          CASE WHEN s.state = 'completed' THEN interval '1 day' ELSE interval '0' END,
          CASE WHEN s.state IN ('archived', 'retry') THEN 'boom' END,
          CASE WHEN s.state IN ('archived', 'retry') THEN now() END,
          CASE WHEN s.state = 'aggregating' THEN 'g' || (i % 5) END,
          CASE WHEN s.state = 'active' THEN 'bench-server' END,
          CASE WHEN s.state = 'active' THEN now() + interval '30 s' END,
          CASE WHEN s.state = 'active' THEN gen_random_uuid() END,
          CASE WHEN s.state = 'active' THEN now() END
   FROM generate_series(1, $1::int) i
   CROSS JOIN LATERAL (SELECT CASE
       WHEN i % 100 < 60 THEN 'completed' WHEN i % 100 < 90 THEN 'archived' WHEN i % 100 < 95 THEN 'pending'
       WHEN i % 100 < 97 THEN 'scheduled' WHEN i % 100 < 98 THEN 'retry' WHEN i % 1000 < 995 THEN 'aggregating'
       ELSE 'active' END AS state) s`,
  [total],
);
const fillMs = performance.now() - fillStarted;

const inspector = new Inspector({ connectionString: url, schema });

async function median(fn: () => Promise<unknown>, runs = 5): Promise<number> {
  const times: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t = performance.now();
    await fn();
    times.push(performance.now() - t);
  }
  times.sort((a, b) => a - b);
  return Number((times[Math.floor(runs / 2)] as number).toFixed(1));
}

async function measure(phase: string): Promise<void> {
  const figures = {
    phase,
    getQueueInfo_default: await median(() => inspector.getQueueInfo('default')),
    getQueueInfo_low: await median(() => inspector.getQueueInfo('low')),
    queues: await median(() => inspector.queues()),
    queueStatsView_allQueues: await median(() => pool.query(`SELECT * FROM ${schema}.queue_stats`)),
    listPendingTasks_page1: await median(() => inspector.listPendingTasks('default')),
    listArchivedTasks_page100: await median(() => inspector.listArchivedTasks('default', { page: 100 })),
    listCompletedTasks_page1: await median(() => inspector.listCompletedTasks('default')),
    listScheduledTasks_page1: await median(() => inspector.listScheduledTasks('default')),
  };
  console.log(JSON.stringify(figures));
}

const info = await inspector.getQueueInfo('default');
console.log(JSON.stringify({ tasks: total, fillSeconds: Number((fillMs / 1000).toFixed(1)), default: { ...info, timestamp: undefined } }));
await measure('after insert');
await pool.query(`VACUUM ANALYZE ${schema}.tasks, ${schema}.queues`);
await measure('after VACUUM ANALYZE');
await pool.query(`DROP INDEX ${schema}.tasks_completed_queue_idx, ${schema}.tasks_due_queue_idx`);
await measure('0001 indexes only');

await inspector.close();
if (!process.env.KEEP) await pool.query(`DROP SCHEMA ${schema} CASCADE`);
await pool.end();
