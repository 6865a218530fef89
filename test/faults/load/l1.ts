/**
 * `npm run load:l1 [-- --tasks N | --small] [--chaos] [--phase-c S]`: the
 * reliability plan's load test L1 (§5.4), and with --chaos its variant L1b.
 *
 *   Cluster   owned (../cluster.ts) with shared_buffers=1GB, max_wal_size=8GB,
 *             checkpoint_timeout=15min, synchronous_commit=on, autovacuum=on;
 *             the tasks table carries 0001's autovacuum settings (R14).
 *   Phase A   one producer process enqueues N tasks (default 1,000,000; --small
 *             100,000) with Client.enqueueMany, batches of 1,000, one in flight,
 *             ack log outside the database. Figures: tasks/s, WAL bytes and XIDs per task.
 *   Phase B   8 worker processes × concurrency 16, prefetch 16; a no-op handler
 *             plus the business effect inside ctx.transaction (h_effects).
 *             Figures: drain tasks/s overall and per minute, n_dead_tup peak,
 *             autovacuum runs, HOT ratio, table and index sizes before/after,
 *             CPU split between postgres and node (from /proc).
 *             Invariants: lost = 0, exactly N completed, dup_effects = 0,
 *             orphan/missing effects = 0, retried ≤ max_retry, deadlocks = 0, I4 sampler clean.
 *   Phase C   (not with --chaos; --phase-c 0 skips it) the producer at 70 % of
 *             the Phase B rate for --phase-c seconds (default 120, the plan's 10 min
 *             cut down), batches of 100: end-to-end latency p50/p99/p99.9.
 *   --chaos   (L1b) Phase B plus a SIGKILL of a random worker every 60 s
 *             (respawned 5 s later) and a pg_terminate_backend of a random
 *             `pgasynq:%` backend every 20 s; the workers also write h_exec
 *             'start' rows, so I3 (attempts), I5 (tokens) and dup_external are
 *             checked in full.
 *
 * Profiles: without --chaos the production profile (lease 30 s, heartbeat 5 s,
 * cutoff 30 s, recover 60 s). With --chaos a shortened one (lease 10 s,
 * heartbeat 2 s, cutoff 5 s, recover 5 s), so that a killed worker's tasks
 * are recovered within the run (B = 21 s rather than 121 s).
 *
 * Prints a summary, appends a JSON line to results/reliability-results.jsonl
 * (recordFigures) and writes results/l1[b]-<stamp>.json with everything.
 */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { createHarness, recordFigures, sleep, type Child, type Harness } from '../harness.js';
import {
  NodeCpu,
  clock,
  loadAcked,
  log,
  machineCpu,
  postgresCpu,
  respawnLoadChild,
  round,
  sizes,
  spawnLoadChild,
  table,
  tableStats,
  writeResult,
  type TableStats,
} from './common.js';

const { values: args } = parseArgs({
  options: {
    tasks: { type: 'string' },
    small: { type: 'boolean', default: false },
    chaos: { type: 'boolean', default: false },
    'phase-c': { type: 'string', default: '120' },
    workers: { type: 'string', default: '8' },
    concurrency: { type: 'string', default: '16' },
    prefetch: { type: 'string', default: '16' },
    batch: { type: 'string', default: '1000' },
    'drain-timeout': { type: 'string' },
  },
});
const N = Number(args.tasks ?? (args.small ? 100_000 : 1_000_000));
const CHAOS = args.chaos;
const PHASE_C_S = CHAOS ? 0 : Number(args['phase-c']);
const WORKERS = Number(args.workers);
const CONCURRENCY = Number(args.concurrency);
const PREFETCH = Number(args.prefetch);
const BATCH = Number(args.batch);
const NAME = CHAOS ? 'l1b' : 'l1';
const TEST = CHAOS ? 'L1b chaos drain' : N === 100_000 ? 'L1-small' : 'L1';
const MAX_RETRY = CHAOS ? 25 : 5;
/**
 * Phase B stops here if it has not drained: the workers are shut down and the figures say how far it got.
 * Room for 200 tasks/s: this two-core machine drained 1,000,000 at 933/s on one day and 340/s on another.
 */
const DRAIN_TIMEOUT_S = Number(args['drain-timeout'] ?? Math.max(1200, N / 200));

const PRODUCTION = {
  leaseDuration: 30_000,
  heartbeatInterval: 5_000,
  recoverCutoff: 30_000,
  recoverInterval: 60_000,
  taskCheckInterval: 1_000,
  shutdownTimeout: 8_000,
};
const CHAOS_PROFILE = {
  leaseDuration: 10_000,
  heartbeatInterval: 2_000,
  recoverCutoff: 5_000,
  recoverInterval: 5_000,
  taskCheckInterval: 1_000,
  shutdownTimeout: 8_000,
};
const PROFILE = CHAOS ? CHAOS_PROFILE : PRODUCTION;
/** I4's bound B = L + C + R + 1 s, plus 1 s of jitter for the oracle. */
const BOUND_S = (PROFILE.leaseDuration + PROFILE.recoverCutoff + PROFILE.recoverInterval) / 1000 + 2;

const SETTINGS = {
  shared_buffers: "'1GB'",
  max_wal_size: "'8GB'",
  checkpoint_timeout: "'15min'",
  synchronous_commit: 'on',
  autovacuum: 'on',
  max_connections: 250,
  log_autovacuum_min_duration: 0,
};

/** Autovacuum runs on the task tables (task_states, task_inputs) from the server log (log_autovacuum_min_duration = 0): count and elapsed seconds. */
function autovacuumLog(h: Harness): { vacuums: number; elapsed_s: number[]; analyzes: number } {
  const lines = readFileSync(h.cluster.logFile, 'utf8').split('\n');
  const elapsed: number[] = [];
  let analyzes = 0;
  lines.forEach((l, i) => {
    const taskTable = l.includes(`.${h.schema}.task_states"`) || l.includes(`.${h.schema}.task_inputs"`);
    if (l.includes('automatic analyze of table') && taskTable) analyzes++;
    if (!(l.includes('automatic vacuum of table') && taskTable)) return;
    for (const m of lines.slice(i, i + 20)) {
      const e = /elapsed: ([\d.]+) s/.exec(m);
      if (e) {
        elapsed.push(Number(e[1]));
        break;
      }
    }
  });
  return { vacuums: elapsed.length, elapsed_s: elapsed, analyzes };
}

let h: Harness | undefined;
let stopping = false;
const timers: NodeJS.Timeout[] = [];
const cleanup = async () => {
  stopping = true;
  for (const t of timers) clearInterval(t);
  if (h) await h.teardown().catch((err) => log(`teardown: ${err}`));
  h = undefined;
};
for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.on(sig, () => {
    log(`${sig}: tearing down`);
    void cleanup().then(() => process.exit(130));
  });
}

const workers: Child[] = [];
const sumMetric = (key: string): number =>
  h!.children.filter((c) => c.role === 'worker').reduce((s, c) => s + Number((c.metrics as Record<string, unknown> | undefined)?.[key] ?? 0), 0);

async function phaseA(h: Harness) {
  log(`Phase A: enqueue ${N.toLocaleString()} tasks in batches of ${BATCH}`);
  const before = await h.one<{ lsn: string; xid: string }>('SELECT pg_current_wal_lsn()::text AS lsn, txid_current()::text AS xid');
  const cpu0 = { pg: postgresCpu(h), m: machineCpu() };
  const nodeCpu = new NodeCpu();
  const t0 = performance.now();
  const producer = await spawnLoadChild(h, {
    name: 'producer',
    role: 'producer',
    script: 'l1-producer.ts',
    env: { ACK_FILE: h.ackFile, COUNT: String(N), BATCH: String(BATCH), TYPE: 'l1', MAX_RETRY: String(MAX_RETRY) },
  });
  const tick = setInterval(() => nodeCpu.sample([producer.pid]), 1000);
  timers.push(tick);
  let lastLog = 0;
  const done = await new Promise<Record<string, any>>((resolve, reject) => {
    const poll = setInterval(() => {
      const p = producer.events.findLast((e) => e.event === 'progress');
      if (p && performance.now() - lastLog > 15_000) {
        lastLog = performance.now();
        log(`  enqueued ${p.acked.toLocaleString()} (${Math.round(p.acked / (p.ms / 1000))}/s)`);
      }
    }, 1000);
    producer
      .waitEvent((e) => e.event === 'done' || e.event === 'error', 3_600_000, 'done')
      .then(
        (e) => {
          clearInterval(poll);
          resolve(e);
        },
        (err) => {
          clearInterval(poll);
          reject(err);
        },
      );
  });
  nodeCpu.sample([producer.pid]);
  clearInterval(tick);
  const wallS = (performance.now() - t0) / 1000;
  if (done.event === 'error') throw new Error(`producer failed after ${done.acked} tasks: ${done.message}`);
  await producer.exited;
  const after = await h.one<{ wal: number; xids: number }>(
    'SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8 AS wal, (txid_current() - $2::bigint - 1)::float8 AS xids',
    [before.lsn, before.xid],
  );
  const m = machineCpu();
  const res = {
    tasks: done.acked as number,
    producer_s: round(done.ms / 1000, 2),
    wall_s: round(wallS, 2),
    tasks_per_s: Math.round(done.acked / (done.ms / 1000)),
    batches: done.batches,
    wal_bytes: after.wal,
    wal_bytes_per_task: round(after.wal / done.acked, 1),
    xids: after.xids,
    xids_per_task: round(after.xids / done.acked, 4),
    cpu_s: {
      postgres: round(postgresCpu(h) - cpu0.pg),
      node: round(nodeCpu.total()),
      machine_busy: round(m.busy - cpu0.m.busy),
      machine_total: round(m.total - cpu0.m.total),
    },
  };
  log(`Phase A done: ${res.tasks_per_s} tasks/s, ${res.wal_bytes_per_task} WAL bytes/task, ${res.xids} XIDs`);
  return res;
}

interface Fault {
  at: string;
  t_s: number;
  kind: 'sigkill' | 'terminate';
  target: string;
  detail?: string;
  recovery_s?: number | null;
}

async function phaseB(h: Harness) {
  log(`Phase B: ${WORKERS} workers × concurrency ${CONCURRENCY}, prefetch ${PREFETCH}${CHAOS ? ', with chaos' : ''}`);
  const statsBefore = await tableStats(h);
  const sizesBefore = await sizes(h);
  const effectsBefore = await tableStats(h, 'h_effects');
  const wal0 = await h.one<{ lsn: string; xid: string }>('SELECT pg_current_wal_lsn()::text AS lsn, txid_current()::text AS xid');
  const cpu0 = { pg: postgresCpu(h), m: machineCpu() };
  const nodeCpu = new NodeCpu();

  // The I4 sampler for this profile: active rows whose lease expired more than C + R + 1 s ago,
  // and the longest time since any active row's last extension (now − lease_expires_at + L).
  // `lease_owner IS NOT NULL` (always true when active) lets tasks_active_idx serve: no scan of 1M rows a second.
  const secs = (PROFILE.recoverCutoff + PROFILE.recoverInterval) / 1000 + 1;
  let sampling = false;
  const sampler = setInterval(() => {
    if (sampling || stopping) return;
    sampling = true;
    h.query(
      `INSERT INTO {{schema}}.h_samples (stuck, stuck_max_s, uniq_violations)
       SELECT count(*) FILTER (WHERE lease_expires_at < now() - make_interval(secs => $1)),
              max(extract(epoch FROM clock_timestamp() - lease_expires_at))::float8 + $2, 0
       FROM {{schema}}.tasks WHERE state = 'active' AND lease_owner IS NOT NULL`,
      [secs, PROFILE.leaseDuration / 1000],
    )
      .catch(() => {})
      .finally(() => (sampling = false));
  }, 1000);
  timers.push(sampler);

  const t0 = performance.now();
  const spec = (i: number) => ({
    name: `w${i}`,
    role: 'worker' as const,
    script: 'l1-worker.ts',
    env: {
      WORKER: `w${i}`,
      CONCURRENCY: String(CONCURRENCY),
      PREFETCH: String(PREFETCH),
      PROFILE: JSON.stringify(PROFILE),
      RETRY_DELAY_MS: '1000',
      ...(CHAOS ? { EXEC: '1' } : {}),
    },
  });
  workers.push(...(await Promise.all(Array.from({ length: WORKERS }, (_, i) => spawnLoadChild(h, spec(i + 1))))));
  const readyS = (performance.now() - t0) / 1000;
  log(`  ${WORKERS} workers ready after ${readyS.toFixed(1)} s`);

  // Monitor: completions (workers' counters), dead tuples, CPU, once a second.
  const timeline: { t: number; done: number; dead: number; live: number }[] = [];
  let deadPeak = 0;
  let monitoring = false;
  const monitor = setInterval(() => {
    if (monitoring || stopping) return;
    monitoring = true;
    nodeCpu.sample(h.children.filter((c) => c.role === 'worker' && c.alive).map((c) => c.pid));
    tableStats(h)
      .then((s) => {
        deadPeak = Math.max(deadPeak, s.n_dead_tup);
        timeline.push({ t: round((performance.now() - t0) / 1000, 1)!, done: sumMetric('done'), dead: s.n_dead_tup, live: s.n_live_tup });
      })
      .catch(() => {})
      .finally(() => (monitoring = false));
  }, 1000);
  timers.push(monitor);

  // Chaos: SIGKILL a random worker every 60 s (respawned 5 s later), terminate a random pgasynq backend every 20 s.
  const faults: Fault[] = [];
  const recoveries: Promise<void>[] = [];
  if (CHAOS) {
    const killer = setInterval(() => {
      if (stopping) return;
      const alive = workers.filter((w) => w.alive);
      const victim = alive[Math.floor(Math.random() * alive.length)];
      if (!victim) return;
      const f: Fault = { at: clock(), t_s: round((performance.now() - t0) / 1000)!, kind: 'sigkill', target: victim.tag };
      faults.push(f);
      const serverId = victim.serverId!;
      // Recovery: from the kill until every task that server held active has left `active`.
      recoveries.push(
        h.trackRecovery(serverId, 180_000).then(
          (s) => void (f.recovery_s = s),
          () => void (f.recovery_s = null),
        ),
      );
      h.signal(victim, 'SIGKILL');
      log(`  chaos: SIGKILL ${victim.tag}`);
      setTimeout(() => {
        if (stopping) return;
        void respawnLoadChild(h, victim).then(
          (c) => {
            workers[workers.indexOf(victim)] = c;
            log(`  chaos: respawned ${c.tag}`);
          },
          (err) => log(`  chaos: respawn failed: ${err}`),
        );
      }, 5000);
    }, 60_000);
    const terminator = setInterval(() => {
      if (stopping) return;
      h.query<{ app: string; state: string; q: string; ok: boolean }>(
        `SELECT application_name AS app, state, left(query, 60) AS q, pg_terminate_backend(pid) AS ok FROM (
           SELECT pid, application_name, state, query FROM pg_stat_activity
           WHERE application_name LIKE 'pgasynq:%' AND pid <> pg_backend_pid() ORDER BY random() LIMIT 1) x`,
      ).then(
        ([r]) => {
          if (!r) return;
          faults.push({
            at: clock(),
            t_s: round((performance.now() - t0) / 1000)!,
            kind: 'terminate',
            target: r.app,
            detail: `${r.state}: ${r.q.replace(/\s+/g, ' ')}`,
          });
          log(`  chaos: terminated ${r.app} (${r.state})`);
        },
        () => {},
      );
    }, 20_000);
    timers.push(killer, terminator);
  }

  // Drain: nothing pending, active, scheduled or retry (partial-index counts, cheap at any size).
  let drained = false;
  let lastLog = performance.now();
  for (;;) {
    await sleep(2000);
    const r = await h
      .one<{ a: number; d: number; p: boolean }>(
        `SELECT (SELECT count(*) FROM {{schema}}.tasks WHERE state = 'active' AND lease_owner IS NOT NULL)::int AS a,
                (SELECT count(*) FROM {{schema}}.tasks WHERE state IN ('scheduled', 'retry'))::int AS d,
                EXISTS (SELECT 1 FROM {{schema}}.tasks WHERE state = 'pending') AS p`,
      )
      .catch(() => undefined);
    if (performance.now() - lastLog > 30_000) {
      lastLog = performance.now();
      const el = (performance.now() - t0) / 1000;
      log(
        `  ${el.toFixed(0)} s: ${sumMetric('done').toLocaleString()} done (${Math.round(sumMetric('done') / el)}/s), dead tuples ${timeline.at(-1)?.dead ?? '?'}`,
      );
    }
    if (r && r.a === 0 && r.d === 0 && !r.p) {
      drained = true;
      break;
    }
    if (performance.now() - t0 > DRAIN_TIMEOUT_S * 1000) {
      log(`Phase B did not drain within ${DRAIN_TIMEOUT_S} s: shutting the workers down and reporting how far it got`);
      break;
    }
  }
  const drainS = (performance.now() - t0) / 1000;
  const doneAtEnd = sumMetric('done');
  if (!drained) {
    stopping = true;
    for (const w of workers) if (w.alive) h.signal(w, 'SIGTERM');
    await Promise.race([Promise.all(workers.map((w) => w.exited)), sleep(30_000)]);
  }
  clearInterval(monitor);
  clearInterval(sampler);
  for (const t of timers) clearInterval(t);
  nodeCpu.sample(h.children.filter((c) => c.role === 'worker' && c.alive).map((c) => c.pid));
  const m = machineCpu();
  const cpu = {
    postgres: round(postgresCpu(h) - cpu0.pg),
    node: round(nodeCpu.total()),
    machine_busy: round(m.busy - cpu0.m.busy),
    machine_total: round(m.total - cpu0.m.total),
  };
  const wal1 = await h.one<{ wal: number; xids: number }>(
    'SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8 AS wal, (txid_current() - $2::bigint - 1)::float8 AS xids',
    [wal0.lsn, wal0.xid],
  );
  log(`Phase B drained in ${drainS.toFixed(1)} s; waiting for recoveries to be measured`);
  await Promise.race([Promise.all(recoveries), sleep(5000)]);

  // Pause 2 s for the stats collector, then read the counters.
  await sleep(2000);
  const statsAfter = await tableStats(h);
  const sizesAfter = await sizes(h);
  const perMinute: number[] = [];
  for (let k = 60; ; k += 60) {
    const at = timeline.find((p) => p.t >= k);
    const prev = k === 60 ? { done: 0 } : timeline.find((p) => p.t >= k - 60);
    if (!at || !prev) {
      const last = timeline.at(-1);
      if (last && prev && last.t > k - 60) perMinute.push(Math.round((last.done - prev.done) / (last.t - (k - 60))));
      break;
    }
    perMinute.push(Math.round((at.done - prev.done) / 60));
  }
  const d = (k: keyof TableStats) => statsAfter[k] - statsBefore[k];
  const avLog = autovacuumLog(h);
  const upd = d('n_tup_upd');
  const n = drained ? N : doneAtEnd;
  const res = {
    drained,
    completed_in_phase: doneAtEnd,
    drain_s: round(drainS, 1),
    workers_ready_s: round(readyS, 1),
    drain_tasks_per_s: Math.round(n / drainS),
    drain_tasks_per_s_after_ready: Math.round(n / (drainS - readyS)),
    per_minute_tasks_per_s: perMinute,
    n_dead_tup_peak: deadPeak,
    autovacuum_runs: d('autovacuum_count'),
    autoanalyze_runs: d('autoanalyze_count'),
    autovacuum_log_whole_run: avLog,
    updates: upd,
    hot_updates: d('n_tup_hot_upd'),
    hot_ratio: upd > 0 ? round(d('n_tup_hot_upd') / upd, 3) : null,
    updates_per_task: round(upd / n, 2),
    h_effects_inserts: (await tableStats(h, 'h_effects')).n_tup_ins - effectsBefore.n_tup_ins,
    wal_bytes_per_task: round(wal1.wal / n, 1),
    xids_per_task: round(wal1.xids / n, 3),
    sizes_before: sizesBefore,
    sizes_after: sizesAfter,
    cpu_s: cpu,
    cpu_share: { postgres: round(cpu.postgres! / cpu.machine_busy!, 2), node: round(cpu.node! / cpu.machine_busy!, 2) },
    faults,
    timeline_every_10s: timeline.filter((_, i) => i % 10 === 0),
  };
  log(`Phase B: ${res.drain_tasks_per_s} tasks/s, dead peak ${deadPeak}, autovacuum ${res.autovacuum_runs}, HOT ${res.hot_ratio}`);
  return res;
}

async function invariants(h: Harness) {
  log('Checking invariants');
  const acked = await loadAcked(h, h.ackedIds());
  const one = async (text: string, values?: unknown[]): Promise<any> => (await h.query(text, values))[0];
  const { lost } = await one(
    "SELECT count(*)::int AS lost FROM {{schema}}.h_acked a WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.tasks t WHERE t.queue = 'default' AND t.id = a.id)",
  );
  const states = Object.fromEntries(
    (await h.query<{ state: string; n: number }>("SELECT state, count(*)::int AS n FROM {{schema}}.tasks WHERE type = 'l1' GROUP BY 1 ORDER BY 1")).map((r) => [
      r.state,
      r.n,
    ]),
  );
  const { dup } = await one('SELECT count(*)::int AS dup FROM (SELECT task_id FROM {{schema}}.h_effects GROUP BY 1 HAVING count(*) > 1) d');
  const { orphan } = await one(
    "SELECT count(*)::int AS orphan FROM {{schema}}.h_effects e WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.tasks t WHERE t.queue = 'default' AND t.id = e.task_id AND t.state = 'completed')",
  );
  const { missing } = await one(
    "SELECT count(*)::int AS missing FROM {{schema}}.tasks t WHERE t.state = 'completed' AND NOT EXISTS (SELECT 1 FROM {{schema}}.h_effects e WHERE e.task_id = t.id)",
  );
  const { over } = await one('SELECT count(*)::int AS over FROM {{schema}}.tasks WHERE retried > max_retry');
  const { retried_tasks, max_retried } = await one(
    'SELECT count(*) FILTER (WHERE retried > 0)::int AS retried_tasks, coalesce(max(retried), 0)::int AS max_retried FROM {{schema}}.tasks',
  );
  const { null_tokens, dup_tokens } = await one(
    'SELECT count(*) FILTER (WHERE lease_token IS NULL)::int AS null_tokens, (count(lease_token) - count(DISTINCT lease_token))::int AS dup_tokens FROM {{schema}}.h_effects',
  );
  const { deadlocks } = await one('SELECT deadlocks::int FROM pg_stat_database WHERE datname = current_database()');
  const s = await one(
    'SELECT max(stuck_max_s)::float8 AS stuck_max_s, coalesce(max(stuck), 0)::int AS stuck, count(*)::int AS samples FROM {{schema}}.h_samples',
  );
  let exec: Record<string, number> | undefined;
  if (CHAOS) {
    const e: Record<string, number> = await one(`
      SELECT count(*) FILTER (WHERE n > 1)::int AS dup_external, coalesce(max(n), 0)::int AS max_attempts
      FROM (SELECT task_id, count(DISTINCT attempt) AS n FROM {{schema}}.h_exec WHERE phase = 'start' GROUP BY 1) x`);
    exec = e;
    const { mismatch } = await one(`
      SELECT count(*)::int AS mismatch FROM {{schema}}.h_effects e
      WHERE e.lease_token IS NULL OR NOT EXISTS (
        SELECT 1 FROM {{schema}}.h_exec x WHERE x.attempt = e.attempt AND x.phase = 'start' AND x.lease_token = e.lease_token)`);
    e.token_mismatches = mismatch;
  }
  const completed = states.completed ?? 0;
  const res = {
    acked,
    lost,
    completed,
    states,
    dup_effects: dup,
    orphan_effects: orphan,
    missing_effects: missing,
    over_retried: over,
    retried_tasks,
    max_retried,
    effect_null_tokens: null_tokens,
    effect_dup_tokens: dup_tokens,
    deadlocks,
    stuck_max_s: round(s.stuck_max_s),
    stuck_samples: s.stuck,
    samples: s.samples,
    ...(exec ?? {}),
  };
  const problems: string[] = [];
  if (acked !== N) problems.push(`acked ${acked} ≠ ${N}`);
  if (lost !== 0) problems.push(`I1: ${lost} acknowledged tasks lost`);
  if (completed !== N) problems.push(`I1: ${completed} completed ≠ ${N}`);
  if (dup !== 0) problems.push(`I2: ${dup} duplicate effects`);
  if (orphan !== 0) problems.push(`I2: ${orphan} orphan effects`);
  if (missing !== 0) problems.push(`I2: ${missing} completed tasks without their effect`);
  if (over !== 0) problems.push(`I3: ${over} tasks retried more than max_retry`);
  if (exec && exec.max_attempts! > MAX_RETRY + 1) problems.push(`I3: a task ran ${exec.max_attempts} times`);
  if (null_tokens !== 0) problems.push(`I5: ${null_tokens} effects written without this lease's token`);
  if (exec && exec.token_mismatches !== 0) problems.push(`I5: ${exec.token_mismatches} effects under another attempt's lease`);
  if (s.stuck !== 0 || (s.stuck_max_s ?? 0) > BOUND_S) problems.push(`I4: stuck ${s.stuck}, stuck_max_s ${s.stuck_max_s} (bound ${BOUND_S})`);
  if (deadlocks !== 0) problems.push(`${deadlocks} deadlocks`);
  return { res, problems };
}

async function phaseC(h: Harness, drainRate: number) {
  const rate = Math.max(100, Math.round(0.7 * drainRate));
  const count = rate * PHASE_C_S;
  log(`Phase C: ${rate} tasks/s (70 % of ${drainRate}) for ${PHASE_C_S} s, batches of 100`);
  const producer = await spawnLoadChild(h, {
    name: 'producer-c',
    role: 'producer',
    script: 'l1-producer.ts',
    env: { ACK_FILE: `${h.ackFile}.c`, COUNT: String(count), BATCH: '100', RATE: String(rate), TYPE: 'l1c', MAX_RETRY: String(MAX_RETRY) },
  });
  const done = await producer.waitEvent((e) => e.event === 'done' || e.event === 'error', (PHASE_C_S + 300) * 1000, 'done');
  const t0 = performance.now();
  await h.waitDrained(120_000);
  const lat = await h.one<{ p50: number; p99: number; p999: number; max: number; n: number; completed: number }>(`
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::float8 AS p50, percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::float8 AS p99,
           percentile_cont(0.999) WITHIN GROUP (ORDER BY ms)::float8 AS p999, max(ms)::float8 AS max, count(*)::int AS n,
           count(*) FILTER (WHERE state = 'completed')::int AS completed
    FROM (SELECT state, extract(epoch FROM completed_at - enqueued_at) * 1000 AS ms FROM {{schema}}.tasks WHERE type = 'l1c') x`);
  const res = {
    seconds: PHASE_C_S,
    target_rate: rate,
    enqueued: done.acked,
    achieved_rate: Math.round(done.acked / (done.ms / 1000)),
    completed: lat.completed,
    tail_drain_s: round((performance.now() - t0) / 1000),
    e2e_ms: { p50: round(lat.p50), p99: round(lat.p99), p999: round(lat.p999), max: round(lat.max) },
    error: done.event === 'error' ? done.message : undefined,
  };
  log(`Phase C: e2e latency p50 ${res.e2e_ms.p50} ms, p99 ${res.e2e_ms.p99} ms, p99.9 ${res.e2e_ms.p999} ms`);
  return res;
}

const started = new Date();
let exitCode = 1;
try {
  log(`${TEST}: ${N.toLocaleString()} tasks, ${WORKERS}×${CONCURRENCY} (prefetch ${PREFETCH}), profile ${JSON.stringify(PROFILE)}`);
  h = await createHarness(NAME, { settings: SETTINGS });
  const shown = await h.query<{ name: string; setting: string; unit: string | null }>(
    `SELECT name, setting, unit FROM pg_settings WHERE name IN ('shared_buffers', 'max_wal_size', 'checkpoint_timeout', 'synchronous_commit', 'autovacuum',
       'autovacuum_naptime', 'autovacuum_max_workers', 'fsync', 'wal_level', 'max_connections') ORDER BY 1`,
  );
  const settings = Object.fromEntries(shown.map((r) => [r.name, r.unit ? `${r.setting} ${r.unit}` : r.setting]));
  const reloptions = Object.fromEntries(
    (
      await h.query<{ t: string; o: string[] }>(
        "SELECT relname AS t, reloptions AS o FROM pg_class WHERE oid IN ('{{schema}}.task_states'::regclass, '{{schema}}.task_inputs'::regclass) ORDER BY 1",
      )
    ).map((r) => [r.t, r.o]),
  );
  log(`settings: ${JSON.stringify(settings)}`);
  const { version } = await h.one<{ version: string }>('SELECT version()');

  const a = await phaseA(h);
  const b = await phaseB(h);
  const inv = await invariants(h);
  const c = PHASE_C_S > 0 && b.drained ? await phaseC(h, b.drain_tasks_per_s) : undefined;
  const unexpected = h.unexpectedExits().filter((u) => !u.includes('SIGKILL'));
  const problems = [
    ...(b.drained ? [] : [`Phase B cut at ${DRAIN_TIMEOUT_S} s with ${b.completed_in_phase} of ${N} done`]),
    ...inv.problems,
    ...unexpected.map((u) => `process: ${u}`),
  ];
  const pass = problems.length === 0;
  exitCode = pass ? 0 : 1;
  const finished = new Date();

  const notes = [
    `${N} tasks; Phase A ${a.tasks_per_s}/s (batches of ${BATCH}, one in flight), ${a.wal_bytes_per_task} WAL B/task, ${a.xids_per_task} XID/task`,
    `Phase B ${WORKERS}x${CONCURRENCY} prefetch ${PREFETCH}: ${b.drain_tasks_per_s}/s, dead peak ${b.n_dead_tup_peak}, autovacuum ${b.autovacuum_runs}, HOT ${b.hot_ratio}`,
    CHAOS
      ? `chaos: ${b.faults.filter((f) => f.kind === 'sigkill').length} SIGKILLs, ${b.faults.filter((f) => f.kind === 'terminate').length} backend terminations`
      : '',
    c ? `Phase C ${c.target_rate}/s for ${c.seconds} s: e2e p50 ${c.e2e_ms.p50} ms, p99 ${c.e2e_ms.p99} ms, p99.9 ${c.e2e_ms.p999} ms` : '',
    `profile lease ${PROFILE.leaseDuration / 1000} s / heartbeat ${PROFILE.heartbeatInterval / 1000} s / cutoff ${PROFILE.recoverCutoff / 1000} s / recover ${PROFILE.recoverInterval / 1000} s`,
    pass ? 'PASS' : `FAIL: ${problems.join('; ')}`,
  ]
    .filter(Boolean)
    .join('; ');
  const killRecoveries = b.faults.filter((f) => f.kind === 'sigkill').map((f) => f.recovery_s ?? null);
  recordFigures({
    test: TEST,
    profile: CHAOS ? 'chaos (10/2/5/5 s)' : 'production',
    tasks: N,
    lost: inv.res.lost,
    dup_effects: inv.res.dup_effects,
    orphan_effects: inv.res.orphan_effects,
    dup_external: (inv.res as Record<string, unknown>).dup_external as number | undefined,
    max_attempts_seen: (inv.res as Record<string, unknown>).max_attempts as number | undefined,
    stuck_max_s: inv.res.stuck_max_s,
    recovery_s: CHAOS ? (killRecoveries as number[]) : null,
    leases_lost: sumMetric('leasesLost'),
    fenced_rejections: sumMetric('fencedWrites'),
    deadlocks: inv.res.deadlocks,
    p50_ms: c?.e2e_ms.p50 ?? null,
    p99_ms: c?.e2e_ms.p99 ?? null,
    notes,
    completed: inv.res.completed,
    enqueue_tasks_per_s: a.tasks_per_s,
    wal_bytes_per_task_enqueue: a.wal_bytes_per_task,
    xids_per_task_enqueue: a.xids_per_task,
    drain_tasks_per_s: b.drain_tasks_per_s,
    drain_per_minute: b.per_minute_tasks_per_s,
    n_dead_tup_peak: b.n_dead_tup_peak,
    autovacuum_runs: b.autovacuum_runs,
    hot_ratio: b.hot_ratio,
    cpu_share: b.cpu_share,
    pass,
  });
  const stamp = started.toISOString().replace(/[:.]/g, '-').slice(0, 19);
  const file = writeResult(
    `${NAME}-${stamp}.json`,
    `${JSON.stringify({ test: TEST, started, finished, args: { N, CHAOS, WORKERS, CONCURRENCY, PREFETCH, BATCH, PHASE_C_S, MAX_RETRY }, version, settings, reloptions, profile: PROFILE, phaseA: a, phaseB: b, invariants: inv.res, phaseC: c, leases_lost: sumMetric('leasesLost'), fenced_writes: sumMetric('fencedWrites'), recovered: sumMetric('recovered'), problems, pass }, null, 2)}\n`,
  );

  console.log(`\n${TEST} — ${started.toISOString()} → ${finished.toISOString()}`);
  console.log(
    table([
      ['tasks', N],
      ['Phase A enqueue tasks/s', a.tasks_per_s],
      ['Phase A WAL bytes/task', a.wal_bytes_per_task],
      ['Phase A XIDs used (per task)', `${a.xids} (${a.xids_per_task})`],
      ['Phase A CPU s', a.cpu_s],
      ['Phase B drain s', b.drain_s],
      ['Phase B drain tasks/s', `${b.drain_tasks_per_s} (${b.drain_tasks_per_s_after_ready} after workers ready)`],
      ['Phase B per minute tasks/s', b.per_minute_tasks_per_s.join(', ')],
      ['Phase B n_dead_tup peak', b.n_dead_tup_peak],
      [
        'Phase B autovacuum runs',
        `${b.autovacuum_runs} (whole run, server log: ${b.autovacuum_log_whole_run.vacuums} vacuums of tasks, elapsed ${b.autovacuum_log_whole_run.elapsed_s.join('/')} s; ${b.autovacuum_log_whole_run.analyzes} analyzes)`,
      ],
      ['Phase B HOT ratio', `${b.hot_ratio} (${b.hot_updates}/${b.updates}, ${b.updates_per_task} updates/task)`],
      ['Phase B WAL B/task, XIDs/task', `${b.wal_bytes_per_task}, ${b.xids_per_task}`],
      ['sizes before (MB)', b.sizes_before],
      ['sizes after (MB)', b.sizes_after],
      ['Phase B CPU s', b.cpu_s],
      ['Phase B CPU share', b.cpu_share],
      ...(c ? ([['Phase C', c]] as [string, unknown][]) : []),
      ...(CHAOS
        ? ([
            ['faults', b.faults.length],
            ['SIGKILL recovery_s', killRecoveries.join(', ')],
          ] as [string, unknown][])
        : []),
      ['leases lost / fenced writes / recovered', `${sumMetric('leasesLost')} / ${sumMetric('fencedWrites')} / ${sumMetric('recovered')}`],
      ['invariants', inv.res],
      ['result', pass ? 'PASS' : `FAIL: ${problems.join('; ')}`],
    ]),
  );
  if (CHAOS)
    for (const f of b.faults)
      console.log(
        `  fault ${f.at} +${f.t_s}s ${f.kind} ${f.target}${f.detail ? ` (${f.detail})` : ''}${f.recovery_s !== undefined ? ` recovery ${f.recovery_s} s` : ''}`,
      );
  console.log(`figures: ${file}`);
} catch (err) {
  log(`FAILED: ${(err as Error)?.stack ?? err}`);
  recordFigures({ test: TEST, tasks: N, notes: `FAILED: ${String((err as Error)?.message ?? err)}` });
} finally {
  await cleanup();
}
process.exit(exitCode);
