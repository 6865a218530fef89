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
 *
 * This file is the run's sequence of steps; the cases and which systems each
 * runs are in lib/plan.ts, the tables in lib/report.ts, and the peers' install,
 * the copy of src/ and the versions recorded in lib/source.ts.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { appendFileSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, totalmem } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ALIASES, SYSTEMS, type SystemName } from './adapters/index.js';
import { PRODUCTION_SETTINGS, readSettings, startBenchCluster, type BenchCluster } from './lib/cluster.js';
import { REDIS_URL, now, parseArgs } from './lib/common.js';
import { W8_HOLDS, WORKLOADS, buildPlan, type Case } from './lib/plan.js';
import { formatValue, markdown, tabulate, w8Windows, type Measurement } from './lib/report.js';
import { ensureDependencies, snapshotSource, versions } from './lib/source.js';

const BENCH = dirname(fileURLToPath(import.meta.url));
const ROOT = dirname(BENCH);

const USAGE = `usage: npm run bench -- [--workloads W1,W2,…] [--systems ${SYSTEMS.join(',')}] [--reps N] [--quick] [--no-install]
  --workloads     which workloads (default: all of ${WORKLOADS.join(',')})
  --systems       which systems (default: each workload's default set; see bench/README.md)
  --reps          repetitions of every measurement (default 3, --quick 1; W7 runs once, W8 and WAL see below)
  --w8-reps       repetitions of W8 (default 1: 4 min per hold and system; systems alternate)
  --w8-holds      which of W8's holds: snapshot, xid, readers (default all three; see workloads/w8-snapshot.ts)
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
const w8Holds = list(
  args['w8-holds'],
  W8_HOLDS.map(([h]) => h),
  (h) => h.toLowerCase(),
);
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

if (args.install !== 'false' && args['no-install'] !== 'true') ensureDependencies(BENCH, ROOT);

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

// ------------------------------------------------------------ measurements

const stamp = new Date().toISOString().replace(/[:.]/g, '-').replace('Z', '');
const RESULTS = join(BENCH, 'results');
mkdirSync(RESULTS, { recursive: true });
const base = join(RESULTS, `${stamp}${quick ? '-quick' : ''}`);
const logFile = `${base}.log`;
const live = args.live === 'true';
const source = live ? undefined : snapshotSource(stamp, BENCH, ROOT, (dir) => (snapshotDir = dir));
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

function settingsLine(): string {
  const s = serverSettings;
  if (s.error) return `settings unreadable (${s.error})`;
  return ['autovacuum', 'fsync', 'synchronous_commit', 'shared_buffers', 'max_wal_size', 'checkpoint_timeout', 'max_connections']
    .map((k) => `${k}=${s[k]}`)
    .join(', ');
}

// -------------------------------------------------------------------- main

const cases = buildPlan({ quick, workloads, chosenSystems, w8Reps, walReps, w8Holds });
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
const env = await versions(BENCH, ROOT, source, serverSettings);
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
  const rows = tabulate(cases, measurements, reps);
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
