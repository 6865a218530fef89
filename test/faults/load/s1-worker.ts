/**
 * The soak test's worker process (plan §5.5): one Server with the mixed
 * handlers of S1, writing the oracle tables of ../harness.ts.
 *
 * Task types (every execution writes h_exec 'start' with the lease token it
 * was given and the task type in `detail`; every success writes its effect
 * into h_effects inside ctx.transaction):
 *   q, s       quick: effect at once (s is the scheduled kind)
 *   f2         fails on its first two attempts, then succeeds
 *   fa         always fails (archived once its retries are spent)
 *   long       sleeps payload.ms (2–5 × the lease, heartbeated), then the effect
 *   cron:*     the Scheduler's tasks: quick
 *
 * env: DATABASE_URL, SCHEMA, WORKER, CONCURRENCY (24), PROFILE (JSON: the
 * Server's durations plus retryDelayMs).
 * stdout (JSON lines): ready, and metrics every second (done, failed, aborted,
 * server.metrics(), rss, heapUsed, fds, loopLagMaxMs).
 */
import { randomUUID } from 'node:crypto';
import { type Task, type TaskContext } from '../../../src/index.js';
import { abortableSleep, commitEffect, openFdCount, recordExec, runWorker, tryRecordExec, watchLoopLag, workerProcess } from '../children/kit.js';

const proc = workerProcess({ concurrency: 24, oracle: () => 6, retryDelayMs: 500, config: (profile) => profile });
const { worker, server } = proc;
const w = proc.w!;

let done = 0;
let failed = 0;
let aborted = 0;

class PlannedFailure extends Error {
  override name = 'PlannedFailure';
}

async function handler(task: Task, ctx: TaskContext): Promise<void> {
  const attempt = randomUUID();
  try {
    await recordExec(w, ctx, attempt, 'start', task.type);
    if (task.type === 'fa') throw new PlannedFailure('always fails');
    if (task.type === 'f2' && ctx.retryCount < 2) throw new PlannedFailure(`fails on attempt ${ctx.retryCount + 1}`);
    if (task.type === 'long') {
      try {
        await abortableSleep((task.payload as { ms: number }).ms, ctx.signal);
      } catch (err) {
        aborted++;
        await tryRecordExec(w, ctx, attempt, 'abort', (err as Error)?.name ?? String(err));
        throw err;
      }
    }
    await commitEffect(w, ctx, attempt);
    done++;
  } catch (err) {
    failed++;
    throw err;
  }
}

const lag = watchLoopLag();
const metrics = () => {
  const m = process.memoryUsage();
  const out = {
    event: 'metrics',
    worker,
    done,
    failed,
    aborted,
    ...server.metrics(),
    rss: m.rss,
    heapUsed: m.heapUsed,
    fds: openFdCount(),
    loopLagMaxMs: lag.maxMs(),
  };
  lag.reset();
  return out;
};

await runWorker(proc, handler, metrics, 1000);
