/**
 * The benchmark suite: pgasynq side by side with its peers (BENCH.md).
 *
 *   npm run bench                                   # everything, 3 repetitions
 *   npm run bench -- --quick                        # sizes ÷ 10, for development
 *   npm run bench -- --workloads W2,W3 --systems pgasynq,graphile --reps 5
 *
 * Installs bench/'s own dependencies (the peers) first when they are missing
 * or stale. Every measurement runs in a process of its own (bench/measure.ts);
 * systems alternate (A B C … A B C …) within each workload case, and each
 * repetition goes through every case before the next one starts, so a noisy
 * minute hits all systems alike. Prints a table of medians with the ratio
 * pgasynq ÷ peer (median of the ratios paired run by run), and writes every
 * raw figure to bench/results/<timestamp>.json.
 */
import { execFileSync, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { appendFileSync, cpSync, existsSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ALIASES, EXTRA, SYSTEMS, type SystemName } from './adapters/index.js';
import { DATABASE_URL, REDIS_URL, adminPool, median, now, parseArgs } from './lib/common.js';

const BENCH = dirname(fileURLToPath(import.meta.url));
const ROOT = dirname(BENCH);
const WORKLOADS = ['W1', 'W2', 'W3', 'W4', 'W5', 'W6', 'W7'] as const;
type Workload = (typeof WORKLOADS)[number];

const USAGE = `usage: npm run bench -- [--workloads W1,W2,…] [--systems ${SYSTEMS.join(',')}] [--reps N] [--quick] [--no-install]
  --workloads  which workloads (default: all of ${WORKLOADS.join(',')})
  --systems    which systems (default: each workload's default set; see bench/README.md)
  --reps       repetitions of every measurement (default 3; W7 always runs once)
  --quick      every size ÷ 10 (and shorter W4 spreads), for development
  --no-install do not check bench/node_modules
  --live       measure src/ as it is at each measurement, instead of a copy taken at the start`;

// ---------------------------------------------------------------- arguments

const args = parseArgs(process.argv.slice(2));
if (args.help || args.h) {
  console.log(USAGE);
  process.exit(0);
}
const quick = args.quick === 'true';
const reps = Number(args.reps ?? 3);
if (!Number.isInteger(reps) || reps < 1) fail(`--reps must be a positive integer`);
const workloads = list(args.workloads, WORKLOADS, (w) => w.toUpperCase());
const chosenSystems = args.systems ? list(args.systems, SYSTEMS, (s) => ALIASES[s.toLowerCase()] ?? s.toLowerCase()) : undefined;

function list<T extends string>(value: string | undefined, all: readonly T[], norm: (s: string) => string): T[] {
  if (!value || value === 'true') return [...all];
  const out = value.split(',').map((s) => norm(s.trim())).filter(Boolean);
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
  return { index: join(root, 'src', 'index.ts'), commit: git('rev-parse', '--short', 'HEAD'), dirty: dirty ? dirty.split('\n').length + ' uncommitted file(s) in src/ or migrations/' : 'clean' };
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
  /** W7: once, after the repetitions. */
  once?: boolean;
}

const q = (full: number) => (quick ? Math.max(1, Math.round(full / 10)) : full);
const fmt = (n: number) => n.toLocaleString('en-US');
const ANY = [...SYSTEMS];
const ALL = SYSTEMS.filter((s) => !EXTRA.includes(s));
const PG_SYSTEMS = ANY.filter((s) => s !== 'bullmq');
const FLOORS: SystemName[] = ['floor', 'floor-prefetch'];

/** Which systems a workload runs by default, and which it can run at all. */
const SUPPORT: Record<Workload, { defaults: SystemName[]; supports: SystemName[] }> = {
  W1: { defaults: ALL, supports: ANY },
  W2: { defaults: ALL, supports: ANY },
  W3: { defaults: ALL, supports: ANY },
  W4: { defaults: ALL.filter((s) => !FLOORS.includes(s)), supports: ANY.filter((s) => !FLOORS.includes(s)) },
  W5: { defaults: ['pgasynq', 'floor'], supports: ['pgasynq', ...FLOORS] },
  W6: { defaults: ['pgasynq', 'floor'], supports: ANY },
  W7: { defaults: ['pgasynq', 'floor'], supports: PG_SYSTEMS },
};

function systemsFor(w: Workload): SystemName[] {
  const { defaults, supports } = SUPPORT[w];
  return chosenSystems ? SYSTEMS.filter((s) => chosenSystems.includes(s) && supports.includes(s)) : defaults;
}

function buildPlan(): Case[] {
  const cases: Case[] = [];
  const add = (w: Workload, c: Omit<Case, 'workload' | 'systems'>) => {
    if (workloads.includes(w) && systemsFor(w).length > 0) cases.push({ workload: w, systems: systemsFor(w), ...c });
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
  for (const concurrency of [10, 100]) {
    const n = q(50_000);
    add('W2', {
      key: `W2 c${concurrency}`,
      params: { n, concurrency, capMs },
      timeoutMs: capMs + 180_000,
      rows: [{ label: `W2 drain ${fmt(n)}, concurrency ${concurrency}, tasks/s`, metric: 'perSec', better: 'higher', unit: 'rate' }],
    });
  }
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
    rows: (['p50', 'p99'] as const).map((m) => ({ label: `W4 scheduled task start after due (${q(100)} tasks), ${m} ms`, metric: m, better: 'lower', unit: 'ms' })),
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
    once: true,
    rows: [
      { label: `W7 after ${fmt(total)} tasks: table+indexes+toast, MB`, metric: 'totalBytes', better: 'lower', unit: 'bytes' },
      { label: `W7 after ${fmt(total)} tasks: heap, MB`, metric: 'heapBytes', better: 'lower', unit: 'bytes' },
      { label: `W7 after ${fmt(total)} tasks: indexes, MB`, metric: 'indexBytes', better: 'lower', unit: 'bytes' },
      { label: `W7 after ${fmt(total)} tasks: n_dead_tup`, metric: 'deadTuples', better: 'lower', unit: 'count' },
      { label: `W7 after ${fmt(total)} tasks: n_live_tup`, metric: 'liveTuples', better: 'lower', unit: 'count' },
      { label: `W7 after ${fmt(total)} tasks, then VACUUM: table+indexes+toast, MB`, metric: 'totalBytesAfterVacuum', better: 'lower', unit: 'bytes' },
      { label: `W7 after ${fmt(total)} tasks, then VACUUM: indexes, MB`, metric: 'indexBytesAfterVacuum', better: 'lower', unit: 'bytes' },
      { label: `W7 throughput while pushing ${fmt(total)} (c100), tasks/s`, metric: 'perSec', better: 'higher', unit: 'rate' },
    ],
  });
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
      detached: true, // its own process group, so a timeout ends its W6 children too
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => {
      out += d;
      appendFileSync(logFile, d);
    });
    child.stderr.on('data', (d: Buffer) => {
      err += d;
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
      return v < 100 && !Number.isInteger(v) ? v.toFixed(1) : fmt(Math.round(v));
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
  const repsOf = (c: Case) => (c.once ? [1] : Array.from({ length: reps }, (_, i) => i + 1));
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
          .filter((p): p is readonly [number, number] => p[0] !== undefined && p[1] !== undefined && p[1] !== 0)
          .map(([a, b]) => a / b);
        if (paired.length) row.ratios[s] = median(paired);
      }
    }
    rows.push(row);
  };
  for (const c of cases) {
    for (const r of c.rows) {
      const capped = (s: SystemName, rep: number) => r.unit === 'rate' && value(ms, c, s, rep, 'capped') === 1;
      summarize(r.label, r.better, r.unit, c.systems, (s, rep) => value(ms, c, s, rep, r.metric), repsOf(c), capped);
    }
  }
  // W5: claim cost at the larger size ÷ at the smaller, paired by repetition.
  const w5 = cases.filter((c) => c.workload === 'W5');
  if (w5.length === 2) {
    const [small, large] = w5 as [Case, Case];
    for (const [metric, what] of [['claimMs', 'claim round trip'], ['explainMs', 'claim execution']] as const) {
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
  const pool = adminPool(1);
  try {
    v.postgresql = (await pool.query<{ server_version: string }>('SHOW server_version')).rows[0]!.server_version;
    for (const setting of ['shared_buffers', 'synchronous_commit', 'max_connections', 'autovacuum', 'fsync']) {
      v[`pg.${setting}`] = (await pool.query<Record<string, string>>(`SHOW ${setting}`)).rows[0]![setting]!;
    }
  } catch (e) {
    v.postgresql = `unreachable: ${(e as Error).message}`;
  } finally {
    await pool.end();
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
const total = cases.reduce((n, c) => n + c.systems.length * (c.once ? 1 : reps), 0);
const env = await versions();
const startedAt = new Date().toISOString();
const loadBefore = loadavg();
console.log(`pgasynq bench${quick ? ' (quick: sizes ÷ 10)' : ''}: ${total} measurements, ${reps} repetition(s); log ${logFile}`);
console.log(`node ${env.node}, PostgreSQL ${env.postgresql}, Redis ${env.redis}; graphile-worker ${env['graphile-worker']}, pg-boss ${env['pg-boss']}, bullmq ${env.bullmq}`);
console.log(`pgasynq: ${env['pgasynq.source']}`);
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
        machine: { cores: cpus().length, model: cpus()[0]?.model, memoryGiB: Math.round(totalmem() / 2 ** 30), loadBefore, loadAfter: finished ? loadavg() : null },
        versions: env,
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
    measurements.push({ workload: c.workload, case: c.key, system, rep, params: c.params, startedAt: new Date().toISOString(), seconds, loadavg1: load1, ...(result ? { result } : {}), ...(error ? { error } : {}) });
    done++;
    const shown = result
      ? c.rows
          .map((r) => `${r.metric}=${formatValue(result[r.metric] as number, r.unit)}`)
          .join(' ')
      : `ERROR ${error}`;
    const elapsed = (now() - t0) / 1000;
    console.log(`[${done}/${total} ${Math.floor(elapsed / 60)}:${String(Math.floor(elapsed % 60)).padStart(2, '0')}] ${c.key} rep ${rep} ${system}: ${shown} (${seconds.toFixed(1)} s, load ${load1.toFixed(1)})`);
    save(false);
  }
}

for (let rep = 1; rep <= reps; rep++) {
  for (const c of cases) if (!c.once) await measureCase(c, rep);
}
for (const c of cases) if (c.once) await measureCase(c, 1);

const rows = save(true);
const shownSystems = SYSTEMS.filter((s) => cases.some((c) => c.systems.includes(s)));
const loadAfter = loadavg();
console.log(`\nMedians of ${reps} repetition(s) (W7: one run). In brackets: pgasynq ÷ that system, the median of the ratios paired run by run;`);
console.log('↑ higher is better (a ratio above 1 favours pgasynq), ↓ lower is better (a ratio below 1 favours pgasynq).');
console.log('† a drain still running after 10 s stopped there: the figure is its rate over those 10 s.\n');
console.log(markdown(rows, shownSystems));
const failed = measurements.filter((m) => m.error);
console.log(`\n${measurements.length - failed.length}/${measurements.length} measurements succeeded in ${((now() - t0) / 60000).toFixed(1)} min; load average before ${loadBefore.map((l) => l.toFixed(2)).join(' ')}, after ${loadAfter.map((l) => l.toFixed(2)).join(' ')}.`);
for (const m of failed) console.log(`  failed: ${m.case} rep ${m.rep} ${m.system}: ${m.error}`);
console.log(`Raw figures: ${base}.json`);
writeFileSync(`${base}.md`, `${markdown(rows, shownSystems)}\n`);
if (source) rmSync(join(BENCH, '.snapshot'), { recursive: true, force: true });
