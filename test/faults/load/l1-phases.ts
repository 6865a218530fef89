/**
 * L1's phases (l1.ts): A, the producer enqueues N tasks; B, the workers
 * drain them (with --chaos, under SIGKILLs and terminated backends), with the
 * figures of the table and the machine; C, the producer at 70 % of B's rate,
 * for end-to-end latency.
 */
import { readFileSync } from 'node:fs';
import { sleep, type Child, type Harness } from '../harness.js';
import { startStuckSampler } from '../samplers.js';
import { BATCH, CHAOS, CONCURRENCY, DRAIN_TIMEOUT_S, MAX_RETRY, N, PHASE_C_S, PREFETCH, PROFILE, WORKERS } from './l1-config.js';
import {
  clock,
  log,
  machineCpu,
  metricTotal,
  NodeCpu,
  postgresCpu,
  respawnLoadChild,
  round,
  sizes,
  spawnLoadChild,
  tableStats,
  type LoadRun,
  type TableStats,
} from './common.js';

/** Autovacuum runs on the task tables (task_states, task_inputs) from the server log (log_autovacuum_min_duration = 0): count and elapsed seconds. */
export function autovacuumLog(h: Harness): { vacuums: number; elapsed_s: number[]; analyzes: number } {
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

export async function phaseA(run: LoadRun, h: Harness) {
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
  const tick = run.every(1000, () => nodeCpu.sample([producer.pid]));
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

export async function phaseB(run: LoadRun, h: Harness) {
  log(`Phase B: ${WORKERS} workers × concurrency ${CONCURRENCY}, prefetch ${PREFETCH}${CHAOS ? ', with chaos' : ''}`);
  const statsBefore = await tableStats(h);
  const sizesBefore = await sizes(h);
  const effectsBefore = await tableStats(h, 'h_effects');
  const wal0 = await h.one<{ lsn: string; xid: string }>('SELECT pg_current_wal_lsn()::text AS lsn, txid_current()::text AS xid');
  const cpu0 = { pg: postgresCpu(h), m: machineCpu() };
  const nodeCpu = new NodeCpu();

  // The I4 sampler for this profile, once a second (I7 is not counted: a scan of 1M rows a second).
  const stuck = startStuckSampler(h, { profile: PROFILE, everyMs: 1000, uniqueKeys: false });
  run.onCleanup(() => void stuck.stop());

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
  const workers: Child[] = [];
  workers.push(...(await Promise.all(Array.from({ length: WORKERS }, (_, i) => spawnLoadChild(h, spec(i + 1))))));
  const readyS = (performance.now() - t0) / 1000;
  log(`  ${WORKERS} workers ready after ${readyS.toFixed(1)} s`);

  // Monitor: completions (workers' counters), dead tuples, CPU, once a second.
  const timeline: { t: number; done: number; dead: number; live: number }[] = [];
  let deadPeak = 0;
  let monitoring = false;
  const monitor = run.every(1000, () => {
    if (monitoring || run.stopping) return;
    monitoring = true;
    nodeCpu.sample(h.children.filter((c) => c.role === 'worker' && c.alive).map((c) => c.pid));
    tableStats(h)
      .then((s) => {
        deadPeak = Math.max(deadPeak, s.n_dead_tup);
        timeline.push({ t: round((performance.now() - t0) / 1000, 1)!, done: metricTotal(h, 'done'), dead: s.n_dead_tup, live: s.n_live_tup });
      })
      .catch(() => {})
      .finally(() => (monitoring = false));
  });

  // Chaos: SIGKILL a random worker every 60 s (respawned 5 s later), terminate a random pgasynq backend every 20 s.
  const faults: Fault[] = [];
  const recoveries: Promise<void>[] = [];
  if (CHAOS) {
    run.every(60_000, () => {
      if (run.stopping) return;
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
        if (run.stopping) return;
        void respawnLoadChild(h, victim).then(
          (c) => {
            workers[workers.indexOf(victim)] = c;
            log(`  chaos: respawned ${c.tag}`);
          },
          (err) => log(`  chaos: respawn failed: ${err}`),
        );
      }, 5000);
    });
    run.every(20_000, () => {
      if (run.stopping) return;
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
    });
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
        `  ${el.toFixed(0)} s: ${metricTotal(h, 'done').toLocaleString()} done (${Math.round(metricTotal(h, 'done') / el)}/s), dead tuples ${timeline.at(-1)?.dead ?? '?'}`,
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
  const doneAtEnd = metricTotal(h, 'done');
  if (!drained) {
    run.stopping = true;
    for (const w of workers) if (w.alive) h.signal(w, 'SIGTERM');
    await Promise.race([Promise.all(workers.map((w) => w.exited)), sleep(30_000)]);
  }
  clearInterval(monitor);
  void stuck.stop();
  run.clearTimers();
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

export async function phaseC(h: Harness, drainRate: number) {
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
