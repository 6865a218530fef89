/**
 * The benchmark suite: pgasynq side by side with its peers (BENCH.md).
 *
 *   npm run bench                                   # everything, 3 repetitions
 *   npm run bench -- --quick                        # sizes ÷ 10, for development
 *   npm run bench -- --workloads W2,W3 --systems pgasynq,graphile --reps 5
 *
 * Installs bench/'s own dependencies (the peers) first when they are missing
 * or stale, then starts a throwaway PostgreSQL cluster with production
 * settings (lib/cluster.ts; removed at the end, also on Ctrl-C) unless a
 * database is given with --database-url or DATABASE_URL. Every measurement
 * runs in a process of its own (bench/measure.ts);
 * systems alternate (A B C … A B C …) within each workload case, and each
 * repetition goes through every case before the next one starts, so a noisy
 * minute hits all systems alike. Prints a table of medians with the ratio
 * pgasynq ÷ peer (median of the ratios paired run by run), and writes every
 * raw figure to bench/results/<timestamp>.json.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { appendFileSync, cpSync, existsSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ALIASES, EXTRA, SYSTEMS, type SystemName } from './adapters/index.js';
import { PRODUCTION_SETTINGS, readSettings, startBenchCluster, type BenchCluster } from './lib/cluster.js';
import { REDIS_URL, median, now, parseArgs } from './lib/common.js';

const BENCH = dirname(fileURLToPath(import.meta.url));
const ROOT = dirname(BENCH);
const WORKLOADS = ['W1', 'W2', 'W3', 'W4', 'W5', 'W6', 'W7', 'W8', 'WAL', 'RT'] as const;
type Workload = (typeof WORKLOADS)[number];

const USAGE = `usage: npm run bench -- [--workloads W1,W2,…] [--systems ${SYSTEMS.join(',')}] [--reps N] [--quick] [--no-install]
  --workloads     which workloads (default: all of ${WORKLOADS.join(',')})
  --systems       which systems (default: each workload's default set; see bench/README.md)
  --reps          repetitions of every measurement (default 3, --quick 1; W7 runs once, W8 and WAL see below)
  --w8-reps       repetitions of W8 (default 1: 4 min per system; systems alternate)
  --wal-reps      repetitions of WAL (default 1)
  --quick         every size ÷ 10 (and shorter W4 spreads, W8 40 s), for development
  --database-url  measure on this database instead of a throwaway cluster (so does DATABASE_URL
                  in the environment); it should have production settings (autovacuum on)
  --no-install    do not check bench/node_modules
  --live          measure src/ as it is at each measurement, instead of a copy taken at the start`;

// ---------------------------------------------------------------- arguments

const args = parseArgs(process.argv.slice(2));
if (args.help || args.h) {
  console.log(USAGE);
  process.exit(0);
}
const quick = args.quick === 'true';
const positive = (flag: string, def: number): number => {
  const n = Number(args[flag] ?? def);
  if (!Number.isInteger(n) || n < 1) fail(`--${flag} must be a positive integer`);
  return n;
};
const reps = positive('reps', quick ? 1 : 3);
const w8Reps = positive('w8-reps', 1);
const walReps = positive('wal-reps', 1);
const workloads = list(args.workloads, WORKLOADS, (w) => w.toUpperCase());
const chosenSystems = args.systems ? list(args.systems, SYSTEMS, (s) => ALIASES[s.toLowerCase()] ?? s.toLowerCase()) : undefined;

function list<T extends string>(value: string | undefined, all: readonly T[], norm: (s: string) => string): T[] {
  if (!value || value === 'true') return [...all];
  const out = value
    .split(',')
    .map((s) => norm(s.trim()))
    .filter(Boolean);
  for (const s of out) if (!all.includes(s as T)) fail(`unknown name "${s}" (known: ${all.join(', ')})`);
  return out as T[];
}

function fail(message: string): never {
  console.error(`${message}\n\n${USAGE}`);
  process.exit(2);
}

// ------------------------------------------------------------- dependencies

/** npm install --prefix bench when bench/node_modules is missing or older than package.json / the lockfile. */
function ensureDependencies(): void {
  const manifest = ['package.json', 'package-lock.json'].map((f) => join(BENCH, f)).filter(existsSync);
  const hash = createHash('sha256');
  for (const f of manifest) hash.update(readFileSync(f));
  const digest = hash.digest('hex');
  const stamp = join(BENCH, 'node_modules', '.bench-deps-stamp');
  if (existsSync(stamp) && readFileSync(stamp, 'utf8') === digest) return;
  console.log('Installing the peers into bench/node_modules (npm install --prefix bench) …');
  execFileSync('npm', ['install', '--prefix', BENCH, '--no-audit', '--no-fund'], { stdio: 'inherit', cwd: ROOT });
  // The install may have written the lockfile: stamp what is there now.
  const after = createHash('sha256');
  for (const f of ['package.json', 'package-lock.json'].map((f) => join(BENCH, f)).filter(existsSync)) after.update(readFileSync(f));
  writeFileSync(stamp, after.digest('hex'));
}

if (args.install !== 'false' && args['no-install'] !== 'true') ensureDependencies();

// ----------------------------------------------------------------- database

/** The child measurement in progress, killed with its process group on Ctrl-C. */
let currentChild: ChildProcess | undefined;
let cluster: BenchCluster | undefined;
let snapshotDir: string | undefined;

function cleanUp(): void {
  if (currentChild?.pid && currentChild.exitCode === null) {
    try {
      process.kill(-currentChild.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  cluster?.destroy();
  if (snapshotDir) rmSync(snapshotDir, { recursive: true, force: true });
}
// Synchronous, idempotent: on a normal end, an exception, or a signal.
process.on('exit', cleanUp);
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
  process.on(signal, () => {
    console.error(`\n${signal}: stopping the measurement${cluster ? ' and removing the throwaway cluster' : ''} …`);
    cleanUp();
    process.exit(130);
  });
}

const givenUrl = args['database-url'] && args['database-url'] !== 'true' ? args['database-url'] : process.env.DATABASE_URL;
if (givenUrl) {
  process.env.DATABASE_URL = givenUrl;
} else {
  console.log('Starting a throwaway PostgreSQL cluster with production settings …');
  cluster = await startBenchCluster();
  process.env.DATABASE_URL = cluster.url;
  console.log(`  ${cluster.url} (data in ${cluster.dir}; removed at the end)`);
}
const DATABASE_URL = process.env.DATABASE_URL;

// ----------------------------------------------------------------- snapshot

/**
 * Copies src/ and migrations/ to bench/.snapshot/<stamp>/ (with a node_modules
 * link to the project's), so that every measurement of this run imports the
 * same pgasynq even if src/ is edited meanwhile. Returns the copy's index.ts
 * and what identifies it (HEAD, whether src/ differed from it).
 */
function snapshotSource(stamp: string): { index: string; commit: string; dirty: string } {
  const dir = join(BENCH, '.snapshot');
  rmSync(dir, { recursive: true, force: true });
  snapshotDir = dir;
  const root = join(dir, stamp);
  mkdirSync(root, { recursive: true });
  cpSync(join(ROOT, 'src'), join(root, 'src'), { recursive: true });
  cpSync(join(ROOT, 'migrations'), join(root, 'migrations'), { recursive: true });
  symlinkSync(join(ROOT, 'node_modules'), join(root, 'node_modules'), 'dir');
  const git = (...a: string[]) => {
    try {
      return execFileSync('git', a, { cwd: ROOT, encoding: 'utf8' }).trim();
    } catch {
      return '?';
    }
  };
  const dirty = git('status', '--porcelain', '--', 'src', 'migrations');
  return {
    index: join(root, 'src', 'index.ts'),
    commit: git('rev-parse', '--short', 'HEAD'),
    dirty: dirty ? dirty.split('\n').length + ' uncommitted file(s) in src/ or migrations/' : 'clean',
  };
}

// -------------------------------------------------------------------- plan

interface Row {
  /** Shown in the first column. */
  label: string;
  /** Which figure of the case's result. */
  metric: string;
  better: 'higher' | 'lower';
  unit: 'rate' | 'ms' | 'bytes' | 'count' | 'ratio';
}

interface Case {
  workload: Workload;
  key: string;
  params: Record<string, number>;
  systems: SystemName[];
  rows: Row[];
  timeoutMs: number;
  /** Long cases (W7, W8, WAL): run after the repetitions of the others, this many times (systems alternating). */
  reps?: number;
}

const q = (full: number) => (quick ? Math.max(1, Math.round(full / 10)) : full);
const fmt = (n: number) => n.toLocaleString('en-US');
const ANY = [...SYSTEMS];
const ALL = SYSTEMS.filter((s) => !EXTRA.includes(s));
const PG_SYSTEMS = ANY.filter((s) => s !== 'bullmq');
const FLOORS: SystemName[] = ['floor', 'floor-prefetch'];
/** Differ from their base system only in the worker's settings: left out of enqueue-only and scheduling workloads by default. */
const WORKER_VARIANTS: SystemName[] = ['pgasynq-tuned', 'graphile-default'];
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

function systemsFor(w: Workload): SystemName[] {
  const { defaults, supports } = SUPPORT[w];
  return chosenSystems ? SYSTEMS.filter((s) => chosenSystems.includes(s) && supports.includes(s)) : defaults;
}

function buildPlan(): Case[] {
  const cases: Case[] = [];
  /** `notByDefault`: systems this case leaves out unless --systems names them. */
  const add = (w: Workload, c: Omit<Case, 'workload' | 'systems'>, notByDefault: readonly SystemName[] = []) => {
    const systems = chosenSystems ? systemsFor(w) : without(systemsFor(w), notByDefault);
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
  for (const [concurrency, payload] of [
    [10, 0],
    [100, 0],
    [10, 1500],
  ] as const) {
    const n = q(50_000);
    const what = payload ? `${fmt(payload)}-byte JSON` : 'no-op';
    add(
      'W2',
      {
        key: `W2 c${concurrency}${payload ? ` ${payload}B` : ''}`,
        params: { n, concurrency, capMs, payload },
        timeoutMs: capMs + 180_000,
        rows: [{ label: `W2 drain ${fmt(n)} ${what} tasks, concurrency ${concurrency}, tasks/s`, metric: 'perSec', better: 'higher', unit: 'rate' }],
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
    timeoutMs: 1_800_000,
    reps: 1,
    rows: [
      { label: `W7 after ${fmt(total)} tasks: all tables of the schema (heap+indexes+toast), MB`, metric: 'totalBytes', better: 'lower', unit: 'bytes' },
      { label: `W7 after ${fmt(total)} tasks: heap, MB`, metric: 'heapBytes', better: 'lower', unit: 'bytes' },
      { label: `W7 after ${fmt(total)} tasks: indexes, MB`, metric: 'indexBytes', better: 'lower', unit: 'bytes' },
      { label: `W7 after ${fmt(total)} tasks: toast, FSM, VM, MB`, metric: 'toastBytes', better: 'lower', unit: 'bytes' },
      { label: `W7 after ${fmt(total)} tasks: n_dead_tup`, metric: 'deadTuples', better: 'lower', unit: 'count' },
      { label: `W7 after ${fmt(total)} tasks: n_live_tup`, metric: 'liveTuples', better: 'lower', unit: 'count' },
      { label: `W7 after ${fmt(total)} tasks, then VACUUM: all tables, MB`, metric: 'totalBytesAfterVacuum', better: 'lower', unit: 'bytes' },
      { label: `W7 after ${fmt(total)} tasks, then VACUUM: indexes, MB`, metric: 'indexBytesAfterVacuum', better: 'lower', unit: 'bytes' },
      { label: `W7 throughput while pushing ${fmt(total)} (c100), tasks/s`, metric: 'perSec', better: 'higher', unit: 'rate' },
    ],
  });
  // W8: BENCH.md's 4 minutes at 400/s, the snapshot from second 20; --quick: 40 s, from second 5.
  const w8 = { rate: 400, seconds: quick ? 40 : 240, snapshotAt: quick ? 5 : 20, window: 10, concurrency: 10, producers: 16, drainWait: quick ? 10 : 30 };
  const before = `before the snapshot (first ${w8.snapshotAt} s)`;
  add('W8', {
    key: 'W8',
    params: w8,
    timeoutMs: (w8.seconds + w8.drainWait + 180) * 1000,
    reps: w8Reps,
    rows: [
      {
        label: `W8 ${w8.rate}/s for ${w8.seconds} s, snapshot from ${w8.snapshotAt} s: achieved enqueue rate, tasks/s`,
        metric: 'achievedRate',
        better: 'higher',
        unit: 'rate',
      },
      { label: `W8 enqueue→start p50 ${before}, ms`, metric: 'p50Before', better: 'lower', unit: 'ms' },
      { label: `W8 enqueue→start p50 in the last 30 s, ms`, metric: 'p50Last30', better: 'lower', unit: 'ms' },
      { label: `W8 p50 last 30 s ÷ p50 ${before}`, metric: 'p50Ratio', better: 'lower', unit: 'ratio' },
      { label: `W8 enqueue→start p99 ${before}, ms`, metric: 'p99Before', better: 'lower', unit: 'ms' },
      { label: `W8 enqueue→start p99 in the last 30 s, ms`, metric: 'p99Last30', better: 'lower', unit: 'ms' },
      { label: `W8 backlog (enqueued, not started) at the end, tasks`, metric: 'backlogEnd', better: 'lower', unit: 'count' },
      { label: `W8 backlog, max, tasks`, metric: 'backlogMax', better: 'lower', unit: 'count' },
      { label: `W8 dead tuples in the system's schema at the end`, metric: 'deadTuples', better: 'lower', unit: 'count' },
    ],
  });
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

// ------------------------------------------------------------ measurements

interface Measurement {
  workload: Workload;
  case: string;
  system: SystemName;
  rep: number;
  params: Record<string, number>;
  startedAt: string;
  seconds: number;
  loadavg1: number;
  result?: Record<string, number | string>;
  error?: string;
}

const stamp = new Date().toISOString().replace(/[:.]/g, '-').replace('Z', '');
const RESULTS = join(BENCH, 'results');
mkdirSync(RESULTS, { recursive: true });
const base = join(RESULTS, `${stamp}${quick ? '-quick' : ''}`);
const logFile = `${base}.log`;
const live = args.live === 'true';
const source = live ? undefined : snapshotSource(stamp);
const childEnv = { ...process.env, DATABASE_URL, REDIS_URL, ...(source ? { PGASYNQ_SRC: source.index } : {}) };

function runOne(c: Case, system: SystemName): Promise<{ result?: Record<string, number | string>; error?: string }> {
  return new Promise((resolve) => {
    const spec = JSON.stringify({ workload: c.workload, system, params: c.params });
    appendFileSync(logFile, `\n=== ${new Date().toISOString()} ${c.key} ${system} ${spec}\n`);
    const child = spawn(process.execPath, ['--import', 'tsx', join(BENCH, 'measure.ts'), spec], {
      cwd: ROOT,
      env: childEnv,
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true, // its own process group, so a timeout (or Ctrl-C) ends its W6 children too
    });
    currentChild = child;
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      appendFileSync(logFile, d);
    });
    child.stderr.on('data', (d: Buffer) => {
      err += d.toString();
      appendFileSync(logFile, d);
    });
    const timer = setTimeout(() => {
      err += `\ntimed out after ${c.timeoutMs / 1000} s`;
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        child.kill('SIGKILL');
      }
    }, c.timeoutMs);
    child.on('close', (code) => {
      clearTimeout(timer);
      const line = out.split('\n').find((l) => l.startsWith('RESULT '));
      if (line) resolve({ result: JSON.parse(line.slice(7)) });
      else resolve({ error: `exit ${code}: ${lastLines(err, 6)}` });
    });
  });
}

const lastLines = (s: string, n: number) => s.trim().split('\n').slice(-n).join(' | ').slice(0, 600);

// ------------------------------------------------------------------ report

function value(ms: Measurement[], c: Case, system: SystemName, rep: number, metric: string): number | undefined {
  const m = ms.find((x) => x.case === c.key && x.system === system && x.rep === rep);
  const v = m?.result?.[metric];
  return typeof v === 'number' && Number.isFinite(v) ? v : undefined;
}

function formatValue(v: number | undefined, unit: Row['unit']): string {
  if (typeof v !== 'number' || Number.isNaN(v)) return '–';
  switch (unit) {
    case 'rate':
      return fmt(Math.round(v));
    case 'ms':
      return v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : fmt(Math.round(v));
    case 'bytes':
      return (v / 1024 / 1024).toFixed(1);
    case 'count':
      if (Math.abs(v) < 0.05) return '0';
      return Math.abs(v) < 100 && !Number.isInteger(v) ? v.toFixed(1) : fmt(Math.round(v));
    case 'ratio':
      return `${v.toFixed(2)}×`;
  }
}

interface TableRow {
  label: string;
  better: Row['better'];
  unit: Row['unit'];
  medians: Partial<Record<SystemName, number>>;
  ratios: Partial<Record<SystemName, number>>;
  spread: Partial<Record<SystemName, [number, number]>>;
  /** Some repetition stopped at the drain cap: its figure is the rate over the first capMs. */
  capped: Partial<Record<SystemName, boolean>>;
}

function tabulate(cases: Case[], ms: Measurement[]): TableRow[] {
  const rows: TableRow[] = [];
  const repsOf = (c: Case) => Array.from({ length: c.reps ?? reps }, (_, i) => i + 1);
  const summarize = (
    label: string,
    better: Row['better'],
    unit: Row['unit'],
    systems: SystemName[],
    get: (s: SystemName, rep: number) => number | undefined,
    repList: number[],
    capped: (s: SystemName, rep: number) => boolean = () => false,
  ) => {
    const row: TableRow = { label, better, unit, medians: {}, ratios: {}, spread: {}, capped: {} };
    for (const s of systems) {
      if (repList.some((r) => capped(s, r))) row.capped[s] = true;
      const vs = repList.map((r) => get(s, r)).filter((v): v is number => v !== undefined);
      if (vs.length) {
        row.medians[s] = median(vs);
        row.spread[s] = [Math.min(...vs), Math.max(...vs)];
      }
      if (s !== 'pgasynq') {
        const paired = repList
          .map((r) => [get('pgasynq', r), get(s, r)] as const)
          // A ratio means something only between two positive figures (WAL's net figures may be 0 or, within noise, below).
          .filter((p): p is readonly [number, number] => p[0] !== undefined && p[1] !== undefined && p[0] > 0 && p[1] > 0)
          .map(([a, b]) => a / b);
        if (paired.length) row.ratios[s] = median(paired);
      }
    }
    rows.push(row);
  };
  // W5: claim cost at the larger size ÷ at the smaller, paired by repetition; right after W5's own rows.
  const w5 = cases.filter((c) => c.workload === 'W5');
  const w5Ratios = () => {
    const [small, large] = w5 as [Case, Case];
    for (const [metric, what] of [
      ['claimMs', 'claim round trip'],
      ['explainMs', 'claim execution'],
    ] as const) {
      summarize(
        `W5 ${what} with ${fmt(large.params.finished!)} ÷ with ${fmt(small.params.finished!)} finished rows`,
        'lower',
        'ratio',
        small.systems,
        (s, rep) => {
          const a = value(ms, large, s, rep, metric);
          const b = value(ms, small, s, rep, metric);
          return a !== undefined && b !== undefined ? a / b : undefined;
        },
        repsOf(small),
      );
    }
  };
  for (const c of cases) {
    for (const r of c.rows) {
      const capped = (s: SystemName, rep: number) => r.unit === 'rate' && value(ms, c, s, rep, 'capped') === 1;
      summarize(r.label, r.better, r.unit, c.systems, (s, rep) => value(ms, c, s, rep, r.metric), repsOf(c), capped);
    }
    if (w5.length === 2 && c === w5[1]) w5Ratios();
  }
  return rows;
}

function markdown(rows: TableRow[], systems: SystemName[]): string {
  const head = `| figure | ${systems.join(' | ')} |\n|---|${systems.map(() => '---:').join('|')}|`;
  const body = rows.map((r) => {
    const arrow = r.better === 'higher' ? ' ↑' : ' ↓';
    const cells = systems.map((s) => {
      const v = formatValue(r.medians[s], r.unit) + (r.capped[s] ? '†' : '');
      const ratio = r.ratios[s];
      return s === 'pgasynq' || ratio === undefined || r.unit === 'ratio' ? v : `${v} (${ratio.toFixed(2)}×)`;
    });
    return `| ${r.label}${arrow} | ${cells.join(' | ')} |`;
  });
  return [head, ...body].join('\n');
}

/** W8 per window: p50 / p99 ms (backlog at the window's end), median over W8's repetitions. */
function w8Windows(cs: Case[], ms: Measurement[]): string | undefined {
  const c = cs.find((x) => x.workload === 'W8');
  if (!c) return undefined;
  const { seconds, window, snapshotAt } = c.params as { seconds: number; window: number; snapshotAt: number };
  const n = Math.ceil(seconds / window);
  const systems = c.systems;
  const cell = (s: SystemName, key: string) => {
    const get = (m: string) =>
      median(
        ms
          .filter((x) => x.case === c.key && x.system === s)
          .map((x) => x.result?.[`${key}.${m}`])
          .filter((v): v is number => typeof v === 'number'),
      );
    const p50 = get('p50');
    if (Number.isNaN(p50)) return '–';
    return `${formatValue(p50, 'ms')} / ${formatValue(get('p99'), 'ms')} (${formatValue(get('backlog'), 'count')})`;
  };
  const head = `| W8 enqueued during (s) | ${systems.join(' | ')} |\n|---|${systems.map(() => '---:').join('|')}|`;
  const body = Array.from({ length: n }, (_, w) => {
    const key = `w${String(w).padStart(2, '0')}`;
    const from = w * window;
    const mark = from <= snapshotAt && snapshotAt < from + window ? ' ◆' : '';
    return `| ${from}–${Math.min(from + window, seconds)}${mark} | ${systems.map((s) => cell(s, key)).join(' | ')} |`;
  });
  return [
    `W8 enqueue→start per ${window} s window: p50 / p99 ms (backlog at the window's end); ◆ the snapshot is taken at ${snapshotAt} s.`,
    '',
    head,
    ...body,
  ].join('\n');
}

function settingsLine(): string {
  const s = serverSettings;
  if (s.error) return `settings unreadable (${s.error})`;
  return ['autovacuum', 'fsync', 'synchronous_commit', 'shared_buffers', 'max_wal_size', 'checkpoint_timeout', 'max_connections']
    .map((k) => `${k}=${s[k]}`)
    .join(', ');
}

// -------------------------------------------------------------------- main

async function versions(): Promise<Record<string, string>> {
  const v: Record<string, string> = { node: process.version };
  for (const p of ['graphile-worker', 'pg-boss', 'bullmq', 'ioredis', 'pg']) {
    try {
      v[p] = JSON.parse(readFileSync(join(BENCH, 'node_modules', p, 'package.json'), 'utf8')).version;
    } catch {
      v[p] = 'not installed';
    }
  }
  v.pgasynq = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')).version;
  v['pgasynq.source'] = source ? `src/ copied at the start of the run: HEAD ${source.commit}, ${source.dirty}` : 'src/ live (--live)';
  try {
    v.postgresql = serverSettings.server_version ?? '?';
  } catch (e) {
    v.postgresql = `unreachable: ${(e as Error).message}`;
  }
  try {
    const { Redis } = await import('ioredis');
    const r = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 1 });
    await r.connect();
    const info = await r.info('server');
    v.redis = /redis_version:(\S+)/.exec(info)?.[1] ?? '?';
    const persistence = await r.info('persistence');
    v['redis.aof_enabled'] = /aof_enabled:(\S+)/.exec(persistence)?.[1] ?? '?';
    r.disconnect();
  } catch (e) {
    v.redis = `unreachable: ${(e as Error).message}`;
  }
  return v;
}

const cases = buildPlan();
if (cases.length === 0) fail('nothing to run: no workload supports the chosen systems');
const total = cases.reduce((n, c) => n + c.systems.length * (c.reps ?? reps), 0);
/** The server's settings as it reports them (SHOW), whoever started it. */
const serverSettings = await readSettings(DATABASE_URL).catch((e: Error): Record<string, string> => ({ error: e.message }));
const database = {
  throwaway: Boolean(cluster),
  url: DATABASE_URL.replace(/\/\/([^:@/]+):[^@/]*@/, '//$1:***@'),
  requested: cluster ? PRODUCTION_SETTINGS : 'given with --database-url or DATABASE_URL: its own settings',
  settings: serverSettings,
};
const env = await versions();
const startedAt = new Date().toISOString();
const loadBefore = loadavg();
console.log(`pgasynq bench${quick ? ' (quick: sizes ÷ 10)' : ''}: ${total} measurements, ${reps} repetition(s); log ${logFile}`);
console.log(
  `node ${env.node}, PostgreSQL ${env.postgresql}, Redis ${env.redis}; graphile-worker ${env['graphile-worker']}, pg-boss ${env['pg-boss']}, bullmq ${env.bullmq}`,
);
console.log(`pgasynq: ${env['pgasynq.source']}`);
console.log(`database: ${database.throwaway ? 'throwaway cluster' : database.url}; ${settingsLine()}`);
if (serverSettings.autovacuum !== 'on') console.log('WARNING: autovacuum is off on this server: not production settings (BENCH.md)');
console.log(`${cpus().length} cores, load average ${loadBefore.map((l) => l.toFixed(2)).join(' ')}\n`);

const measurements: Measurement[] = [];
const t0 = now();
let done = 0;
const save = (finished: boolean) => {
  const rows = tabulate(cases, measurements);
  writeFileSync(
    `${base}.json`,
    JSON.stringify(
      {
        startedAt,
        finishedAt: finished ? new Date().toISOString() : null,
        command: `npm run bench -- ${process.argv.slice(2).join(' ')}`.trim(),
        quick,
        reps,
        machine: {
          cores: cpus().length,
          model: cpus()[0]?.model,
          memoryGiB: Math.round(totalmem() / 2 ** 30),
          loadBefore,
          loadAfter: finished ? loadavg() : null,
        },
        versions: env,
        database,
        cases: cases.map(({ workload, key, params, systems }) => ({ workload, key, params, systems })),
        measurements,
        table: rows,
      },
      null,
      2,
    ),
  );
  return rows;
};

async function measureCase(c: Case, rep: number): Promise<void> {
  for (const system of c.systems) {
    const began = now();
    const load1 = loadavg()[0]!;
    const { result, error } = await runOne(c, system);
    const seconds = (now() - began) / 1000;
    measurements.push({
      workload: c.workload,
      case: c.key,
      system,
      rep,
      params: c.params,
      startedAt: new Date().toISOString(),
      seconds,
      loadavg1: load1,
      ...(result ? { result } : {}),
      ...(error ? { error } : {}),
    });
    done++;
    const shown = result ? c.rows.map((r) => `${r.metric}=${formatValue(result[r.metric] as number, r.unit)}`).join(' ') : `ERROR ${error}`;
    const elapsed = (now() - t0) / 1000;
    console.log(
      `[${done}/${total} ${Math.floor(elapsed / 60)}:${String(Math.floor(elapsed % 60)).padStart(2, '0')}] ${c.key} rep ${rep} ${system}: ${shown} (${seconds.toFixed(1)} s, load ${load1.toFixed(1)})`,
    );
    save(false);
  }
}

for (let rep = 1; rep <= reps; rep++) {
  for (const c of cases) if (c.reps === undefined) await measureCase(c, rep);
}
// The long cases, after the others: each as many times as it asks, its systems alternating.
for (const c of cases) {
  if (c.reps === undefined) continue;
  for (let rep = 1; rep <= c.reps; rep++) await measureCase(c, rep);
}

const rows = save(true);
const shownSystems = SYSTEMS.filter((s) => cases.some((c) => c.systems.includes(s)));
const loadAfter = loadavg();
const legend = [
  `Medians of ${reps} repetition(s) (W7: one run; W8: ${w8Reps}; WAL: ${walReps}). In brackets: pgasynq ÷ that system, the median of the ratios paired run by run;`,
  '↑ higher is better (a ratio above 1 favours pgasynq), ↓ lower is better (a ratio below 1 favours pgasynq).',
  '† a drain still running after 10 s stopped there: the figure is its rate over those 10 s.',
];
const windowTable = w8Windows(cases, measurements);
console.log(`\n${legend.join('\n')}\n`);
console.log(markdown(rows, shownSystems));
if (windowTable) console.log(`\n${windowTable}`);
const failed = measurements.filter((m) => m.error);
console.log(
  `\n${measurements.length - failed.length}/${measurements.length} measurements succeeded in ${((now() - t0) / 60000).toFixed(1)} min; load average before ${loadBefore.map((l) => l.toFixed(2)).join(' ')}, after ${loadAfter.map((l) => l.toFixed(2)).join(' ')}.`,
);
for (const m of failed) console.log(`  failed: ${m.case} rep ${m.rep} ${m.system}: ${m.error}`);
console.log(`Raw figures: ${base}.json`);
writeFileSync(
  `${base}.md`,
  [
    `# pgasynq bench, ${startedAt}${quick ? ' (quick)' : ''}`,
    '',
    `- Command: \`${`npm run bench -- ${process.argv.slice(2).join(' ')}`.trim()}\``,
    `- pgasynq: ${env['pgasynq.source']}`,
    `- Node ${env.node}; graphile-worker ${env['graphile-worker']}, pg-boss ${env['pg-boss']}, BullMQ ${env.bullmq}, ioredis ${env.ioredis}, pg ${env.pg}; Redis ${env.redis} (AOF ${env['redis.aof_enabled']})`,
    `- PostgreSQL ${env.postgresql}, ${database.throwaway ? 'a throwaway cluster started by the runner' : `given: ${database.url}`}: ${settingsLine()}`,
    `- ${cpus().length} cores, load average before ${loadBefore.map((l) => l.toFixed(2)).join(' ')}, after ${loadAfter.map((l) => l.toFixed(2)).join(' ')}; ${((now() - t0) / 60000).toFixed(1)} min, ${measurements.length - failed.length}/${measurements.length} measurements succeeded`,
    '',
    legend.join('\n'),
    '',
    markdown(rows, shownSystems),
    ...(windowTable ? ['', windowTable] : []),
    '',
  ].join('\n'),
);
if (source) rmSync(join(BENCH, '.snapshot'), { recursive: true, force: true });
cleanUp();
