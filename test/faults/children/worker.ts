/**
 * A worker process of the fault suite: one Server on the fast profile (or
 * whatever PROFILE says), with handlers that write the oracle tables of
 * harness.ts. The harness kills, freezes and terminates it.
 *
 * env:
 *   DATABASE_URL, SCHEMA   the owned cluster and the test's schema
 *   WORKER                 a name; rows are tagged `${WORKER}:${pid}`
 *   PROFILE                JSON: leaseDuration, heartbeatInterval, recoverCutoff, recoverInterval,
 *                          taskCheckInterval, delayedTaskCheckInterval, shutdownTimeout,
 *                          retryDelayMs (a retry waits retryDelayMs to 2·retryDelayMs)
 *   CONCURRENCY            slots (4)
 *   SLEEP_MIN, SLEEP_MAX   a `tx` task sleeps this long (ms) unless its payload says `ms`
 *   IGNORE_ABORT=1         the handler does not stop at ctx.signal (a zombie that carries on)
 *
 * Task types:
 *   tx      h_exec(start), sleep, h_exec(end), then ctx.transaction inserting h_effects
 *   poison  h_exec(start), then process.exit(42): an execution that kills its process
 *   block   like tx, but on its first attempt a synchronous busy loop of payload.blockMs
 *
 * stdout: one JSON line per event: {"event":"ready","serverId":…}, {"event":"metrics",…}
 * every 500 ms and at exit; stderr: the server's warnings and errors (pino).
 */
import { randomUUID } from 'node:crypto';
import { type Task, type TaskContext } from '../../../src/index.js';
import {
  abortableSleep,
  commitEffect,
  env,
  exitOnUncaughtException,
  exitOnUnhandledRejection,
  exitWhenParentDies,
  oraclePool,
  profileFromEnv,
  recordExec,
  say,
  shutdownOnSigterm,
  startAndReport,
  tryRecordExec,
  watchLoopLag,
  workerServer,
  workerTag,
  type OracleWriter,
} from './kit.js';

const schema = env('SCHEMA');
const worker = workerTag();
const profile = profileFromEnv();
const concurrency = Number(env('CONCURRENCY', '4'));
const sleepMin = Number(env('SLEEP_MIN', '200'));
const sleepMax = Number(env('SLEEP_MAX', '800'));
const ignoreAbort = env('IGNORE_ABORT') === '1';

exitWhenParentDies();
exitOnUnhandledRejection();
exitOnUncaughtException();

const oracle = oraclePool(concurrency + 2, worker);
const { retryDelayMs = 500, ...serverProfile } = profile;
const server = workerServer(worker, retryDelayMs, { schema, concurrency, delayedTaskCheckInterval: 500, ...serverProfile });
const w: OracleWriter = { schema, worker, server, oracle };

async function handler(task: Task, ctx: TaskContext): Promise<void> {
  const attempt = randomUUID();
  const payload = (task.payload ?? {}) as { ms?: number; blockMs?: number };
  await recordExec(w, ctx, attempt, 'start');
  if (task.type === 'poison') process.exit(42);
  try {
    if (task.type === 'block' && ctx.retryCount === 0) {
      // No await for blockMs: no timer runs in this process, heartbeats included.
      const until = performance.now() + (payload.blockMs ?? 6000);
      while (performance.now() < until);
    } else {
      // An abort before the sleep begins goes unnoticed here (as this worker always had it): the commit meets the lost lease.
      await abortableSleep(payload.ms ?? sleepMin + Math.random() * (sleepMax - sleepMin), ignoreAbort ? undefined : ctx.signal, { onlyLaterAborts: true });
    }
  } catch (err) {
    await tryRecordExec(w, ctx, attempt, 'abort', (err as Error)?.name ?? String(err));
    throw err;
  }
  await recordExec(w, ctx, attempt, 'end');
  await commitEffect(w, ctx, attempt);
}

const lag = watchLoopLag();
const metrics = () => ({ event: 'metrics', worker, ...server.metrics(), loopLagMaxMs: lag.maxMs() });

await startAndReport(server, handler, worker, metrics, 500);
shutdownOnSigterm(server, profile.shutdownTimeout, async () => {
  say(metrics());
  await oracle.end().catch(() => {});
});
