/**
 * pgasynq as a user runs it, compiled: the build of the copy of src/ and
 * migrations/ that run.ts took when the run started (PGASYNQ_SRC names its
 * dist/index.js), so every measurement of one run measures the same code
 * even while src/ is being edited; the working tree's ../../src/index.ts,
 * through tsx, when PGASYNQ_SRC is unset (measure.ts run by hand, or
 * run.ts --live).
 *
 * Only the public API (Client, Server, Task, migrate from src/index.ts) and
 * SQL on the `tasks` view or the catalog: the storage behind `tasks` may
 * change. The one exception, W5's finished rows, is pgasynq-fill.ts.
 *
 * Two systems: `pgasynq` is `new Server({ concurrency })` and nothing else
 * (the defaults a user gets); `pgasynq-tuned` adds `prefetch: 500`, tuned as
 * graphile-worker is (its localQueue of 500 is our prefetch of 500: claims
 * larger than the free slots, held leased until a slot frees); `pgasynq-durable`
 * is the default server on a pool of the bench's whose sessions commit as the
 * cluster does, waiting for the WAL flush, as every peer's do (the server's own
 * pool commits without waiting: broker/db.ts, asyncCommit).
 */
import { pathToFileURL } from 'node:url';
import pg from 'pg';
import { DATABASE_URL, adminPool, count, dropSchema } from '../lib/common.js';
import { instrumentPool } from '../lib/instrument.js';
import { fillFinished } from './pgasynq-fill.js';
import { unfollow } from './pgasynq-unfollowed.js';
import type { Adapter, ClaimObserver, Payload, TaskHandler, Workers } from './types.js';

const SCHEMA = 'bench_pgasynq';
/** pgasynq-tuned's prefetch: graphile-worker's tuned localQueue size. */
export const TUNED_PREFETCH = 500;

/** A pool like the one pgasynq makes for itself (same size and options), but its sessions keep the cluster's synchronous_commit (on). */
function durablePool(): pg.Pool {
  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 10, keepAlive: true, application_name: 'pgasynq:server' });
  pool.on('error', () => {});
  return pool;
}

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

/**
 * `prefetch` undefined: the server's own default (whatever the library chooses).
 * `watched`: an Inspector watches the schema's events while workers run (pgasynq-watched), what one
 * dashboard or `inspector.watch()` costs the servers.
 */
export async function create(prefetch?: number, watched = false, durable = false, unfollowed = false): Promise<Adapter> {
  const src = process.env.PGASYNQ_SRC;
  const { Client, Inspector, Server, Task, migrate }: Pgasynq = src ? await import(pathToFileURL(src).href) : await import('../../src/index.js');
  // The admin pool lives from setup() to teardown(): a workload may set up again after a teardown.
  let pool: pg.Pool | undefined;
  const admin = (): pg.Pool => (pool ??= adminPool());
  let client: InstanceType<Pgasynq['Client']> | undefined;
  const start = async (opts: { concurrency: number; handler: TaskHandler; pool?: pg.Pool }): Promise<Workers> => {
    const server = new Server({
      connectionString: DATABASE_URL,
      schema: SCHEMA,
      concurrency: opts.concurrency,
      ...(prefetch !== undefined ? { prefetch } : {}),
      ...(opts.pool ? { pool: opts.pool } : {}),
    });
    await server.start((task) => opts.handler(task.payload as Payload));
    const watch = watched ? watchEvents() : undefined;
    await watch?.registered;
    return {
      stop: async () => {
        await server.shutdown();
        await watch?.stop();
        await opts.pool?.end();
      },
    };
  };
  /** An Inspector reading every event until stopped; resolves `registered` once the servers send them. */
  const watchEvents = () => {
    const inspector = new Inspector({ connectionString: DATABASE_URL, schema: SCHEMA, logger: false });
    const abort = new AbortController();
    let events = 0;
    const done = (async () => {
      for await (const _ of inspector.watch({ signal: abort.signal })) events++;
    })();
    const registered = (async () => {
      while ((await count(admin(), `SELECT count(*) AS n FROM "${SCHEMA}".watchers`)) === 0) await new Promise((r) => setTimeout(r, 20));
    })();
    return {
      registered,
      stop: async () => {
        abort.abort();
        await done;
        await inspector.close();
        if (events === 0) throw new Error('the watcher heard no event');
      },
    };
  };
  return {
    name: prefetch !== undefined ? 'pgasynq-tuned' : watched ? 'pgasynq-watched' : durable ? 'pgasynq-durable' : unfollowed ? 'pgasynq-unfollowed' : 'pgasynq',
    label: `pgasynq (${src ? 'src/ as copied and compiled at the start of the run' : 'working tree src/, via tsx'}; ${prefetch !== undefined ? `prefetch ${prefetch}` : 'default settings'}${watched ? ', one Inspector.watch() running' : ''}${durable ? ", durable commits (synchronous_commit on, a pool of the bench's)" : ''}${unfollowed ? ', without the SQL that following and awaiting tasks added to the hot path' : ''})`,
    schema: SCHEMA,
    async setup({ fresh = false } = {}) {
      if (fresh) {
        await dropSchema(admin(), SCHEMA);
        await migrate({ connectionString: DATABASE_URL, schema: SCHEMA });
        if (unfollowed) await unfollow(admin(), SCHEMA);
      }
      client = new Client({ connectionString: DATABASE_URL, schema: SCHEMA });
    },
    async enqueueOne(payload) {
      await client!.enqueue(new Task('noop', payload));
    },
    async enqueueMany(payloads) {
      await client!.enqueueMany(payloads.map((p) => new Task('noop', p)));
    },
    async enqueueAndWait(payload) {
      await client!.enqueueAndWait(new Task('noop', payload));
    },
    async enqueueAt(payload, at) {
      await client!.enqueue(new Task('noop', payload), { processAt: at });
    },
    startWorkers: (opts) => start(durable ? { ...opts, pool: durablePool() } : opts),
    startTimedWorkers: (opts) => start({ ...opts, pool: timedPool(opts.onClaim) }),
    remaining: () => count(admin(), `SELECT count(*) AS n FROM "${SCHEMA}".tasks WHERE state IN ('pending', 'active', 'scheduled', 'retry')`),
    fillFinished: (n) => fillFinished(admin(), SCHEMA, n),
    async teardown() {
      await client?.close();
      await pool?.end();
      pool = undefined;
    },
  };
}
