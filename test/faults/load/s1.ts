/**
 * `npm run soak:s1 [-- --minutes 20]`: the reliability plan's soak test
 * S1-short (§5.5), on an owned cluster (../cluster.ts, autovacuum on).
 *
 *   Load      ~100 tasks/s from one producer process (s1-producer.ts): 80 % quick
 *             tx, 10 % fail twice then succeed, 2 % always fail (archived), 5 %
 *             scheduled 1–60 s ahead, 3 % long (2–5 × the lease, heartbeated);
 *             unique locks on 10 % of all tasks (1 in 9 quick or fail-twice); retention
 *             60 s on every task, so the janitor prunes completed rows.
 *   Cron      two Scheduler processes (../children/cron-scheduler.ts) with the same entries:
 *             @every 1s, 10s, 1m, 5m. A trigger copies every scheduler_events
 *             insert into h_cron (the I8 oracle; the library trims its own history).
 *   Workers   4 processes (s1-worker.ts) × concurrency 24, fast profile (lease 3 s,
 *             heartbeat 1 s, cutoff 2 s, recover 1 s: B = 7 s, 8 s with jitter).
 *   Reads     Inspector.getQueueInfo every 5 s.
 *   Faults    every 3–5 min (first after 2 min) one of: kill -9 a worker (respawned
 *             2 s later), SIGSTOP a worker past its lease (9 s) then SIGCONT,
 *             terminate all of one worker's sessions, terminate the listeners,
 *             PostgreSQL crash (-m immediate) + restart, PostgreSQL paused 4 s;
 *             in a random order without repeats (kill -9, SIGSTOP and the crash first,
 *             then the other three), logged with timestamps.
 *   Sampler   I4 and I7 every 500 ms (the harness's).
 *   End       the producer stops after --minutes, the schedulers are stopped, the
 *             queue drains (≤ 5 min), then I1–I8 and the soak figures: worker RSS
 *             slope, open fds and DB connections per process, n_dead_tup, table
 *             size, XID age, p99 latency of the first vs the last quarter.
 *
 * Flags: --minutes N (20), --rate R (100), --workers N (4), --concurrency N (24),
 * --fault-gap S (fixed gap between faults instead of 180–300 s; for trials),
 * --first-fault S (120), --faults a,b,c (the order; default shuffled).
 * Prints a summary, appends a JSON line (recordFigures), and writes
 * results/s1-<stamp>.json and results/s1-<stamp>-timeseries.csv. The flags
 * are s1-config.ts's, the faults s1-faults.ts's, the checks s1-checks.ts's.
 */
import { createHarness, recordFigures, sleep, type Child } from '../harness.js';
import { LoadRun, log, metricTotal, round, spawnLoadChild, table, tableStats, writeResult } from './common.js';
import { quickLatency, s1Checks, s1Problems, soakFigures, soakNotesOf } from './s1-checks.js';
import {
  CONCURRENCY,
  CRON_ENTRIES,
  DURATION_S,
  FAULT_GAP,
  FIRST_FAULT_S,
  L,
  MINUTES,
  ORACLE_EXTRA,
  ORDER,
  PROFILE,
  RATE,
  RETENTION,
  WORKERS,
} from './s1-config.js';
import { startFaults } from './s1-faults.js';

const run = new LoadRun();
const started = new Date();
await run.main({ test: 'S1-short' }, async () => {
  log(
    `S1-short: ${MINUTES} min at ${RATE} tasks/s, ${WORKERS} workers × ${CONCURRENCY}, profile ${JSON.stringify(PROFILE)}, faults ${FAULT_GAP ? `every ${FAULT_GAP} s` : 'every 180–300 s'} from ${FIRST_FAULT_S} s: ${ORDER.join(', ')}`,
  );
  const H = (run.h = await createHarness('s1', { settings: { autovacuum: 'on' } }));
  await H.query(ORACLE_EXTRA);
  const { version } = await H.one<{ version: string }>('SELECT version()');
  const { freeze_max } = await H.one<{ freeze_max: number }>(
    "SELECT setting::bigint::float8 AS freeze_max FROM pg_settings WHERE name = 'autovacuum_freeze_max_age'",
  );

  // Workers (slots w1..wN; a respawn takes its slot), schedulers, sampler.
  const workerSpec = (i: number) => ({
    name: `w${i}`,
    role: 'worker' as const,
    script: 's1-worker.ts',
    env: { WORKER: `w${i}`, CONCURRENCY: String(CONCURRENCY), PROFILE: JSON.stringify(PROFILE) },
  });
  const workers: Child[] = await Promise.all(Array.from({ length: WORKERS }, (_, i) => spawnLoadChild(H, workerSpec(i + 1))));
  const crons: Child[] = await Promise.all(
    [1, 2].map((i) =>
      spawnLoadChild(H, {
        name: `cron${i}`,
        role: 'producer',
        script: '../children/cron-scheduler.ts',
        env: { NAME: `cron${i}`, ENTRIES: JSON.stringify(CRON_ENTRIES), RETENTION: String(RETENTION) },
      }),
    ),
  );
  H.startSampler();

  const t0 = performance.now();
  const el = () => (performance.now() - t0) / 1000;
  const producer = await spawnLoadChild(H, {
    name: 'producer',
    role: 'producer',
    script: 's1-producer.ts',
    env: { ACK_FILE: H.ackFile, COUNT: String(RATE * DURATION_S), RATE: String(RATE), LEASE_MS: String(L), RETENTION: String(RETENTION) },
  });
  log(`load started: ${WORKERS} workers, 2 schedulers, producer`);

  // Completions per second: the workers' `done` counters, dead workers' last values included.
  const rate: { t: number; done: number }[] = [];
  run.every(1000, () => rate.push({ t: el(), done: metricTotal(H, 'done') }));
  const rateBetween = (a: number, b: number): number | null => {
    const p = rate.find((r) => r.t >= a);
    const q = rate.findLast((r) => r.t <= b);
    return p && q && q.t > p.t ? (q.done - p.done) / (q.t - p.t) : null;
  };

  // Inspector stats every 5 s.
  const statsCalls = { ok: 0, errors: 0, ms: [] as number[] };
  let lastInfo: Record<string, unknown> = {};
  run.every(5000, () => {
    const s = performance.now();
    H.inspector.getQueueInfo('default').then(
      (info) => {
        statsCalls.ok++;
        statsCalls.ms.push(performance.now() - s);
        lastInfo = info as unknown as Record<string, unknown>;
      },
      () => statsCalls.errors++,
    );
  });

  // Time series every 5 s: queue states, dead tuples, table size, XID age, per-worker RSS, fds and connections.
  const rows: Record<string, unknown>[] = [];
  const perChild = new Map<Child, { t: number; rss: number; fds: number; conns: number }[]>();
  let monitoring = false;
  run.every(5000, () => {
    if (monitoring || run.stopping) return;
    monitoring = true;
    void (async () => {
      try {
        const t = round(el(), 1)!;
        const st = await tableStats(H).catch(() => undefined);
        const db = await H.one<{ bytes: number; xid_age: number }>(
          "SELECT (pg_total_relation_size('{{schema}}.task_states') + pg_total_relation_size('{{schema}}.task_inputs'))::float8 AS bytes, age(datfrozenxid)::float8 AS xid_age FROM pg_database WHERE datname = current_database()",
        ).catch(() => undefined);
        const conns = Object.fromEntries(
          (
            await H.query<{ app: string; n: number }>(
              "SELECT application_name AS app, count(*)::int AS n FROM pg_stat_activity WHERE backend_type = 'client backend' GROUP BY 1",
            ).catch(() => [])
          ).map((r) => [r.app, r.n]),
        );
        const row: Record<string, unknown> = {
          t_s: t,
          at: new Date().toISOString(),
          done_per_s: round(rateBetween(t - 5, t) ?? NaN, 1),
          pending: lastInfo.pending,
          active: lastInfo.active,
          scheduled: lastInfo.scheduled,
          retry: lastInfo.retry,
          archived: lastInfo.archived,
          completed: lastInfo.completed,
          n_live_tup: st?.n_live_tup,
          n_dead_tup: st?.n_dead_tup,
          autovacuum_count: st?.autovacuum_count,
          tasks_total_mb: db ? round(db.bytes / 2 ** 20, 2) : undefined,
          xid_age: db?.xid_age,
          connections_total: Object.values(conns).reduce((a, b) => a + b, 0),
          listener_connections: conns['pgasynq:listener'] ?? 0,
        };
        workers.forEach((w, i) => {
          const m = w.metrics as Record<string, number> | undefined;
          const c = conns[`pgasynq:server:${w.pid}`] ?? 0;
          row[`w${i + 1}_rss_mb`] = m ? round(m.rss! / 2 ** 20, 1) : undefined;
          row[`w${i + 1}_fds`] = m?.fds;
          row[`w${i + 1}_conns`] = c;
          row[`w${i + 1}_lag_ms`] = m?.loopLagMaxMs;
          if (w.alive && m) {
            const pts = perChild.get(w) ?? [];
            pts.push({ t, rss: m.rss!, fds: m.fds!, conns: c });
            perChild.set(w, pts);
          }
        });
        rows.push(row);
      } finally {
        monitoring = false;
      }
    })();
  });

  // Faults.
  const { faults, pending, loop: faultLoop } = startFaults({ run, H, workers, producer, el, rateBetween });

  // Progress log every minute; then wait for the producer.
  run.every(60_000, () => {
    const p = producer.events.findLast((e) => e.event === 'progress');
    log(
      `${Math.round(el())} s: acked ${p?.acked ?? '?'}, dups ${p?.dups ?? '?'}, errors ${p?.errors ?? '?'}, done/s ${round(rateBetween(el() - 60, el()) ?? NaN)}, pending ${lastInfo.pending}, active ${lastInfo.active}, retry ${lastInfo.retry}, scheduled ${lastInfo.scheduled}`,
    );
  });
  const produced = await producer.waitEvent((e) => e.event === 'done', (DURATION_S + 600) * 1000, 'producer done');
  const loadEndS = el();
  log(`producer done: ${JSON.stringify(produced)}; stopping schedulers`);
  await faultLoop;
  for (const c of crons) H.signal(c, 'SIGTERM');
  await Promise.race([Promise.all(crons.map((c) => c.exited)), sleep(20_000)]);

  // Drain (≤ 5 min).
  const d0 = performance.now();
  let drained = true;
  try {
    await H.waitDrained(300_000);
  } catch (err) {
    drained = false;
    log(`drain: ${err}`);
  }
  const drainS = round((performance.now() - d0) / 1000, 1);
  log(`drained in ${drainS} s; waiting for recovery measurements`);
  await Promise.race([Promise.all(pending), sleep(30_000)]);
  await H.stopSampler();
  run.clearTimers();
  await sleep(5500); // one more monitor row is not needed; let in-flight ones finish

  log('checking invariants');
  const { acked, c, att } = await s1Checks(H);
  const { latency, latencyCalm, p99RatioCalm, all, perMinuteP99, p99Ratio } = await quickLatency(H, faults);
  const { soak, soakDb, inspectorFig } = soakFigures({ H, workers, perChild, rows, loadEndS, freeze_max, statsCalls });

  // Graceful shutdown of the workers (and whether it hangs).
  for (const w of workers) if (w.alive) H.signal(w, 'SIGTERM');
  await Promise.race([Promise.all(workers.map((w) => w.exited)), sleep(25_000)]);
  const unexpected = H.unexpectedExits();

  const problems = s1Problems(c, drained, unexpected);
  const soakNotes = soakNotesOf(soak, p99Ratio, p99RatioCalm);
  const pass = problems.length === 0;
  const finished = new Date();

  const byKind: Record<string, { n: number; recovery_s: (number | null | undefined)[]; throughput_recovery_s: (number | null | undefined)[] }> = {};
  for (const f of faults) {
    const k = (byKind[f.kind] ??= { n: 0, recovery_s: [], throughput_recovery_s: [] });
    k.n++;
    if (f.recovery_s !== undefined) k.recovery_s.push(f.recovery_s);
    k.throughput_recovery_s.push(f.throughput_recovery_s);
  }
  const leasesLost = H.metricSum('leasesLost');
  const fenced = H.metricSum('fencedWrites');
  const recovered = H.metricSum('recovered');
  const notes = [
    `${MINUTES} min at ${RATE}/s (mixed), ${WORKERS}x${CONCURRENCY} fast profile, 2 schedulers`,
    `${faults.length} faults: ${faults.map((f) => `${f.kind}@${f.t_s}s`).join(', ')}`,
    `drain ${drainS} s; p99 quick first/last quarter ${latency.first?.p99_ms}/${latency.last?.p99_ms} ms`,
    `dead tuples max ${soakDb.n_dead_tup_max}; tasks ${soakDb.tasks_total_mb_at_half}→${soakDb.tasks_total_mb_at_load_end} MB`,
    pass ? 'PASS' : `FAIL: ${problems.join('; ')}`,
    ...soakNotes,
  ].join('; ');
  recordFigures({
    test: 'S1-short',
    profile: 'fast',
    tasks: acked,
    lost: c.lost as number,
    dup_effects: c.dup_effects as number,
    orphan_effects: c.orphan_effects as number,
    dup_external: c.dup_external as number,
    max_attempts_seen: Math.max(...att.map((r) => r.max_attempts)),
    stuck_max_s: c.stuck_max_s as number | null,
    recovery_s: faults.map((f) => f.recovery_s ?? f.throughput_recovery_s ?? null) as number[],
    leases_lost: leasesLost,
    fenced_rejections: fenced,
    deadlocks: c.deadlocks as number,
    p50_ms: (all.p50 as number | null) === null ? null : round(all.p50),
    p99_ms: (all.p99 as number | null) === null ? null : round(all.p99),
    notes,
    rescues: recovered,
    faults: faults.map((f) => ({ kind: f.kind, at: f.at, recovery_s: f.recovery_s, throughput_recovery_s: f.throughput_recovery_s })),
    p99_ratio_last_first: p99Ratio,
    p99_ratio_last_first_outside_faults: p99RatioCalm,
    pass,
  });
  const stamp = started.toISOString().replace(/[:.]/g, '-').slice(0, 19);
  const cols = [...new Set(rows.flatMap((r) => Object.keys(r)))];
  const csv = [cols.join(','), ...rows.map((r) => cols.map((k) => (r[k] === undefined || r[k] === null ? '' : String(r[k]))).join(','))].join('\n');
  const csvFile = writeResult(`s1-${stamp}-timeseries.csv`, `${csv}\n`);
  const jsonFile = writeResult(
    `s1-${stamp}.json`,
    `${JSON.stringify({ test: 'S1-short', started, finished, version, args: { MINUTES, RATE, WORKERS, CONCURRENCY, FAULT_GAP, FIRST_FAULT_S, ORDER }, profile: PROFILE, producer: produced, load_s: round(loadEndS), drain_s: drainS, faults, faults_by_kind: byKind, checks: c, latency_quick: { ...latency, all: { p50_ms: round(all.p50), p99_ms: round(all.p99) }, p99_ratio_last_first: p99Ratio }, latency_quick_outside_fault_windows: { ...latencyCalm, p99_ratio_last_first: p99RatioCalm }, p99_per_minute: perMinuteP99.map((r) => ({ minute: r.minute, n: r.n, p99_ms: round(r.p99) })), soak_workers: soak, soak_db: soakDb, inspector: inspectorFig, leases_lost: leasesLost, fenced_writes: fenced, rescues: recovered, archived_by_recoverer: H.metricSum('archivedByRecoverer'), unexpected, problems, soak_notes: soakNotes, pass }, null, 2)}\n`,
  );

  console.log(`\nS1-short — ${started.toISOString()} → ${finished.toISOString()}`);
  console.log(
    table([
      ['load', `${round(loadEndS)} s, producer ${JSON.stringify(produced)}`],
      ['drain', `${drainS} s`],
      ['faults', faults.length],
      ['I1 lost / unfinished / archived not by design', `${c.lost} / ${c.unfinished_all} / ${c.archived_not_by_design}`],
      ['I1 fa archived as designed', `${c.fa_not_archived} not archived`],
      ['I2 dup / orphan / missing effects', `${c.dup_effects} / ${c.orphan_effects} / ${c.missing_effects}`],
      ['I3 attempts by kind', c.attempts_by_kind],
      [
        'I4 stuck_max_s (bound 8) / stuck samples',
        `${c.stuck_max_s} at ${c.stuck_max_at instanceof Date ? c.stuck_max_at.toISOString() : c.stuck_max_at} / ${c.stuck_samples} (${c.samples} samples)`,
      ],
      ['I4 samples over the bound', (c.stuck_over_bound as string[]).join(', ') || 'none'],
      ['I5 token mismatches', c.token_mismatches],
      ['I6 early starts (of scheduled started)', `${c.early_starts} (of ${c.scheduled_started})`],
      ['I7 unique violations (max per sample)', c.uniq_violations],
      [
        'I8 dup ticks / tasks without tick / ticks without effect',
        `${c.cron_dup_ticks} / ${c.cron_tasks_without_tick}+${c.cron_rows_without_tick} / ${c.cron_ticks_without_effect} (${c.cron_ticks} ticks: ${JSON.stringify(c.cron_ticks_by_type)})`,
      ],
      ['deadlocks', c.deadlocks],
      ['dup_external (q, s, long, cron ran > once)', c.dup_external],
      ['leases lost / fenced / rescues', `${leasesLost} / ${fenced} / ${recovered}`],
      ['latency quick (enqueue → effect)', latency],
      ['p99 last/first quarter', p99Ratio],
      ['latency quick outside fault windows', latencyCalm],
      ['p99 last/first quarter outside fault windows', p99RatioCalm],
      ['soak per worker', soak],
      ['soak db', soakDb],
      ['inspector stats', inspectorFig],
      ['faults by kind', byKind],
      ['result', pass ? 'PASS' : `FAIL: ${problems.join('; ')}`],
      ['soak notes', soakNotes.join('; ') || 'none'],
    ]),
  );
  console.log('fault log:');
  for (const f of faults)
    console.log(
      `  ${f.at} (+${f.t_s} s) ${f.kind} ${f.target} — ${f.detail ?? ''}; healed ${f.heal_at}; recovery_s ${f.recovery_s ?? '-'}; throughput_recovery_s ${f.throughput_recovery_s ?? '-'}`,
    );
  console.log(`figures: ${jsonFile}\ntime series: ${csvFile}`);
  return pass;
});
