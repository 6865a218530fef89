/**
 * The soak test's producer process (plan §5.5): RATE tasks per second for
 * COUNT tasks, mixed as
 *   80 % q     quick
 *   10 % f2    fail twice, then succeed
 *    2 % fa    always fail (maxRetry 2: archived after 3 attempts)
 *    5 % s     quick, scheduled 1–60 s ahead
 *    3 % long  sleeps 2–5 × LEASE_MS (heartbeated)
 * and 1 in 9 of the q and f2 tasks (10 % of all) carry a unique lock (payload {u: k}, k from
 * a small range, so that some enqueues meet a held lock: DuplicateTaskError,
 * counted, not acknowledged).
 *
 * Each enqueue runs in a transaction of our own that also records the task
 * in h_enq (kind, requested process_at; `at` is the database clock): the
 * oracle row exists iff the task does. The id is appended to ACK_FILE
 * (`id kind`) only after COMMIT returned; fsync every 100 ids.
 *
 * env: DATABASE_URL, SCHEMA, ACK_FILE, COUNT, RATE (100), INFLIGHT (8),
 * LEASE_MS (3000), RETENTION (60000), UNIQUE_TTL (30000).
 * stdout: ready; progress every 5 s {acked, errors, dups}; done.
 */
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { Client, DuplicateTaskError, Task, type EnqueueOptions } from '../../../src/index.js';
import { AckLog, delay, env, errorFields, exitOnUnhandledRejection, runPaced, say, stopOnSigterm } from '../children/kit.js';

const schema = env('SCHEMA');
const count = Number(env('COUNT', '1000'));
const rate = Number(env('RATE', '100'));
const inflight = Number(env('INFLIGHT', '8'));
const leaseMs = Number(env('LEASE_MS', '3000'));
const retention = Number(env('RETENTION', '60000'));
const uniqueTtl = Number(env('UNIQUE_TTL', '30000'));

exitOnUnhandledRejection();

const pool = new pg.Pool({ connectionString: env('DATABASE_URL'), application_name: 'pgasynq:client:s1', max: inflight + 2, connectionTimeoutMillis: 5000 });
pool.on('error', () => {});
pool.on('connect', (c) => void c.on('error', () => {}));
const client = new Client({ pool, schema });
const acks = new AckLog(env('ACK_FILE'));
const counts = { acked: 0, errors: 0, dups: 0, byKind: {} as Record<string, number> };
const stopped = stopOnSigterm();

function draw(): { kind: string; task: Task; opts: EnqueueOptions; processAt: Date | null } {
  const r = Math.random() * 100;
  const kind = r < 80 ? 'q' : r < 90 ? 'f2' : r < 92 ? 'fa' : r < 97 ? 's' : 'long';
  const id = randomUUID();
  const opts: EnqueueOptions = { taskId: id, retention, maxRetry: kind === 'fa' ? 2 : 5 };
  let payload: unknown = { n: counts.acked };
  let processAt: Date | null = null;
  // q and f2 are 90 % of all tasks: 1 in 9 of them makes 10 % of all.
  if ((kind === 'q' || kind === 'f2') && Math.random() < 1 / 9) {
    payload = { u: Math.floor(Math.random() * 200) };
    opts.unique = uniqueTtl;
  }
  if (kind === 's') {
    processAt = new Date(Date.now() + 1000 + Math.random() * 59_000);
    opts.processAt = processAt;
  }
  if (kind === 'long') payload = { ms: Math.round(leaseMs * (2 + Math.random() * 3)) };
  return { kind, task: new Task(kind, payload), opts, processAt };
}

async function one(): Promise<void> {
  const { kind, task, opts, processAt } = draw();
  let c: pg.PoolClient | undefined;
  try {
    c = await pool.connect();
    await c.query('BEGIN');
    await c.query(`INSERT INTO "${schema}".h_enq (task_id, kind, process_at) VALUES ($1, $2, $3)`, [opts.taskId, kind, processAt]);
    await client.enqueue(task, { ...opts, tx: c });
    await c.query('COMMIT');
    c.release();
    c = undefined;
    acks.append([`${opts.taskId} ${kind}`]);
    counts.byKind[kind] = (counts.byKind[kind] ?? 0) + 1;
    if (++counts.acked % 100 === 0) acks.sync();
  } catch (err) {
    if (c) {
      await c.query('ROLLBACK').catch(() => {});
      c.release(true);
    }
    if (err instanceof DuplicateTaskError) {
      counts.dups++;
      return;
    }
    counts.errors++;
    say({ event: 'error', at: new Date().toISOString(), ...errorFields(err, 200) });
    await delay(50);
  }
}

say({ event: 'ready' });
const t0 = performance.now();
const progress = setInterval(() => say({ event: 'progress', ...counts, ms: Math.round(performance.now() - t0) }), 5000);
await runPaced({ count, rate, inflight, t0, stopped }, one);
clearInterval(progress);
acks.close();
say({ event: 'done', ...counts, ms: Math.round(performance.now() - t0) });
await client.close().catch(() => {});
await pool.end().catch(() => {});
process.exit(0);
