/**
 * What a run measures: the workload cases, their sizes, which systems each
 * runs by default and can run at all, and the rows each fills in the table.
 * Kept apart from run.ts, which starts clusters and processes as it loads, so
 * that the plan can be built and read on its own; it depends only on the
 * command line's choices (PlanOptions).
 */
import { EXTRA, SYSTEMS, type SystemName } from '../adapters/index.js';
import type { W8Hold } from '../workloads/w8-snapshot.js';

export const WORKLOADS = ['W1', 'W2', 'W3', 'W4', 'W5', 'W6', 'W7', 'W8', 'WAL', 'RT'] as const;
export type Workload = (typeof WORKLOADS)[number];

/** The choices of the command line that shape the plan. */
export interface PlanOptions {
  /** --quick: every size ÷ 10 (and shorter W4 spreads, W8 40 s). */
  quick: boolean;
  workloads: readonly Workload[];
  /** --systems, when given: instead of each workload's defaults, those of them it supports. */
  chosenSystems: readonly SystemName[] | undefined;
  /** --w8-reps, --wal-reps: how many times the long cases run. */
  w8Reps: number;
  walReps: number;
  /** --w8-holds: which of W8's holds run (w8-snapshot.ts). */
  w8Holds: readonly W8Hold[];
}

/** W8's holds, in the order they run, each with its case's key and what the labels say of it. */
export const W8_HOLDS: readonly (readonly [hold: W8Hold, key: string, what: string])[] = [
  ['snapshot', 'W8', 'a REPEATABLE READ snapshot'],
  ['xid', 'W8 xid', 'a writing transaction (an XID)'],
  ['readers', 'W8 readers', 'four REPEATABLE READ readers re-scanning the schema'],
];

export interface Row {
  /** Shown in the first column. */
  label: string;
  /** Which figure of the case's result. */
  metric: string;
  better: 'higher' | 'lower';
  unit: 'rate' | 'ms' | 'bytes' | 'count' | 'ratio';
}

export interface Case {
  workload: Workload;
  key: string;
  params: Record<string, number | string>;
  systems: SystemName[];
  rows: Row[];
  timeoutMs: number;
  /** Long cases (W7, W8, WAL): run after the repetitions of the others, this many times (systems alternating). */
  reps?: number;
}

export const fmt = (n: number) => n.toLocaleString('en-US');
const ANY = [...SYSTEMS];
const ALL = SYSTEMS.filter((s) => !EXTRA.includes(s));
const PG_SYSTEMS = ANY.filter((s) => s !== 'bullmq');
const FLOORS: SystemName[] = ['floor', 'floor-prefetch'];
/** Differ from their base system only in the worker's settings (or its commits): left out of enqueue-only and scheduling workloads by default. */
const WORKER_VARIANTS: SystemName[] = ['pgasynq-tuned', 'pgasynq-durable', 'graphile-default'];
const without = (xs: readonly SystemName[], drop: readonly SystemName[]) => xs.filter((s) => !drop.includes(s));

/** Which systems a workload runs by default, and which it can run at all. */
const SUPPORT: Record<Workload, { defaults: SystemName[]; supports: SystemName[] }> = {
  W1: { defaults: without(ALL, WORKER_VARIANTS), supports: ANY },
  W2: { defaults: ALL, supports: ANY },
  // pgasynq-tuned's prefetch changes nothing for an idle worker fed 50 tasks/s (each is claimed as it arrives).
  W3: { defaults: without(ALL, ['pgasynq-tuned']), supports: ANY },
  W4: { defaults: without(ALL, [...FLOORS, ...WORKER_VARIANTS]), supports: without(ANY, FLOORS) },
  W5: { defaults: ['pgasynq', 'floor'], supports: ['pgasynq', 'pgasynq-tuned', ...FLOORS] },
  W6: { defaults: ['pgasynq', 'floor'], supports: ANY },
  W7: { defaults: ['pgasynq', 'floor'], supports: PG_SYSTEMS },
  W8: { defaults: ['pgasynq', 'floor', 'graphile', 'graphile-default'], supports: PG_SYSTEMS },
  WAL: { defaults: ['pgasynq', 'floor'], supports: PG_SYSTEMS },
  // Enqueue and wait for the result: only pgasynq has the call (graphile-worker and pg-boss leave it to the user).
  RT: { defaults: ['pgasynq'], supports: ['pgasynq'] },
};

function systemsFor(w: Workload, chosenSystems: readonly SystemName[] | undefined): SystemName[] {
  const { defaults, supports } = SUPPORT[w];
  return chosenSystems ? SYSTEMS.filter((s) => chosenSystems.includes(s) && supports.includes(s)) : defaults;
}

export function buildPlan(options: PlanOptions): Case[] {
  const { quick, workloads, chosenSystems, w8Reps, walReps, w8Holds } = options;
  const q = (full: number) => (quick ? Math.max(1, Math.round(full / 10)) : full);
  const cases: Case[] = [];
  /** `notByDefault`: systems this case leaves out unless --systems names them. */
  const add = (w: Workload, c: Omit<Case, 'workload' | 'systems'>, notByDefault: readonly SystemName[] = []) => {
    const systems = chosenSystems ? systemsFor(w, chosenSystems) : without(systemsFor(w, chosenSystems), notByDefault);
    if (workloads.includes(w) && systems.length > 0) cases.push({ workload: w, systems, ...c });
  };
  // A drain still going after capMs reports its rate so far: bounds the suite's time when a system is slow.
  const capMs = 10_000;

  const bulk = q(50_000);
  const single = q(5_000);
  add('W1', {
    key: 'W1',
    params: { bulk, single },
    timeoutMs: 300_000,
    rows: [
      { label: `W1 bulk enqueue of ${fmt(bulk)}, tasks/s`, metric: 'bulkPerSec', better: 'higher', unit: 'rate' },
      { label: `W1 one-by-one enqueue of ${fmt(single)}, tasks/s`, metric: 'singlePerSec', better: 'higher', unit: 'rate' },
    ],
  });
  // Two setups: the backlog as a production worker meets it (filled by another process, vacuumed, the clock
  // from before the workers start: the default an outside harness uses), and filled here, timed from the first handler.
  for (const [apart, concurrency, payload] of [
    [1, 10, 0],
    [1, 100, 0],
    [1, 10, 1500],
    [0, 10, 0],
    [0, 100, 0],
    [0, 10, 1500],
  ] as const) {
    const n = q(50_000);
    const what = payload ? `${fmt(payload)}-byte JSON` : 'no-op';
    const setup = apart ? 'filled apart and vacuumed, from start' : 'filled here, from the first task';
    add(
      'W2',
      {
        key: `W2${apart ? ' apart' : ''} c${concurrency}${payload ? ` ${payload}B` : ''}`,
        params: { n, concurrency, capMs, payload, apart },
        timeoutMs: capMs + 180_000,
        rows: [{ label: `W2 drain ${fmt(n)} ${what} tasks (${setup}), concurrency ${concurrency}, tasks/s`, metric: 'perSec', better: 'higher', unit: 'rate' }],
      },
      // With payloads, on request only: BullMQ (on Redis its claim does not rewrite the job's data; on PostgreSQL it
      // drains ~700/s either way) and graphile-default (~900/s either way: one round trip per job, not bytes).
      payload ? ['bullmq', 'bullmq-pg', 'graphile-default'] : [],
    );
  }
  const rtn = q(500);
  add('RT', {
    key: 'RT',
    params: { n: rtn, rate: 50, warmup: quick ? 5 : 10, concurrency: 10 },
    timeoutMs: 180_000,
    rows: (['p50', 'p95', 'p99'] as const).map((m) => ({
      label: `RT enqueueAndWait round trip at 50/s (${rtn} tasks), ${m} ms`,
      metric: m,
      better: 'lower',
      unit: 'ms',
    })),
  });
  const w3n = q(500);
  add('W3', {
    key: 'W3',
    params: { n: w3n, rate: 50, warmup: quick ? 5 : 10, concurrency: 10 },
    timeoutMs: 180_000,
    rows: (['p50', 'p95', 'p99'] as const).map((m) => ({ label: `W3 enqueue→start at 50/s (${w3n} tasks), ${m} ms`, metric: m, better: 'lower', unit: 'ms' })),
  });
  add('W4', {
    key: 'W4',
    params: { n: q(100), leadMs: 2000, spreadMs: quick ? 1000 : 4000, concurrency: 10 },
    timeoutMs: 180_000,
    rows: (['p50', 'p99'] as const).map((m) => ({
      label: `W4 scheduled task start after due (${q(100)} tasks), ${m} ms`,
      metric: m,
      better: 'lower',
      unit: 'ms',
    })),
  });
  for (const finished of [q(10_000), q(1_000_000)]) {
    add('W5', {
      key: `W5 ${finished}`,
      params: { finished, pending: q(5_000), concurrency: 10 },
      timeoutMs: 600_000,
      rows: [
        { label: `W5 claim ms with ${fmt(finished)} finished rows (median)`, metric: 'claimMs', better: 'lower', unit: 'ms' },
        { label: `W5 claim execution ms (EXPLAIN ANALYZE) with ${fmt(finished)} finished rows`, metric: 'explainMs', better: 'lower', unit: 'ms' },
        { label: `W5 claim buffers (EXPLAIN BUFFERS) with ${fmt(finished)} finished rows`, metric: 'explainBuffers', better: 'lower', unit: 'count' },
        { label: `W5 rows per claim with ${fmt(finished)} finished rows`, metric: 'rowsPerClaim', better: 'higher', unit: 'count' },
      ],
    });
  }
  for (const procs of [1, 2, 4, 8]) {
    const n = q(50_000);
    add('W6', {
      key: `W6 ${procs}p`,
      params: { n, procs, concurrency: 10, capMs },
      timeoutMs: capMs + 180_000,
      rows: [{ label: `W6 drain ${fmt(n)}, ${procs} process${procs > 1 ? 'es' : ''} × c10, tasks/s`, metric: 'perSec', better: 'higher', unit: 'rate' }],
    });
  }
  const total = q(1_000_000);
  add('W7', {
    key: 'W7',
    params: { total, batch: q(10_000), backlog: q(50_000), concurrency: 100 },
    timeoutMs: 2_000_000,
    reps: 1,
    rows: [
      { label: `W7 after ${fmt(total)} tasks: all tables of the schema (heap+indexes+toast), MB`, metric: 'totalBytes', better: 'lower', unit: 'bytes' },
      { label: `W7 after ${fmt(total)} tasks: heap, MB`, metric: 'heapBytes', better: 'lower', unit: 'bytes' },
      { label: `W7 after ${fmt(total)} tasks: indexes, MB`, metric: 'indexBytes', better: 'lower', unit: 'bytes' },
      { label: `W7 after ${fmt(total)} tasks: toast, FSM, VM, MB`, metric: 'toastBytes', better: 'lower', unit: 'bytes' },
      { label: `W7 after ${fmt(total)} tasks: n_dead_tup`, metric: 'deadTuples', better: 'lower', unit: 'count' },
      { label: `W7 after ${fmt(total)} tasks: n_live_tup`, metric: 'liveTuples', better: 'lower', unit: 'count' },
      {
        label: `W7 after ${fmt(total)} tasks, once autovacuum visited every table: all tables, MB`,
        metric: 'totalBytesAfterAutovacuum',
        better: 'lower',
        unit: 'bytes',
      },
      {
        label: `W7 after ${fmt(total)} tasks, once autovacuum visited every table: indexes, MB`,
        metric: 'indexBytesAfterAutovacuum',
        better: 'lower',
        unit: 'bytes',
      },
      {
        label: `W7 after ${fmt(total)} tasks, once autovacuum visited every table: n_dead_tup`,
        metric: 'deadTuplesAfterAutovacuum',
        better: 'lower',
        unit: 'count',
      },
      { label: 'W7 wait for autovacuum, s', metric: 'autovacuumWaitS', better: 'lower', unit: 'count' },
      { label: 'W7 tables with ≥ 1,000 dead tuples autovacuum had not visited then', metric: 'tablesNotAutovacuumed', better: 'lower', unit: 'count' },
      { label: `W7 after ${fmt(total)} tasks, then VACUUM: all tables, MB`, metric: 'totalBytesAfterVacuum', better: 'lower', unit: 'bytes' },
      { label: `W7 after ${fmt(total)} tasks, then VACUUM: indexes, MB`, metric: 'indexBytesAfterVacuum', better: 'lower', unit: 'bytes' },
      { label: `W7 throughput while pushing ${fmt(total)} (c100), tasks/s`, metric: 'perSec', better: 'higher', unit: 'rate' },
    ],
  });
  // W8: BENCH.md's 4 minutes at 400/s, the hold from second 20; --quick: 40 s, from second 5. Three holds
  // (w8-snapshot.ts): a REPEATABLE READ snapshot, a writing transaction, four overlapping readers.
  for (const [hold, key, what] of W8_HOLDS.filter(([h]) => w8Holds.includes(h))) {
    const w8 = {
      hold,
      rate: 400,
      seconds: quick ? 40 : 240,
      snapshotAt: quick ? 5 : 20,
      window: 10,
      concurrency: 10,
      producers: 16,
      drainWait: quick ? 10 : 30,
    };
    const before = `before the hold (first ${w8.snapshotAt} s)`;
    add('W8', {
      key,
      params: w8,
      timeoutMs: (w8.seconds + w8.drainWait + 180) * 1000,
      reps: w8Reps,
      rows: [
        {
          label: `${key} ${w8.rate}/s for ${w8.seconds} s, ${what} held from ${w8.snapshotAt} s: achieved enqueue rate, tasks/s`,
          metric: 'achievedRate',
          better: 'higher',
          unit: 'rate',
        },
        { label: `${key} enqueue→start p50 ${before}, ms`, metric: 'p50Before', better: 'lower', unit: 'ms' },
        { label: `${key} enqueue→start p50 in the last 30 s, ms`, metric: 'p50Last30', better: 'lower', unit: 'ms' },
        { label: `${key} p50 last 30 s ÷ p50 ${before}`, metric: 'p50Ratio', better: 'lower', unit: 'ratio' },
        { label: `${key} worst 10 s window's p50 ÷ p50 ${before}`, metric: 'worstWindowRatio', better: 'lower', unit: 'ratio' },
        { label: `${key} enqueue→start p99 ${before}, ms`, metric: 'p99Before', better: 'lower', unit: 'ms' },
        { label: `${key} enqueue→start p99 in the last 30 s, ms`, metric: 'p99Last30', better: 'lower', unit: 'ms' },
        { label: `${key} backlog (enqueued, not started) at the end, tasks`, metric: 'backlogEnd', better: 'lower', unit: 'count' },
        { label: `${key} backlog, max, tasks`, metric: 'backlogMax', better: 'lower', unit: 'count' },
        { label: `${key} dead tuples in the system's schema at the end`, metric: 'deadTuples', better: 'lower', unit: 'count' },
      ],
    });
  }
  // WAL: n tasks through one bulk enqueue, a claim of all n at once (concurrency n), their completion.
  for (const payload of [0, 1500]) {
    const what = payload ? `${fmt(payload)}-byte JSON` : 'no-op';
    // idle and hold: longer than one of pgasynq's heartbeat intervals (5 s), so both see its heartbeats; longer still in full runs.
    const walParams = { n: 5_000, payload, idleMs: quick ? 6000 : 10_000, holdMs: quick ? 6000 : 10_000, settleMs: 1000, verifyMs: quick ? 0 : 11_000 };
    const per = (phase: string, metric: string) => [
      { label: `WAL per ${what} task: ${phase}, bytes`, metric: `${metric}Bytes`, better: 'lower' as const, unit: 'count' as const },
      { label: `WAL per ${what} task: ${phase}, records`, metric: `${metric}Records`, better: 'lower' as const, unit: 'count' as const },
    ];
    add('WAL', {
      key: `WAL${payload ? ` ${payload}B` : ''}`,
      params: walParams,
      timeoutMs: 600_000,
      reps: walReps,
      rows: [
        ...per('enqueue (bulk)', 'enqueue'),
        ...per('claim', 'claim'),
        ...per('completion', 'complete'),
        ...per('all three', 'total'),
        { label: `WAL per ${what} task while running, bytes/s (heartbeats)`, metric: 'holdBytesPerTaskSec', better: 'lower', unit: 'count' },
        { label: `WAL of an idle worker (baseline), bytes/s`, metric: 'idleWorkerBytesPerSec', better: 'lower', unit: 'count' },
        {
          label: `WAL (${what}): autovacuum/autoanalyze runs inside the phases (their WAL is counted in them)`,
          metric: 'autovacuumsInPhases',
          better: 'lower',
          unit: 'count',
        },
      ],
    });
  }
  return cases;
}
