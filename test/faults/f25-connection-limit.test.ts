/**
 * F25 connection-limit (plan §5.2): the owned cluster allows 20 connections
 * (`max_connections = 20`), 5 of them kept for superusers
 * (`superuser_reserved_connections = 5`: the harness, a superuser, keeps its
 * pool of 4 and the sampler). 8 worker processes each want a pool of 5 plus
 * a LISTEN connection, as the library's `pgasynq_worker` login (roleSetupSql),
 * so 15 connections go round 48 wanted: the others are refused with
 * "sorry, too many clients already" (53300).
 *
 * The tasks (`fx`) write their effect only through the library's own
 * connections (no oracle connection in the workers), 600 of them enqueued
 * before the workers start.
 *
 * Expect: no worker process exits (no crash loop), no task lost or archived,
 * every task completed with its effect exactly once, none waiting past twice
 * the suite's bound (the recoverer waits for connections too), and the connection
 * failures said in a few lines per process, not a flood: at most
 * LOG_RUNS × (2 + log2(run seconds)) lines, the schedule of the library's
 * failure log (internal/logger.ts FailureRun: the first line at once, the
 * next after 1 s, 2 s, 4 s, …) for each of the two logs a worker keeps about
 * its connections (the Db's "database unreachable", the listener's).
 * Figures: connect_errors (the server log's refusals, and per process the
 * failed connects of its pool), throughput (tasks/s from the workers' spawn
 * to the drain), log lines per process.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { roleSetupSql } from '../../src/index.js';
import { ORACLE_BOUND_S, recordFigures, sleep } from './harness.js';
import { faultTest } from './kit.js';
import { poll } from './samplers.js';

/**
 * A refused connection inside ctx.transaction fails the attempt, as any handler error
 * (test/faults/RESULTS.md). Up to a quarter of the attempts fail so here on a loaded machine
 * (178 of about 780 in one CI run): with 3 retries, a task failing all four attempts is then
 * to be expected now and then (that run archived one), with 8 it is about 1e-6 per task. What
 * this test is about (no crash loop, nothing lost, a few log lines) does not depend on it.
 */
const MAX_RETRY = 8;
/** The failure logs a worker keeps about its connections: the Db's and the listener's. */
const LOG_RUNS = 2;
const WORKERS = 8;
const POOL = 5;
const TASKS = 600;
faultTest(
  'F25 connection-limit: 8 workers x pool 5 on max_connections=20; no crash loop, nothing lost, a few log lines per process',
  { schema: 'f25', timeout: 240_000, cluster: { settings: { max_connections: 20, superuser_reserved_connections: 5, log_connections: 'off' } } },
  async (h) => {
    // The library's least-privilege worker role (a login), plus the oracle's table and the view the handler reads.
    await h.query(roleSetupSql({ schema: h.schema, logins: true }));
    await h.query('GRANT SELECT ON {{schema}}.tasks TO pgasynq_worker; GRANT INSERT ON {{schema}}.h_effects TO pgasynq_worker');
    const { port } = h.cluster;
    const workerUrl = `postgres://pgasynq_worker_login@127.0.0.1:${port}/postgres`;
    const limits = await h.one<{ max: number; reserved: number }>(
      "SELECT current_setting('max_connections')::int AS max, current_setting('superuser_reserved_connections')::int AS reserved",
    );
    assert.deepEqual(limits, { max: 20, reserved: 5 });

    const producer = await h.spawnProducer({ count: TASKS, rate: 0, inflight: 8, type: 'fx', maxRetry: MAX_RETRY, msMin: 20, msMax: 120 });
    await producer.exited;
    assert.equal(producer.events.find((e) => e.event === 'done')?.acked, TASKS);

    h.startSampler();
    // Backends per role, every 250 ms: the limit is really reached.
    let peakWorkerBackends = 0;
    let peakAllBackends = 0;
    const watcher = poll(250, async () => {
      const r = await h.one<{ w: number; all: number }>(
        "SELECT count(*) FILTER (WHERE usename = 'pgasynq_worker_login')::int AS w, count(*)::int AS all FROM pg_stat_activity WHERE backend_type = 'client backend'",
      );
      peakWorkerBackends = Math.max(peakWorkerBackends, r.w);
      peakAllBackends = Math.max(peakAllBackends, r.all);
    });

    const t0 = performance.now();
    const workers = await h.spawnWorkers(WORKERS, { concurrency: 4, sleepMin: 20, sleepMax: 120, env: { DATABASE_URL: workerUrl, POOL_MAX: String(POOL) } });
    await h.waitDrained(180_000);
    const drainS = (performance.now() - t0) / 1000;
    await sleep(1500); // a last metrics line from every worker
    await watcher.stop();
    await h.stopSampler();

    const c = await h.check({ maxRetry: MAX_RETRY, txTypes: ['fx'] });
    const serverLog = readFileSync(h.cluster.logFile, 'utf8');
    const refusedByServer = serverLog
      .split('\n')
      .filter((l) => l.includes('too many clients already') || l.includes('remaining connection slots are reserved')).length;
    const perWorker = workers.map((w) => {
      const lines = readFileSync(join(h.logDir, `${w.name}.stderr.log`), 'utf8')
        .split('\n')
        .filter(Boolean);
      const parsed = lines.map((l) => {
        try {
          return JSON.parse(l) as { msg?: string; err?: { code?: string; message?: string } };
        } catch {
          return { msg: l };
        }
      });
      // The lines about the state of the connections (the database's and the listener's failure
      // runs), which repeat while it lasts. Lines about one task (its failed attempt, a retried
      // completion) carry the refusal too, but come once per task by design, not per refusal.
      const aboutConnections = parsed.filter((p) => /unreachable|cannot connect/i.test(p.msg ?? ''));
      const messages: Record<string, number> = {};
      for (const p of parsed) messages[p.msg ?? '?'] = (messages[p.msg ?? '?'] ?? 0) + 1;
      const errs = w.events.filter((e) => e.event === 'connectError');
      return {
        worker: w.name,
        logLines: lines.length,
        connectionLogLines: aboutConnections.length,
        messages,
        connectAttempts: (w.metrics as { connectAttempts?: number } | undefined)?.connectAttempts ?? null,
        connectErrors: (w.metrics as { connectErrors?: number } | undefined)?.connectErrors ?? errs.length,
        claimed: w.metrics?.claimed ?? 0,
        errTimes: errs.map((e) => e.at as number),
      };
    });
    const { maxRetried } = await h.one<{ maxRetried: number }>('SELECT coalesce(max(retried), 0)::int AS "maxRetried" FROM {{schema}}.tasks');
    const throughput = Math.round((c.tasks / drainS) * 10) / 10;
    const connectErrors = perWorker.reduce((n, w) => n + w.connectErrors, 0);
    const logBound = LOG_RUNS * (2 + Math.ceil(Math.log2(Math.max(2, drainS))));
    // Per process, the most failed connects in one second: backoff keeps it bounded.
    const peakErrorsPerS = perWorker.map((w) => {
      const perSecond = new Map<number, number>();
      for (const t of w.errTimes) perSecond.set(Math.floor(t / 1000), (perSecond.get(Math.floor(t / 1000)) ?? 0) + 1);
      return Math.max(0, ...perSecond.values());
    });
    // Failed connects that came within 5 ms of the one before in the same process: retried without a wait.
    const errorsWithin5ms = perWorker.reduce((n, w) => n + w.errTimes.filter((t, i) => i > 0 && t - w.errTimes[i - 1]! <= 5).length, 0);
    const messages: Record<string, number> = {};
    for (const w of perWorker) for (const [m, n] of Object.entries(w.messages)) messages[m] = (messages[m] ?? 0) + n;

    const figures = h.figures('F25 connection-limit', c, {
      connect_errors: connectErrors,
      connect_errors_server_log: refusedByServer,
      throughput_per_s: throughput,
      drain_s: Math.round(drainS * 10) / 10,
      log_lines_per_process: perWorker.map((w) => w.logLines),
      connection_log_lines_per_process: perWorker.map((w) => w.connectionLogLines),
      connect_errors_per_process: perWorker.map((w) => w.connectErrors),
      connect_errors_peak_per_s_per_process: peakErrorsPerS,
      connect_errors_within_5ms_of_previous: errorsWithin5ms,
      log_line_bound: logBound,
      log_messages: messages,
      claimed_per_process: perWorker.map((w) => w.claimed),
      peak_worker_backends: peakWorkerBackends,
      peak_backends: peakAllBackends,
      max_retried: maxRetried,
      // fx tasks write no h_exec rows: I5 and the execution counts of h_exec do not apply; retried does.
      token_mismatches: null,
      dup_external: undefined,
      max_attempts_seen: maxRetried + 1,
      notes: `max_connections=20, superuser_reserved_connections=5; ${WORKERS} workers x pool ${POOL} (+ LISTEN) as pgasynq_worker_login; ${TASKS} fx tasks enqueued first; throughput = tasks / (spawn to drain)`,
    });
    recordFigures(figures);
    // Also here: results/ is shared with whatever else runs the suite at the same time.
    console.log(`figures: ${JSON.stringify(figures)}`);

    const problems: string[] = [];
    if (c.lost !== 0) problems.push(`I1: ${c.lost} acknowledged tasks lost`);
    if (c.unfinished !== 0) problems.push(`I1: ${c.unfinished} tasks not completed`);
    if ((c.states.archived ?? 0) !== 0) problems.push(`${c.states.archived} tasks archived`);
    if (c.dupEffects !== 0) problems.push(`I2: ${c.dupEffects} duplicate effects`);
    if (c.orphanEffects !== 0) problems.push(`I2: ${c.orphanEffects} orphan effects`);
    if (c.missingEffects !== 0) problems.push(`I2: ${c.missingEffects} completed tasks without their effect`);
    if (c.overRetried !== 0) problems.push(`I3: ${c.overRetried} tasks over maxRetry`);
    // The bound B assumes the recoverer reaches the database; here its statements are refused
    // like every other's and retried, so a task whose lease ran out may wait for a connection
    // too (7.5 and 10.1 s in two CI runs on a slow day, 8 s allowed elsewhere): twice the bound.
    if (c.stuckMaxS !== null && c.stuckMaxS > 2 * ORACLE_BOUND_S) problems.push(`I4: stuck ${c.stuckMaxS} s`);
    for (const u of h.unexpectedExits()) problems.push(`crash: ${u}`);
    for (const w of perWorker) {
      if (w.connectionLogLines > logBound) problems.push(`${w.worker}: ${w.connectionLogLines} log lines about connections (bound ${logBound}): a flood`);
    }
    assert.deepEqual(problems, []);
    assert.equal(c.tasks, TASKS);
    assert.ok(refusedByServer > 0 && connectErrors > 0, 'the limit refused connections (else this test shows nothing)');
  },
);
