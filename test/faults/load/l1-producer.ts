/**
 * The load test's producer process (plan §5.4 Phase A and C): enqueues COUNT
 * tasks with Client.enqueueMany (one statement per batch of BATCH), one batch
 * in flight, and keeps the acknowledgement log outside the database: a
 * batch's ids are appended to ACK_FILE only after enqueueMany resolved (its
 * COMMIT returned), and the file is fsynced after every batch.
 *
 * env:
 *   DATABASE_URL, SCHEMA, ACK_FILE
 *   COUNT       tasks (1,000,000)
 *   BATCH       tasks per enqueueMany (1000)
 *   RATE        tasks per second; 0 = as fast as it goes (0)
 *   TYPE        task type (l1)
 *   MAX_RETRY   (5)
 *   RETENTION   ms a completed task is kept (86,400,000: the oracle counts completed rows)
 *
 * stdout: {"event":"ready"}, {"event":"progress","acked","ms"} every second,
 * {"event":"error",...} for a rejected batch (then exit 1), {"event":"done","acked","ms","batches"}.
 */
import { randomUUID } from 'node:crypto';
import { Client, Task } from '../../../src/index.js';
import { AckLog, delay, env, errorFields, say, stopOnSigterm } from '../children/kit.js';

const count = Number(env('COUNT', '1000000'));
const batch = Number(env('BATCH', '1000'));
const rate = Number(env('RATE', '0'));
const type = env('TYPE', 'l1');
const maxRetry = Number(env('MAX_RETRY', '5'));
const retention = Number(env('RETENTION', '86400000'));

const client = new Client({ connectionString: env('DATABASE_URL'), schema: env('SCHEMA') });
const acks = new AckLog(env('ACK_FILE'));
const stopped = stopOnSigterm();
let acked = 0;
let batches = 0;

say({ event: 'ready' });
const t0 = performance.now();
const progress = setInterval(() => say({ event: 'progress', acked, ms: Math.round(performance.now() - t0) }), 1000);
try {
  while (acked < count && !stopped()) {
    const n = Math.min(batch, count - acked);
    if (rate > 0) {
      const wait = t0 + (acked * 1000) / rate - performance.now();
      if (wait > 0) await delay(wait);
    }
    const tasks = Array.from({ length: n }, (_, i) => new Task(type, { n: acked + i }, { taskId: randomUUID() }));
    await client.enqueueMany(tasks, { maxRetry, retention });
    acks.append(tasks.map((t) => t.options.taskId!));
    acks.sync();
    acked += n;
    batches++;
  }
} catch (err) {
  say({ event: 'error', acked, ...errorFields(err, 300) });
  process.exitCode = 1;
}
clearInterval(progress);
acks.close();
say({ event: 'done', acked, ms: Math.round(performance.now() - t0), batches });
await client.close().catch(() => {});
process.exit(process.exitCode ?? 0);
