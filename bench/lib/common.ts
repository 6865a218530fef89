/**
 * What every adapter and workload shares: where the databases are, clocks,
 * statistics, and small helpers for child processes.
 */
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import pg from 'pg';

export const DEFAULT_DATABASE_URL = 'postgres://postgres@127.0.0.1:5432/test';
/**
 * The database of a measurement process: run.ts passes its throwaway
 * cluster's URL (or the one given with --database-url) in DATABASE_URL.
 */
export const DATABASE_URL = process.env.DATABASE_URL ?? DEFAULT_DATABASE_URL;
export const REDIS_URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';

/** Monotonic ms, comparable within one process. */
export const now = (): number => performance.now();
/** Wall-clock ms with sub-ms resolution, comparable across processes on this machine. */
export const wallNow = (): number => performance.timeOrigin + performance.now();

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export function median(xs: readonly number[]): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** Nearest-rank percentile (p in 0..100). */
export function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  const rank = Math.min(s.length, Math.max(1, Math.ceil((p / 100) * s.length)));
  return s[rank - 1]!;
}

export const mean = (xs: readonly number[]): number => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : Number.NaN);

/**
 * A small pool for administrative statements (drop schema, counts, sizes).
 * Reads DATABASE_URL when called, not when this module loaded: run.ts sets
 * it once its throwaway cluster is up.
 */
export function adminPool(max = 2): pg.Pool {
  const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL ?? DEFAULT_DATABASE_URL, max, application_name: 'bench:admin' });
  pool.on('error', () => {});
  return pool;
}

export async function dropSchema(pool: pg.Pool, schema: string): Promise<void> {
  // Quiet the NOTICEs that DROP … CASCADE prints for every dependent object.
  await pool.query(`SET client_min_messages = warning; DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
}

/**
 * What a system keeps in its schema, summed over every table in it (heap,
 * indexes, toast), so that a design that splits a task over several tables is
 * counted whole. Partitions live in the parent's schema for every system
 * here; a partitioned parent itself has no storage.
 */
export interface SchemaStats {
  tables: number;
  /** Main fork of every table. */
  heapBytes: number;
  indexBytes: number;
  /** TOAST tables (with their indexes), free-space and visibility maps. */
  toastBytes: number;
  totalBytes: number;
  liveTuples: number;
  deadTuples: number;
  autovacuums: number;
  autoanalyzes: number;
}

export async function schemaStats(pool: pg.Pool, schema: string): Promise<SchemaStats> {
  const { rows } = await pool.query(
    `SELECT count(*)::float8 AS tables,
            coalesce(sum(pg_relation_size(c.oid)), 0)::float8 AS heap,
            coalesce(sum(pg_indexes_size(c.oid)), 0)::float8 AS indexes,
            coalesce(sum(pg_total_relation_size(c.oid) - pg_indexes_size(c.oid) - pg_relation_size(c.oid)), 0)::float8 AS toast,
            coalesce(sum(pg_total_relation_size(c.oid)), 0)::float8 AS total,
            coalesce(sum(s.n_live_tup), 0)::float8 AS live,
            coalesce(sum(s.n_dead_tup), 0)::float8 AS dead,
            coalesce(sum(s.autovacuum_count), 0)::float8 AS autovacuums,
            coalesce(sum(s.autoanalyze_count), 0)::float8 AS autoanalyzes
     FROM pg_class c
     JOIN pg_namespace n ON n.oid = c.relnamespace
     LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
     WHERE n.nspname = $1 AND c.relkind IN ('r', 'm')`,
    [schema],
  );
  const r = rows[0] as Record<string, number>;
  return {
    tables: r.tables!,
    heapBytes: r.heap!,
    indexBytes: r.indexes!,
    toastBytes: r.toast!,
    totalBytes: r.total!,
    liveTuples: r.live!,
    deadTuples: r.dead!,
    autovacuums: r.autovacuums!,
    autoanalyzes: r.autoanalyzes!,
  };
}

/**
 * Waits until autovacuum has visited, since `since` (database time), every table of the schema
 * left with at least `minDead` dead tuples, or `capMs` passed. Returns the seconds waited and the
 * tables still unvisited (sizes read after this are "after autovacuum has run once").
 */
export async function untilAutovacuumed(
  pool: pg.Pool,
  schema: string,
  since: Date,
  opts: { minDead: number; capMs: number },
): Promise<{ waitedS: number; unvisited: number }> {
  const t0 = now();
  for (;;) {
    const { rows } = await pool.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_stat_user_tables
       WHERE schemaname = $1 AND n_dead_tup >= $2 AND coalesce(last_autovacuum, '-infinity') < $3`,
      [schema, opts.minDead, since],
    );
    const unvisited = rows[0]!.n;
    if (unvisited === 0 || now() - t0 >= opts.capMs) return { waitedS: (now() - t0) / 1000, unvisited };
    await sleep(2000);
  }
}

/** Plain VACUUM of every table in a schema (what autovacuum would give back). */
export async function vacuumSchema(pool: pg.Pool, schema: string): Promise<void> {
  const { rows } = await pool.query<{ t: string }>(
    `SELECT format('%I.%I', n.nspname, c.relname) AS t FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = $1 AND c.relkind = 'r'`,
    [schema],
  );
  for (const { t } of rows) await pool.query(`VACUUM ${t}`);
}

export async function count(pool: pg.Pool, sql: string, params: unknown[] = []): Promise<number> {
  const { rows } = await pool.query<{ n: string }>(sql, params);
  return Number(rows[0]?.n ?? 0);
}

/** Waits until `cond()` is true, polling every `everyMs`; throws after `timeoutMs`. */
export async function waitFor(cond: () => boolean | Promise<boolean>, timeoutMs: number, everyMs = 5, what = 'condition'): Promise<void> {
  const deadline = now() + timeoutMs;
  while (!(await cond())) {
    if (now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(everyMs);
  }
}

/** A process of this machine as /proc/PID/stat tells it (Linux): its command name and the CPU time (user + system) it has used, in ms. */
export function processCpu(pid: number | string): { name: string; cpuMs: number } {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const ticks = Number(fields[11]) + Number(fields[12]); // utime, stime
  return { name: stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')')), cpuMs: ticks * 10 }; // USER_HZ is 100 on Linux
}

/** Parses `--key value` and `--flag` arguments. */
export function parseArgs(argv: readonly string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (!a.startsWith('--')) continue;
    const eq = a.indexOf('=');
    if (eq > 0) out[a.slice(2, eq)] = a.slice(eq + 1);
    else if (i + 1 < argv.length && !argv[i + 1]!.startsWith('--')) out[a.slice(2)] = argv[++i]!;
    else out[a.slice(2)] = 'true';
  }
  return out;
}

/** Logs to stderr (stdout carries the result line of a measurement). */
export function log(...parts: unknown[]): void {
  process.stderr.write(`${parts.map((p) => (typeof p === 'string' ? p : JSON.stringify(p))).join(' ')}\n`);
}
