/**
 * A worker process of the fault suite: one Server on the fast profile (or
 * whatever PROFILE says), with handlers that write the oracle tables of
 * harness.ts. The harness kills, freezes and terminates it.
 *
 * env:
 *   DATABASE_URL, SCHEMA   the owned cluster and the test's schema
 *   ORACLE_DATABASE_URL    the oracle's connections use this one when set (DATABASE_URL may go through a proxy)
 *   WORKER                 a name; rows are tagged `${WORKER}:${pid}`
 *   PROFILE                JSON: leaseDuration, heartbeatInterval, recoverCutoff, recoverInterval,
 *                          taskCheckInterval, delayedTaskCheckInterval, shutdownTimeout,
 *                          retryDelayMs (a retry waits retryDelayMs to 2·retryDelayMs)
 *   CONCURRENCY            slots (4)
 *   SLEEP_MIN, SLEEP_MAX   a `tx` task sleeps this long (ms) unless its payload says `ms`
 *   IGNORE_ABORT=1         the handler does not stop at ctx.signal (a zombie that carries on)
 *   REPORT_EXEC=1          also say {"event":"aborted",taskId,attempt,reason,at} when a handler's
 *                          ctx.signal aborts and {"event":"txFailed",taskId,attempt,name,code,message,began,at}
 *                          when its ctx.transaction throws; `began`, `at`: this host's Date.now(); and
 *                          {"event":"started"|"finished",taskId,attempt,at} as each handler call begins and returns
 *   TX_HOLD_MS             a handler keeps its ctx.transaction open this long before the commit (0)
 *   QUEUES                 JSON: the Server's queues with their weights ({"default":1} when unset)
 *   GC_STATS=1             observe GC pauses (PerformanceObserver 'gc'); the metrics line then also
 *                          carries gcCount, gcMajorCount, gcPauseP99Ms, gcPauseMaxMs, gcPauseTotalMs and
 *                          heapLimitMb (V8's heap limit: --max-old-space-size in NODE_OPTIONS shows here)
 *   PREFETCH               the Server's prefetch (its default, adaptive, when unset)
 *   POOL_MAX               the Server runs on a pg.Pool of this many connections made here (the library's
 *                          own has 10), set up as the library sets up its own (application_name, keepAlive,
 *                          connect timeout, synchronous_commit=off); the metrics line then carries
 *                          connectAttempts and connectErrors of that pool, and each failed connect says
 *                          {"event":"connectError",code,at} (at: Date.now(); the first 5,000)
 *   POOL_SYNC_COMMIT=1     with POOL_MAX: that pool's sessions commit with synchronous_commit=on instead (a
 *                          control: every claim, completion and heartbeat durable before the worker hears of it)
 *   LISTEN_URL             the Server's listenConnectionString (LISTEN on its own DSN: through a proxy, say)
 *   IDLE_TX_TIMEOUT=off    the Server runs on a pool whose sessions keep idle_in_transaction_session_timeout
 *                          off, ctx.transaction's included (idle-tx-off.ts; plan F12 without R17); the metrics
 *                          line then carries idleTimeoutsTurnedOff
 *
 * Task types:
 *   tx      h_exec(start), sleep, h_exec(end), then ctx.transaction inserting h_effects
 *   poison  h_exec(start), then process.exit(42): an execution that kills its process
 *   block   like tx, but on its first attempt a synchronous busy loop of payload.blockMs
 *   flaky   like tx, but its first attempt fails right after its start (h_exec 'abort', detail 'flaky'):
 *           the retry's due time is the database's, whatever this host's clock says
 *   plain   like tx, but no ctx.transaction and no h_effects: it returns after h_exec(end), and the
 *           batched completion completes it
 *   txhold  like tx, but on its first attempt its ctx.transaction stays open payload.holdMs (2000) after
 *           the h_effects insert, and says {"event":"inTransaction",taskId,attempt,at} as that hold begins
 *           (the effect is written, not committed: a moment to freeze the process in)
 *   alloc   like tx, but instead of the sleep it allocates about payload.mb (200) MB of short-lived
 *           objects, in chunks of ~8 MB with a turn of the event loop between them, keeping the last two;
 *           it stops at ctx.signal between chunks (unless IGNORE_ABORT)
 *   fx      no h_exec rows and no oracle connection (only the library's connections): sleeps payload.ms
 *           (or SLEEP_MIN–SLEEP_MAX), then ctx.transaction inserting h_effects
 *   bare    like fx, but no ctx.transaction either: it sleeps and returns, and the batched completion
 *           completes it; nothing of it is committed with synchronous_commit=on (no WAL flush of its own)
 *   killtx  like tx, but the first time the task reaches h_exec(end) (its first 'end' row, whichever
 *           attempt) the worker says {"event":"selfKill",taskId,attempt} and SIGKILLs its own process:
 *           after the external effect, before ctx.transaction (the crash window of plan F02)
 *
 * stdout: one JSON line per event: {"event":"ready","serverId":…}, {"event":"metrics",…}
 * every 500 ms and at exit; stderr: the server's warnings and errors (pino). Besides the
 * library's counters, the metrics line carries loopLagMaxMs and loopLagP99Ms (event-loop
 * delay since start) and handlersRunning / handlersRunningMax (handler calls entered and not
 * yet returned in this process, now and at most: a handler that ignores its abort still counts).
 */
import { randomUUID } from 'node:crypto';
import { PerformanceObserver } from 'node:perf_hooks';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { getHeapStatistics } from 'node:v8';
import { sql } from 'kysely';
import pg from 'pg';
import { type Task, type TaskContext } from '../../../src/index.js';
import {
  abortableSleep,
  commitEffect,
  env,
  errorFields,
  exitWhenParentDies,
  recordExec,
  runWorker,
  say,
  tryRecordExec,
  watchLoopLag,
  workerProcess,
  type OracleWriter,
} from './kit.js';
import { idleTimeoutsTurnedOff, poolWithoutIdleTxTimeout } from './idle-tx-off.js';

exitWhenParentDies();
const sleepMin = Number(env('SLEEP_MIN', '200'));
const sleepMax = Number(env('SLEEP_MAX', '800'));
const ignoreAbort = env('IGNORE_ABORT') === '1';
const reportExec = env('REPORT_EXEC') === '1';
const txHoldMs = Number(env('TX_HOLD_MS', '0'));
const queues = env('QUEUES') === '' ? undefined : (JSON.parse(env('QUEUES')) as Record<string, number>);
const prefetch = env('PREFETCH') === '' ? undefined : Number(env('PREFETCH'));
const poolMax = env('POOL_MAX') === '' ? undefined : Number(env('POOL_MAX'));

const proc = workerProcess({
  concurrency: 4,
  oracle: (concurrency) => concurrency + 2,
  retryDelayMs: 500,
  config: (profile) => ({
    delayedTaskCheckInterval: 500,
    ...(queues ? { queues } : {}),
    ...(prefetch === undefined ? {} : { prefetch }),
    ...profile,
    ...(poolMax === undefined ? {} : { pool: serverPool(poolMax) }),
    ...(env('LISTEN_URL') === '' ? {} : { listenConnectionString: env('LISTEN_URL') }),
    ...(env('IDLE_TX_TIMEOUT') === 'off' ? { pool: poolWithoutIdleTxTimeout(env('DATABASE_URL')) } : {}),
  }),
});
const { schema, worker, server } = proc;
const oracle = proc.oracle!;
const w: OracleWriter = proc.w!;

let handlersRunning = 0;
let handlersRunningMax = 0;

async function handler(task: Task, ctx: TaskContext): Promise<void> {
  handlersRunningMax = Math.max(handlersRunningMax, ++handlersRunning);
  try {
    await runHandler(task, ctx);
  } finally {
    handlersRunning--;
    if (reportExec) say({ event: 'finished', taskId: ctx.taskId, attempt: attempts.get(ctx) ?? null, at: Date.now() });
  }
}

async function runHandler(task: Task, ctx: TaskContext): Promise<void> {
  const attempt = randomUUID();
  const payload = (task.payload ?? {}) as { ms?: number; blockMs?: number; holdMs?: number; mb?: number };
  if (reportExec) sayWhenAborted(ctx, attempt);
  if (task.type === 'fx') return effectOnly(ctx, attempt, payload.ms);
  if (task.type === 'bare') return abortableSleep(payload.ms ?? sleepMin + Math.random() * (sleepMax - sleepMin), ctx.signal, { onlyLaterAborts: true });
  await recordExec(w, ctx, attempt, 'start');
  if (task.type === 'poison') process.exit(42);
  if (task.type === 'flaky' && ctx.retryCount === 0) {
    await recordExec(w, ctx, attempt, 'abort', 'flaky');
    throw new Error('flaky: the first attempt fails');
  }
  try {
    if (task.type === 'block' && ctx.retryCount === 0) {
      // No await for blockMs: no timer runs in this process, heartbeats included.
      const until = performance.now() + (payload.blockMs ?? 6000);
      while (performance.now() < until);
    } else if (task.type === 'alloc') {
      await allocate(payload.mb ?? 200, ignoreAbort ? undefined : ctx.signal);
    } else {
      // An abort before the sleep begins goes unnoticed here (as this worker always had it): the commit meets the lost lease.
      await abortableSleep(payload.ms ?? sleepMin + Math.random() * (sleepMax - sleepMin), ignoreAbort ? undefined : ctx.signal, { onlyLaterAborts: true });
    }
  } catch (err) {
    await tryRecordExec(w, ctx, attempt, 'abort', (err as Error)?.name ?? String(err));
    throw err;
  }
  await recordExec(w, ctx, attempt, 'end');
  if (task.type === 'killtx') await killIfFirstEnd(ctx, attempt);
  if (task.type === 'plain') return;
  const hold = task.type === 'txhold' && ctx.retryCount === 0;
  const onHold = hold ? () => say({ event: 'inTransaction', taskId: ctx.taskId, attempt, at: Date.now() }) : undefined;
  const began = Date.now();
  await commitEffect(w, ctx, attempt, hold ? (payload.holdMs ?? 2000) : txHoldMs, onHold).catch((err: unknown) => {
    if (reportExec)
      say({ event: 'txFailed', taskId: ctx.taskId, attempt, name: (err as Error)?.name ?? null, ...errorFields(err, 200), began, at: Date.now() });
    throw err;
  });
}

/** `fx`: the business effect only, through the library's connections (no oracle row, no oracle connection). */
async function effectOnly(ctx: TaskContext, attempt: string, ms: number | undefined): Promise<void> {
  await abortableSleep(ms ?? sleepMin + Math.random() * (sleepMax - sleepMin), ctx.signal, { onlyLaterAborts: true });
  await ctx.transaction(async (trx) => {
    const { rows } = await sql<{
      lease_token: string;
    }>`SELECT lease_token FROM ${sql.id(schema, 'tasks')} WHERE queue = ${ctx.queue} AND id = ${ctx.taskId}`.execute(trx);
    await sql`INSERT INTO ${sql.id(schema, 'h_effects')} (task_id, lease_token, attempt, worker)
              VALUES (${ctx.taskId}, ${rows[0]?.lease_token ?? null}, ${attempt}, ${worker})`.execute(trx);
  });
}

/** POOL_MAX: connects of the Server's pool, and when each failure happened. */
const connects = { attempts: 0, errors: 0 };

/** POOL_MAX: a pool as the library makes its own (db.ts), but of `max` connections, counting connects. */
function serverPool(max: number): pg.Pool {
  const counted = (err: Error | undefined): void => {
    connects.attempts++;
    if (err === undefined) return;
    if (++connects.errors <= 5000) say({ event: 'connectError', code: (err as { code?: string }).code ?? null, at: Date.now() });
  };
  // pg-pool connects its clients with a callback.
  class CountingClient extends pg.Client {
    override connect(): Promise<pg.Client>;
    override connect(callback: (err: Error) => void): void;
    override connect(callback?: (err: Error) => void): Promise<pg.Client> | void {
      if (callback === undefined) {
        return super.connect().then(
          (c) => (counted(undefined), c),
          (err: Error) => {
            counted(err);
            throw err;
          },
        );
      }
      super.connect((err: Error) => {
        counted(err ?? undefined);
        callback(err);
      });
    }
  }
  return new pg.Pool({
    connectionString: env('DATABASE_URL'),
    application_name: `pgasynq:server:${process.pid}`,
    max,
    keepAlive: true,
    connectionTimeoutMillis: 10_000,
    options: `-c synchronous_commit=${env('POOL_SYNC_COMMIT') === '1' ? 'on' : 'off'}`,
    Client: CountingClient as unknown as pg.PoolConfig['Client'],
  });
}

/** REPORT_EXEC: each handler call's attempt, for its 'finished' line. */
const attempts = new WeakMap<TaskContext, string>();

/** REPORT_EXEC: when (this host's clock) this execution began, and when the library told it to stop, and why. */
function sayWhenAborted(ctx: TaskContext, attempt: string): void {
  attempts.set(ctx, attempt);
  say({ event: 'started', taskId: ctx.taskId, attempt, at: Date.now() });
  const signal = ctx.signal;
  const said = () => say({ event: 'aborted', taskId: ctx.taskId, attempt, reason: (signal.reason as Error)?.name ?? String(signal.reason), at: Date.now() });
  if (signal.aborted) said();
  else signal.addEventListener('abort', said, { once: true });
}

/** `killtx`: SIGKILL this process if the 'end' just written is the task's first. */
async function killIfFirstEnd(ctx: TaskContext, attempt: string): Promise<void> {
  const { rows } = await oracle.query<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".h_exec WHERE task_id = $1 AND phase = 'end'`, [ctx.taskId]);
  if (rows[0]?.n !== 1) return;
  say({ event: 'selfKill', taskId: ctx.taskId, attempt });
  process.kill(process.pid, 'SIGKILL');
}

/** `alloc`: about `mb` MB of small objects (~160 bytes each with their array slot), the last two chunks kept alive. */
async function allocate(mb: number, signal?: AbortSignal): Promise<void> {
  const perChunk = 50_000;
  const chunks = Math.ceil((mb * 1e6) / (perChunk * 160));
  let live: { n: number; s: string; a: number[] }[][] = [];
  for (let c = 0; c < chunks; c++) {
    const chunk: { n: number; s: string; a: number[] }[] = [];
    for (let i = 0; i < perChunk; i++) chunk.push({ n: i, s: `x${i}`, a: [i, c] });
    live = [live.at(-1) ?? [], chunk];
    await nextTurn();
    signal?.throwIfAborted();
  }
}

/** GC_STATS: every GC pause (ms) and kind this process saw (the last 100,000). */
const gcPauses: number[] = [];
let gcCount = 0;
let gcMajorCount = 0;
if (env('GC_STATS') === '1') {
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      gcCount++;
      // detail.kind 4: a major (mark-sweep-compact) collection.
      if ((e as unknown as { detail?: { kind?: number } }).detail?.kind === 4) gcMajorCount++;
      gcPauses.push(e.duration);
      if (gcPauses.length > 100_000) gcPauses.shift();
    }
  }).observe({ entryTypes: ['gc'] });
}
const gcStats = () => {
  if (env('GC_STATS') !== '1') return {};
  const sorted = [...gcPauses].sort((a, b) => a - b);
  const round = (v: number | undefined) => Math.round((v ?? 0) * 10) / 10;
  return {
    gcCount,
    gcMajorCount,
    gcPauseP99Ms: round(sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * 0.99))]),
    gcPauseMaxMs: round(sorted.at(-1)),
    gcPauseTotalMs: round(sorted.reduce((a, b) => a + b, 0)),
    heapLimitMb: Math.round(getHeapStatistics().heap_size_limit / 1e6),
  };
};

const lag = watchLoopLag();
const metrics = () => ({
  event: 'metrics',
  worker,
  ...server.metrics(),
  loopLagMaxMs: lag.maxMs(),
  // The host clock as this process sees it (a test may skew or jump it).
  hostNow: Date.now(),
  loopLagP99Ms: lag.p99Ms(),
  handlersRunning,
  handlersRunningMax,
  ...gcStats(),
  ...(poolMax === undefined ? {} : { connectAttempts: connects.attempts, connectErrors: connects.errors }),
  ...(env('IDLE_TX_TIMEOUT') === 'off' ? { idleTimeoutsTurnedOff: idleTimeoutsTurnedOff.count } : {}),
});

await runWorker(proc, handler, metrics, 500);
