/**
 * The load test's worker process (plan §5.4 Phase B): one Server, a no-op
 * handler plus the business effect written inside ctx.transaction (one
 * INSERT into h_effects that reads the row's lease token while the library
 * holds the row locked under this lease).
 *
 * env:
 *   DATABASE_URL, SCHEMA
 *   WORKER            a name; rows are tagged `${WORKER}:${pid}`
 *   CONCURRENCY       slots (16)
 *   PREFETCH          tasks claimed ahead of free slots (16)
 *   PROFILE           JSON: leaseDuration, heartbeatInterval, recoverCutoff, recoverInterval, taskCheckInterval, shutdownTimeout
 *   RETRY_DELAY_MS    a retry waits RETRY_DELAY_MS to 2·RETRY_DELAY_MS (1000)
 *   EXEC=1            also write an h_exec 'start' row per execution (with the lease token), for I3/I5/dup_external
 *
 * stdout (JSON lines): {"event":"ready","serverId"}, {"event":"metrics", done, failed, claimed,
 * fencedWrites, leasesLost, recovered, rss, fds} every second and at exit.
 */
import { randomUUID } from 'node:crypto';
import { sql, type Transaction } from 'kysely';
import { type Task, type TaskContext } from '../../../src/index.js';
import { env, openFdCount, recordExec, runWorker, workerProcess } from '../children/kit.js';

const proc = workerProcess({
  concurrency: 16,
  oracle: () => (env('EXEC') === '1' ? 4 : 0),
  retryDelayMs: Number(env('RETRY_DELAY_MS', '1000')),
  config: (profile) => ({ prefetch: Number(env('PREFETCH', '16')), ...profile }),
});
const { schema, worker, server, w } = proc;

let done = 0;
let failed = 0;

async function handler(_task: Task, ctx: TaskContext): Promise<void> {
  const attempt = randomUUID();
  try {
    if (w) await recordExec(w, ctx, attempt, 'start');
    await ctx.transaction(async (trx: Transaction<any>) => {
      // One statement: the token is read from the row this lease holds locked (null if it were not ours).
      await sql`INSERT INTO ${sql.id(schema, 'h_effects')} (task_id, lease_token, attempt, worker)
                SELECT ${ctx.taskId}, (SELECT lease_token FROM ${sql.id(schema, 'tasks')}
                                       WHERE queue = ${ctx.queue} AND id = ${ctx.taskId} AND lease_owner = ${server.id}), ${attempt}, ${worker}`.execute(trx);
    });
    done++;
  } catch (err) {
    failed++;
    throw err;
  }
}

const metrics = () => ({ event: 'metrics', worker, done, failed, ...server.metrics(), rss: process.memoryUsage.rss(), fds: openFdCount() });

await runWorker(proc, handler, metrics, 1000);
