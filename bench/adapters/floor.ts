/**
 * The raw-SQL floor (BENCH.md): the smallest queue that does the same work.
 * Its own table (id, queue, state, run_at, lease_expires_at, payload jsonb), a
 * partial index on (queue, run_at) where pending; claim = UPDATE … WHERE id IN
 * (SELECT … FOR UPDATE SKIP LOCKED LIMIT n) RETURNING with n = the free slots;
 * complete = DELETE … WHERE id = ANY(…), group-committed like pgasynq's
 * completions (what finishes while a DELETE is in flight goes in the next one).
 * Wake-ups: one NOTIFY per enqueue statement, and a 1 s poll.
 * No retries, no leases renewed, no fencing: a floor, not a queue to use.
 */
import { setImmediate as nextTurn } from 'node:timers/promises';
import pg from 'pg';
import { DATABASE_URL, adminPool, count, dropSchema, now } from '../lib/common.js';
import type { Adapter, ClaimObserver, Payload, TaskHandler, Workers } from './types.js';

const SCHEMA = 'bench_floor';
const T = `"${SCHEMA}".jobs`;
const CHANNEL = 'bench_floor_jobs';
const POLL_MS = 1000;

const CLAIM = `
  UPDATE ${T} SET state = 'active', lease_expires_at = now() + interval '30 seconds'
  WHERE id IN (
    SELECT id FROM ${T}
    WHERE queue = $1 AND state = 'pending' AND run_at <= now()
    ORDER BY run_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
  RETURNING id, payload`;
const COMPLETE = `DELETE FROM ${T} WHERE id = ANY($1::bigint[])`;

async function migrateFloor(pool: pg.Pool): Promise<void> {
  await pool.query(`
    CREATE SCHEMA "${SCHEMA}";
    CREATE TABLE ${T} (
      id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
      queue            text NOT NULL,
      state            text NOT NULL DEFAULT 'pending',
      run_at           timestamptz NOT NULL DEFAULT now(),
      lease_expires_at timestamptz,
      payload          jsonb NOT NULL
    );
    CREATE INDEX jobs_pending_idx ON ${T} (queue, run_at) WHERE state = 'pending'`);
}

/**
 * Claim loop + group-committed completions, on a small pool and one LISTEN
 * connection. `prefetch` (default: the concurrency) is how many tasks the
 * worker may hold, running or waiting locally: with the default every claim
 * asks for exactly the free slots; a larger one is graphile-worker's
 * localQueue (claims of up to `prefetch`, refilled when the local buffer runs
 * down to one round of slots). Only the `floor-prefetch` system sets it.
 */
async function startFloorWorkers(opts: { concurrency: number; handler: TaskHandler; onClaim?: ClaimObserver; prefetch?: number }): Promise<Workers> {
  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 4, application_name: 'bench:floor' });
  pool.on('error', () => {});
  const listener = new pg.Client({ connectionString: DATABASE_URL, application_name: 'bench:floor:listen' });
  await listener.connect();
  await listener.query(`LISTEN ${CHANNEL}`);
  const prefetch = Math.max(opts.concurrency, opts.prefetch ?? 0);
  const lowWater = prefetch === opts.concurrency ? 0 : opts.concurrency;

  let running = 0;
  let stopping = false;
  let hint = false;
  let wake: (() => void) | undefined;
  const poke = () => {
    hint = true;
    wake?.();
  };
  listener.on('notification', poke);
  const sleep = (ms: number) =>
    hint || stopping
      ? Promise.resolve()
      : new Promise<void>((resolve) => {
          const t = setTimeout(done, ms);
          function done() {
            clearTimeout(t);
            wake = undefined;
            resolve();
          }
          wake = done;
        });

  // Completions: while one DELETE is in flight, finished ids gather for the next.
  let done: string[] = [];
  let flushing: Promise<void> | undefined;
  const flush = async () => {
    while (done.length > 0) {
      const ids = done;
      done = [];
      await pool.query(COMPLETE, [ids]);
    }
    flushing = undefined;
  };
  const finish = (id: string) => {
    done.push(id);
    flushing ??= Promise.resolve().then(flush);
  };

  const buffer: { id: string; payload: Payload }[] = [];
  const dispatch = () => {
    while (running < opts.concurrency && buffer.length > 0) {
      const row = buffer.shift()!;
      running++;
      void (async () => {
        try {
          await opts.handler(row.payload);
        } finally {
          running--;
          finish(row.id);
          dispatch();
          poke();
        }
      })();
    }
  };

  const loop = (async () => {
    while (!stopping) {
      const want = prefetch - running - buffer.length;
      if (want <= 0 || buffer.length > lowWater) {
        await sleep(POLL_MS);
        continue;
      }
      hint = false;
      const t0 = now();
      const { rows } = await pool.query<{ id: string; payload: Payload }>(CLAIM, ['default', want]);
      if (rows.length > 0) opts.onClaim?.(now() - t0, rows.length, { text: CLAIM, values: ['default', want] });
      buffer.push(...rows);
      dispatch();
      if (rows.length < want) await sleep(POLL_MS);
      else await nextTurn();
    }
  })();

  return {
    async stop() {
      stopping = true;
      poke();
      await loop;
      // Tasks claimed but not started go back (a floor has no lease to expire).
      if (buffer.length > 0) await pool.query(`UPDATE ${T} SET state = 'pending' WHERE id = ANY($1::bigint[])`, [buffer.splice(0).map((r) => r.id)]);
      while (running > 0 || flushing) await (flushing ?? new Promise((r) => setTimeout(r, 5)));
      await listener.end();
      await pool.end();
    },
  };
}

export function create(prefetch?: number): Adapter {
  // The admin pool lives from setup() to teardown(): a workload may set up again after a teardown.
  let pool: pg.Pool | undefined;
  // Enqueues go through this pool: 10 connections, as pgasynq's Client and graphile's WorkerUtils have (W8's producers run concurrently).
  const admin = (): pg.Pool => (pool ??= adminPool(10));
  return {
    name: prefetch ? 'floor-prefetch' : 'floor',
    label: prefetch ? `raw-SQL floor, claims of up to ${prefetch} held locally` : 'raw-SQL floor (pg, SKIP LOCKED, claims sized to free slots, batched DELETE)',
    schema: SCHEMA,
    async setup({ fresh = false } = {}) {
      if (fresh) {
        await dropSchema(admin(), SCHEMA);
        await migrateFloor(admin());
      }
    },
    async enqueueOne(payload) {
      await admin().query(`WITH i AS (INSERT INTO ${T} (queue, payload) VALUES ('default', $1) RETURNING 1) SELECT pg_notify('${CHANNEL}', 'default') FROM i`, [
        payload,
      ]);
    },
    async enqueueMany(payloads) {
      await admin().query(
        `WITH i AS (INSERT INTO ${T} (queue, payload) SELECT 'default', p FROM unnest($1::jsonb[]) p RETURNING 1)
         SELECT pg_notify('${CHANNEL}', 'default') WHERE (SELECT count(*) FROM i) > 0`,
        [payloads.map((p) => JSON.stringify(p))],
      );
    },
    startWorkers: (opts) => startFloorWorkers({ ...opts, ...(prefetch ? { prefetch } : {}) }),
    startTimedWorkers: (opts) => startFloorWorkers({ ...opts, ...(prefetch ? { prefetch } : {}) }),
    remaining: () => count(admin(), `SELECT count(*) AS n FROM ${T} WHERE state IN ('pending', 'active')`),
    async fillFinished(n) {
      await admin().query(`
        INSERT INTO ${T} (queue, state, run_at, payload)
        SELECT 'default', CASE WHEN g % 2 = 0 THEN 'completed' ELSE 'archived' END, now(), jsonb_build_object('i', g)
        FROM generate_series(1, ${Math.floor(n)}) g`);
      await admin().query(`VACUUM ANALYZE ${T}`);
    },
    async teardown() {
      await pool?.end();
      pool = undefined;
    },
  };
}
