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
 * The flags and profiles are l1-config.ts's, the phases l1-phases.ts's, the
 * invariants l1-checks.ts's.
 */
import { createHarness, recordFigures } from '../harness.js';
import { LoadRun, log, metricTotal, table, writeResult } from './common.js';
import { invariants } from './l1-checks.js';
import { BATCH, CHAOS, CONCURRENCY, MAX_RETRY, N, NAME, PHASE_C_S, PREFETCH, PROFILE, SETTINGS, TEST, WORKERS, DRAIN_TIMEOUT_S } from './l1-config.js';
import { phaseA, phaseB, phaseC } from './l1-phases.js';

const run = new LoadRun();
const started = new Date();
await run.main({ test: TEST, tasks: N }, async () => {
  log(`${TEST}: ${N.toLocaleString()} tasks, ${WORKERS}×${CONCURRENCY} (prefetch ${PREFETCH}), profile ${JSON.stringify(PROFILE)}`);
  const h = (run.h = await createHarness(NAME, { settings: SETTINGS }));
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

  const a = await phaseA(run, h);
  const b = await phaseB(run, h);
  const inv = await invariants(h);
  const c = PHASE_C_S > 0 && b.drained ? await phaseC(h, b.drain_tasks_per_s) : undefined;
  const unexpected = h.unexpectedExits().filter((u) => !u.includes('SIGKILL'));
  const problems = [
    ...(b.drained ? [] : [`Phase B cut at ${DRAIN_TIMEOUT_S} s with ${b.completed_in_phase} of ${N} done`]),
    ...inv.problems,
    ...unexpected.map((u) => `process: ${u}`),
  ];
  const pass = problems.length === 0;
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
    leases_lost: metricTotal(h, 'leasesLost'),
    fenced_rejections: metricTotal(h, 'fencedWrites'),
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
    `${JSON.stringify({ test: TEST, started, finished, args: { N, CHAOS, WORKERS, CONCURRENCY, PREFETCH, BATCH, PHASE_C_S, MAX_RETRY }, version, settings, reloptions, profile: PROFILE, phaseA: a, phaseB: b, invariants: inv.res, phaseC: c, leases_lost: metricTotal(h, 'leasesLost'), fenced_writes: metricTotal(h, 'fencedWrites'), recovered: metricTotal(h, 'recovered'), problems, pass }, null, 2)}\n`,
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
      ['leases lost / fenced writes / recovered', `${metricTotal(h, 'leasesLost')} / ${metricTotal(h, 'fencedWrites')} / ${metricTotal(h, 'recovered')}`],
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
  return pass;
});
