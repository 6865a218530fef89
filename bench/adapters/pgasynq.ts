/**
 * pgasynq from its TypeScript source, run through tsx (no build step): the
 * copy of src/ and migrations/ that run.ts took when the run started
 * (PGASYNQ_SRC names its index.ts), so every measurement of one run measures
 * the same code even while src/ is being edited; the working tree's
 * ../../src/index.ts when PGASYNQ_SRC is unset (measure.ts run by hand, or
 * run.ts --live). Default settings except `concurrency` and `prefetch`, tuned
 * as graphile-worker is (its localQueue of 500 is our prefetch of 500: claims
 * larger than the free slots, held leased until a slot frees).
 * PGASYNQ_PREFETCH=0 measures the defaults.
 */
import { pathToFileURL } from 'node:url';
import pg from 'pg';
import { DATABASE_URL, adminPool, count, dropSchema } from '../lib/common.js';
import { instrumentPool } from '../lib/instrument.js';
import type { Adapter, ClaimObserver, Payload, TaskHandler, Workers } from './types.js';

const SCHEMA = 'bench_pgasynq';
const PREFETCH = Number(process.env.PGASYNQ_PREFETCH ?? 500);

/**
 * A pool like the one pgasynq makes for itself (same size and options), whose
 * clients time every claim statement: an UPDATE that sets state 'active' on
 * rows it locked with FOR UPDATE SKIP LOCKED. Only W5 uses it.
 */
function timedPool(onClaim: ClaimObserver): pg.Pool {
  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 10, keepAlive: true, application_name: 'pgasynq:server' });
  pool.on('error', () => {});
  return instrumentPool(pool, (text, values, ms, result) => {
    if (result.rowCount && /skip\s+locked/i.test(text) && /state\s*=\s*'active'/i.test(text)) onClaim(ms, result.rowCount, { text, values });
  });
}

type Pgasynq = typeof import('../../src/index.js');

export async function create(): Promise<Adapter> {
  const src = process.env.PGASYNQ_SRC;
  const { Client, Server, Task, migrate }: Pgasynq = src ? await import(pathToFileURL(src).href) : await import('../../src/index.js');
  // The admin pool lives from setup() to teardown(): a workload may set up again after a teardown.
  let pool: pg.Pool | undefined;
  const admin = (): pg.Pool => (pool ??= adminPool());
  let client: InstanceType<Pgasynq['Client']> | undefined;
  const start = async (opts: { concurrency: number; handler: TaskHandler; pool?: pg.Pool }): Promise<Workers> => {
    const server = new Server({ connectionString: DATABASE_URL, schema: SCHEMA, concurrency: opts.concurrency, prefetch: PREFETCH, ...(opts.pool ? { pool: opts.pool } : {}) });
    await server.start((task) => opts.handler(task.payload as Payload));
    return {
      stop: async () => {
        await server.shutdown();
        await opts.pool?.end();
      },
    };
  };
  return {
    name: 'pgasynq',
    label: src ? 'pgasynq (src/ as copied at the start of the run, via tsx)' : 'pgasynq (working tree src/, via tsx)',
    table: `"${SCHEMA}".tasks`,
    async setup({ fresh = false } = {}) {
      if (fresh) {
        await dropSchema(admin(), SCHEMA);
        await migrate({ connectionString: DATABASE_URL, schema: SCHEMA });
      }
      client = new Client({ connectionString: DATABASE_URL, schema: SCHEMA });
    },
    async enqueueOne(payload) {
      await client!.enqueue(new Task('noop', payload));
    },
    async enqueueMany(payloads) {
      await client!.enqueueMany(payloads.map((p) => new Task('noop', p)));
    },
    async enqueueAt(payload, at) {
      await client!.enqueue(new Task('noop', payload), { processAt: at });
    },
    startWorkers: (opts) => start(opts),
    startTimedWorkers: (opts) => start({ ...opts, pool: timedPool(opts.onClaim) }),
    remaining: () => count(admin(), `SELECT count(*) AS n FROM "${SCHEMA}".tasks WHERE state IN ('pending', 'active', 'scheduled', 'retry')`),
    async fillFinished(n) {
      // Half completed (kept for a day of retention), half archived: rows no claim may touch.
      await admin().query(`
        INSERT INTO "${SCHEMA}".queues (name) VALUES ('default') ON CONFLICT DO NOTHING;
        INSERT INTO "${SCHEMA}".tasks (queue, id, type, payload, state, run_at, completed_at, retention)
        SELECT 'default', 'done-' || g, 'noop', jsonb_build_object('i', g),
               CASE WHEN g % 2 = 0 THEN 'completed' ELSE 'archived' END,
               CASE WHEN g % 2 = 0 THEN now() + interval '1 day' ELSE now() END,
               CASE WHEN g % 2 = 0 THEN now() END,
               CASE WHEN g % 2 = 0 THEN interval '1 day' ELSE interval '0' END
        FROM generate_series(1, ${Math.floor(n)}) g`);
      await admin().query(`VACUUM ANALYZE "${SCHEMA}".tasks`);
    },
    async teardown() {
      await client?.close();
      await pool?.end();
      pool = undefined;
    },
  };
}
