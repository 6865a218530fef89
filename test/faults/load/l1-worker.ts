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
import { readdirSync } from 'node:fs';
import { sql, type Transaction } from 'kysely';
import pg from 'pg';
import { pino } from 'pino';
import { Server, type Task, type TaskContext } from '../../../src/index.js';

const env = (k: string, d = ''): string => process.env[k] ?? d;
const schema = env('SCHEMA');
const worker = `${env('WORKER', 'w')}:${process.pid}`;
const profile = JSON.parse(env('PROFILE', '{}')) as Record<string, number>;
const retryDelayMs = Number(env('RETRY_DELAY_MS', '1000'));
const writeExec = env('EXEC') === '1';
const say = (o: object): void => void process.stdout.write(`${JSON.stringify(o)}\n`);

process.on('unhandledRejection', (err) => {
  say({ event: 'unhandledRejection', message: String((err as Error)?.stack ?? err) });
  process.stderr.write(`unhandledRejection: ${String((err as Error)?.stack ?? err)}\n`);
  process.exit(70);
});
process.on('uncaughtException', (err) => {
  say({ event: 'uncaughtException', message: String(err?.stack ?? err) });
  process.stderr.write(`uncaughtException: ${String(err?.stack ?? err)}\n`);
  process.exit(71);
});

const concurrency = Number(env('CONCURRENCY', '16'));
const server = new Server({
  connectionString: env('DATABASE_URL'),
  schema,
  concurrency,
  prefetch: Number(env('PREFETCH', '16')),
  ...profile,
  retryDelay: () => retryDelayMs * (1 + Math.random()),
  logger: pino({ level: env('LOG_LEVEL', 'warn'), base: { worker } }, pino.destination(2)),
});

// The oracle's own connections (h_exec): not `pgasynq:*`, so chaos spares them.
const oracle = writeExec ? new pg.Pool({ connectionString: env('DATABASE_URL'), application_name: `harness:oracle:${worker}`, max: 4 }) : undefined;
oracle?.on('error', () => {});

let done = 0;
let failed = 0;

async function handler(_task: Task, ctx: TaskContext): Promise<void> {
  const attempt = randomUUID();
  try {
    if (oracle) {
      await oracle.query(
        `INSERT INTO "${schema}".h_exec (task_id, lease_token, attempt, worker, phase)
         SELECT $1, (SELECT lease_token FROM "${schema}".tasks WHERE queue = $2 AND id = $1 AND state = 'active' AND lease_owner = $3), $4, $5, 'start'`,
        [ctx.taskId, ctx.queue, server.id, attempt, worker],
      );
    }
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

const fds = (): number => {
  try {
    return readdirSync('/proc/self/fd').length;
  } catch {
    return -1;
  }
};
const metrics = () => ({ event: 'metrics', worker, done, failed, ...server.metrics(), rss: process.memoryUsage.rss(), fds: fds() });

await server.start(handler);
say({ event: 'ready', worker, serverId: server.id });
setInterval(() => say(metrics()), 1000).unref();

process.on('SIGTERM', () => {
  setTimeout(
    () => {
      say({ event: 'shutdownHang' });
      process.exit(3);
    },
    (profile.shutdownTimeout ?? 8000) + 10_000,
  ).unref();
  say({ event: 'sigterm' });
  void server.shutdown().then(async () => {
    say(metrics());
    await oracle?.end().catch(() => {});
    say({ event: 'exit' });
    process.exit(0);
  });
});
