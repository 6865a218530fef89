/**
 * Helpers shared by the load test L1 (l1.ts) and the soak test S1 (s1.ts):
 * a run's life (LoadRun: its harness, timers and teardown, on a signal too),
 * spawning this directory's child scripts into a harness (so that
 * `h.teardown()` kills them), CPU and RSS from /proc, table statistics and
 * sizes, percentiles, and a little formatting.
 *
 * The harness (../harness.ts) spawns only ../children/{worker,producer}.ts;
 * these tests need other children (a no-op load worker, a batch producer, a
 * mixed worker, ../children/cron-scheduler.ts), so they build the harness's
 * `Child` themselves and push it onto `h.children`.
 */
import { spawn } from 'node:child_process';
import { closeSync, mkdirSync, openSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Child, recordFigures, RESULTS_DIR, type Figures, type Harness } from '../harness.js';

export const LOAD_DIR = fileURLToPath(new URL('.', import.meta.url));
const REPO = fileURLToPath(new URL('../../..', import.meta.url));
const CLK_TCK = 100; // USER_HZ on Linux

/**
 * A load run's life: its harness once made, the timers it runs, what else it
 * must close, all torn down at the end or on SIGINT / SIGTERM (exit 130).
 */
export class LoadRun {
  h: Harness | undefined;
  /** Set once the run is being torn down: loops stop starting work. */
  stopping = false;
  readonly #timers: NodeJS.Timeout[] = [];
  readonly #cleanups: (() => unknown)[] = [];

  constructor() {
    for (const sig of ['SIGINT', 'SIGTERM'] as const) {
      process.on(sig, () => {
        log(`${sig}: tearing down`);
        void this.cleanup().then(() => process.exit(130));
      });
    }
  }

  /** `fn` every `ms` until the run ends (or the timer is cleared). */
  every(ms: number, fn: () => void): NodeJS.Timeout {
    const t = setInterval(fn, ms);
    this.#timers.push(t);
    return t;
  }

  /** Stops every timer of the run. */
  clearTimers(): void {
    for (const t of this.#timers) clearInterval(t);
  }

  /** Runs `fn` at teardown, before the harness goes. */
  onCleanup(fn: () => unknown): void {
    this.#cleanups.push(fn);
  }

  async cleanup(): Promise<void> {
    this.stopping = true;
    this.clearTimers();
    for (const fn of this.#cleanups.splice(0)) await Promise.resolve(fn()).catch(() => {});
    if (this.h) await this.h.teardown().catch((err) => log(`teardown: ${err}`));
    this.h = undefined;
  }

  /**
   * Runs `main`, which resolves with whether the run passed; a throw is logged and recorded as
   * `failed` (with its message as notes). Tears down, then exits 0 on a pass and 1 otherwise.
   */
  async main(failed: Partial<Figures> & { test: string }, main: () => Promise<boolean>): Promise<never> {
    let pass = false;
    try {
      pass = await main();
    } catch (err) {
      log(`FAILED: ${(err as Error)?.stack ?? err}`);
      recordFigures({ ...failed, notes: `FAILED: ${String((err as Error)?.message ?? err)}` });
    } finally {
      await this.cleanup();
    }
    process.exit(pass ? 0 : 1);
  }
}

/** The sum of a counter over every worker's last metrics line (dead workers' included). */
export const metricTotal = (h: Harness, key: string): number =>
  h.children.filter((c) => c.role === 'worker').reduce((s, c) => s + Number((c.metrics as Record<string, unknown> | undefined)?.[key] ?? 0), 0);

export interface LoadSpec {
  name: string;
  role: 'worker' | 'producer';
  /** A path relative to this directory. */
  script: string;
  env: Record<string, string>;
}

/** Spawns `spec.script` as a child of the harness (killed by teardown) and waits for its ready line. */
export async function spawnLoadChild(h: Harness, spec: LoadSpec, readyTimeoutMs = 60_000): Promise<Child> {
  const errFd = openSync(join(h.logDir, `${spec.name}.stderr.log`), 'a');
  const proc = spawn(process.execPath, ['--import', 'tsx', join(LOAD_DIR, spec.script)], {
    cwd: REPO,
    env: { ...process.env, NODE_TEST_CONTEXT: undefined, DATABASE_URL: h.connectionString, SCHEMA: h.schema, ...spec.env },
    stdio: ['ignore', 'pipe', errFd],
  });
  closeSync(errFd);
  const child = new Child(spec.name, spec.role, proc, { name: spec.name, role: spec.role, env: { ...spec.env, SCRIPT: spec.script } });
  h.children.push(child);
  await child.waitEvent((e) => e.event === 'ready', readyTimeoutMs, 'ready');
  return child;
}

/** The same spec again (a new pid). */
export function respawnLoadChild(h: Harness, child: Child): Promise<Child> {
  const { SCRIPT, ...env } = child.spec.env;
  return spawnLoadChild(h, { name: child.spec.name, role: child.spec.role, script: SCRIPT!, env });
}

/** utime+stime (and the reaped children's cutime+cstime) in seconds, and RSS in bytes; null once the process is gone. */
export function procStat(pid: number): { cpu: number; childCpu: number; rss: number } | null {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
    const n = (i: number) => Number(f[i]);
    // f[0] is field 3 (state): utime = 14, stime = 15, cutime = 16, cstime = 17, rss = 24.
    return { cpu: (n(11) + n(12)) / CLK_TCK, childCpu: (n(13) + n(14)) / CLK_TCK, rss: n(21) * 4096 };
  } catch {
    return null;
  }
}

/** Open file descriptors of a process (null once it is gone). */
export function openFds(pid: number): number | null {
  try {
    return readdirSync(`/proc/${pid}/fd`).length;
  } catch {
    return null;
  }
}

/** Children of a process, from /proc (no pgrep per sample). */
export function childPids(pid: number): number[] {
  try {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').split(' ').filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/** The cluster's postmaster pid (first line of postmaster.pid). */
export function postmasterPid(h: Harness): number {
  return Number(readFileSync(join(h.cluster.dir, 'data', 'postmaster.pid'), 'utf8').split('\n')[0]);
}

/**
 * CPU seconds used by the whole cluster so far: the postmaster's own, the
 * children it has reaped (cutime, cstime) and the live children.
 */
export function postgresCpu(h: Harness): number {
  const pm = postmasterPid(h);
  const own = procStat(pm);
  if (!own) return 0;
  return own.cpu + own.childCpu + childPids(pm).reduce((s, p) => s + (procStat(p)?.cpu ?? 0), 0);
}

/** The machine's busy and total CPU seconds (all cores), from /proc/stat. */
export function machineCpu(): { busy: number; total: number } {
  const line = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
  const total = line.slice(0, 8).reduce((a, b) => a + b, 0) / CLK_TCK;
  const idle = ((line[3] ?? 0) + (line[4] ?? 0)) / CLK_TCK;
  return { busy: total - idle, total };
}

/**
 * CPU per node child, tracked by pid: the last value seen is kept after the
 * process dies (a SIGKILL'd worker's final second is lost, nothing more).
 */
export class NodeCpu {
  readonly #last = new Map<number, number>();
  sample(pids: number[]): void {
    for (const pid of pids) {
      const s = procStat(pid);
      if (s) this.#last.set(pid, s.cpu);
    }
  }
  total(): number {
    let t = 0;
    for (const v of this.#last.values()) t += v;
    return t;
  }
}

export interface TableStats {
  n_tup_ins: number;
  n_tup_upd: number;
  n_tup_hot_upd: number;
  n_tup_del: number;
  n_live_tup: number;
  n_dead_tup: number;
  autovacuum_count: number;
  autoanalyze_count: number;
}

/** Of task_states by default: since schema v2 the row every state change rewrites (task_inputs is written once). */
export async function tableStats(h: Harness, table = 'task_states'): Promise<TableStats> {
  return h.one<TableStats>(
    `SELECT n_tup_ins::float8 AS n_tup_ins, n_tup_upd::float8 AS n_tup_upd, n_tup_hot_upd::float8 AS n_tup_hot_upd, n_tup_del::float8 AS n_tup_del,
            n_live_tup::float8 AS n_live_tup, n_dead_tup::float8 AS n_dead_tup,
            autovacuum_count::float8 AS autovacuum_count, autoanalyze_count::float8 AS autoanalyze_count
     FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`,
    [h.schema, table],
  );
}

export interface Sizes {
  table_mb: number;
  indexes_mb: number;
  toast_mb: number;
  per_index_mb: Record<string, number>;
}

const mb = (b: number) => Math.round((b / 2 ** 20) * 10) / 10;

/** Of task_states by default (see tableStats); pass 'task_inputs' for the payloads. */
export async function sizes(h: Harness, table = 'task_states'): Promise<Sizes> {
  const rel = `"${h.schema}".${table}`;
  const t = await h.one<{ t: string; i: string; total: string }>(
    'SELECT pg_relation_size($1::regclass)::text AS t, pg_indexes_size($1::regclass)::text AS i, pg_total_relation_size($1::regclass)::text AS total',
    [rel],
  );
  const idx = await h.query<{ name: string; size: string }>(
    'SELECT indexrelname AS name, pg_relation_size(indexrelid)::text AS size FROM pg_stat_user_indexes WHERE schemaname = $1 AND relname = $2 ORDER BY 1',
    [h.schema, table],
  );
  const total = Number(t.total);
  return {
    table_mb: mb(Number(t.t)),
    indexes_mb: mb(Number(t.i)),
    toast_mb: mb(total - Number(t.t) - Number(t.i)),
    per_index_mb: Object.fromEntries(idx.map((r) => [r.name, mb(Number(r.size))])),
  };
}

export function percentile(sorted: number[], p: number): number | null {
  if (sorted.length === 0) return null;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1));
  return sorted[i]!;
}

/** Least-squares slope of y over x. */
export function slope(points: [number, number][]): number | null {
  if (points.length < 3) return null;
  const n = points.length;
  const mx = points.reduce((s, [x]) => s + x, 0) / n;
  const my = points.reduce((s, [, y]) => s + y, 0) / n;
  let num = 0;
  let den = 0;
  for (const [x, y] of points) {
    num += (x - mx) * (y - my);
    den += (x - mx) ** 2;
  }
  return den === 0 ? null : num / den;
}

export const round = (v: number | null | undefined, d = 1): number | null =>
  v === null || v === undefined || !Number.isFinite(v) ? null : Math.round(v * 10 ** d) / 10 ** d;

/** ISO time without the date, for logs. */
export const clock = (d = new Date()): string => d.toISOString().slice(11, 23);

export function log(msg: string): void {
  process.stdout.write(`[${clock()}] ${msg}\n`);
}

/** Writes a results file beside reliability-results.jsonl (that one is cleared by every fault-suite run). */
export function writeResult(file: string, content: string): string {
  mkdirSync(RESULTS_DIR, { recursive: true });
  const path = join(RESULTS_DIR, file);
  writeFileSync(path, content);
  return path;
}

/**
 * Loads the acknowledgement log into a table `{{schema}}.h_acked(id text, kind text)`
 * in chunks, so the lost-task check is a join rather than a 1M-element parameter.
 * Lines are `id` or `id kind`.
 */
export async function loadAcked(h: Harness, lines: string[]): Promise<number> {
  await h.query('CREATE UNLOGGED TABLE IF NOT EXISTS {{schema}}.h_acked (id text NOT NULL, kind text)');
  await h.query('TRUNCATE {{schema}}.h_acked');
  const CHUNK = 50_000;
  for (let i = 0; i < lines.length; i += CHUNK) {
    const part = lines.slice(i, i + CHUNK).map((l) => l.split(' '));
    await h.query('INSERT INTO {{schema}}.h_acked (id, kind) SELECT * FROM unnest($1::text[], $2::text[])', [
      part.map((p) => p[0]),
      part.map((p) => p[1] ?? null),
    ]);
  }
  await h.query('CREATE INDEX IF NOT EXISTS h_acked_id ON {{schema}}.h_acked (id)');
  await h.query('ANALYZE {{schema}}.h_acked');
  return lines.length;
}

/** Markdown-ish table of rows for the console summary. */
export function table(rows: [string, unknown][]): string {
  const w = Math.max(...rows.map(([k]) => k.length));
  return rows.map(([k, v]) => `  ${k.padEnd(w)}  ${typeof v === 'object' && v !== null ? JSON.stringify(v) : String(v)}`).join('\n');
}
