/**
 * A producer process of the fault suite: enqueues COUNT tasks at RATE per
 * second and keeps the acknowledgement log OUTSIDE the database: an id is
 * appended to ACK_FILE only after enqueue() resolved (its COMMIT returned),
 * with an fsync every 100 ids and at the end. A database that loses
 * acknowledged enqueues cannot hide it by losing the log as well.
 *
 * env:
 *   DATABASE_URL, SCHEMA, ACK_FILE
 *   COUNT       tasks to enqueue (default 100)
 *   RATE        tasks per second; 0 = as fast as INFLIGHT allows (default 50)
 *   INFLIGHT    enqueues in flight at once (default 4)
 *   TYPE        task type (default tx)
 *   MAX_RETRY   (default 3)
 *   MS_MIN, MS_MAX  when set, each task's payload is {ms} drawn from this range
 *   SCHEDULED   share of tasks (0–1) enqueued with processIn 0.5–2 s; their due time
 *               (TaskInfo.nextProcessAt, database clock) goes to h_sched for I6
 *   CLIENT_POOL=user  the Client enqueues through a pg.Pool of this process (as a user's app
 *               may pass one), whose sessions keep the database's settings
 *
 * stdout: {"event":"ready"}, {"event":"error","id","code","message"} for every
 * rejected enqueue (never a silent drop), {"event":"done","acked","errors"}.
 * SIGTERM: stop, fsync the log, print done, exit 0.
 */
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { Client, Task } from '../../../src/index.js';
import { AckLog, delay, env, errorFields, exitOnUnhandledRejection, exitWhenParentDies, oraclePool, runPaced, say, stopOnSigterm } from './kit.js';

const count = Number(env('COUNT', '100'));
const rate = Number(env('RATE', '50'));
const inflight = Number(env('INFLIGHT', '4'));
const type = env('TYPE', 'tx');
const maxRetry = Number(env('MAX_RETRY', '3'));
const msMin = env('MS_MIN');
const msMax = env('MS_MAX', msMin);
const scheduledShare = Number(env('SCHEDULED', '0'));

exitWhenParentDies();
exitOnUnhandledRejection();

const userPool = env('CLIENT_POOL') === 'user' ? new pg.Pool({ connectionString: env('DATABASE_URL'), max: inflight }) : undefined;
userPool?.on('error', () => {});
const client = new Client(userPool ? { pool: userPool, schema: env('SCHEMA') } : { connectionString: env('DATABASE_URL'), schema: env('SCHEMA') });
const oracle = oraclePool(2);
const acks = new AckLog(env('ACK_FILE'));
const stopped = stopOnSigterm();
let acked = 0;
let errors = 0;

async function one(): Promise<void> {
  const id = randomUUID();
  const payload = msMin === '' ? {} : { ms: Number(msMin) + Math.random() * (Number(msMax) - Number(msMin)) };
  try {
    // Retention keeps completed rows, so the oracle can see every acknowledged task's end state.
    const processIn = Math.random() < scheduledShare ? 500 + Math.random() * 1500 : undefined;
    const info = await client.enqueue(new Task(type, payload), { taskId: id, maxRetry, retention: 3_600_000, ...(processIn ? { processIn } : {}) });
    acks.append([id]);
    if (++acked % 100 === 0) acks.sync();
    // Recorded after the commit, before the task can be due (≥ 0.5 s later).
    // A failure here (the database crashed after the commit) leaves that task out of I6, nothing more.
    if (processIn) await oracle.query(`INSERT INTO "${env('SCHEMA')}".h_sched (task_id, process_at) VALUES ($1, $2)`, [id, info.nextProcessAt]).catch(() => {});
  } catch (err) {
    errors++;
    say({ event: 'error', id, ...errorFields(err, 200) });
    // A refused connection fails at once: don't spin through the schedule.
    await delay(20);
  }
}

say({ event: 'ready' });
await runPaced({ count, rate, inflight, t0: performance.now(), stopped }, one);
acks.close();
say({ event: 'done', acked, errors });
await client.close().catch(() => {});
await userPool?.end().catch(() => {});
process.exit(0);
