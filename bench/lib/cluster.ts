/**
 * The benchmark's own PostgreSQL: a throwaway cluster with production
 * settings, started the way the fault suite starts its clusters (its
 * test/faults/cluster.ts, imported, not copied: initdb and pg_ctl run as the
 * `postgres` user through runuser when we are root; its own data directory
 * under the temp directory, port and socket directory), and removed at the
 * end. The machine's shared server runs with autovacuum off, which makes it
 * unfit for benchmarks (BENCH.md).
 */
import pg from 'pg';
import { startCluster, type Cluster } from '../../test/faults/cluster.js';

/**
 * Production settings (BENCH.md): durable commits, autovacuum at PostgreSQL's
 * defaults (so each library's own per-table autovacuum settings are
 * exercised), room for the working set and for WAL between checkpoints.
 * idle_in_transaction_session_timeout: the fault suite's clusters set 10 s;
 * W8 holds a transaction open for minutes, and a production server has none
 * by default.
 */
export const PRODUCTION_SETTINGS: Record<string, string | number> = {
  autovacuum: 'on',
  fsync: 'on',
  synchronous_commit: 'on',
  full_page_writes: 'on',
  shared_buffers: "'1GB'",
  max_wal_size: "'4GB'",
  checkpoint_timeout: "'15min'",
  max_connections: 200,
  track_wal_io_timing: 'off',
  idle_in_transaction_session_timeout: 0,
};

/** What the results record of the server a run measured (read back with SHOW, not assumed). */
export const RECORDED_SETTINGS = [
  'server_version',
  'autovacuum',
  'autovacuum_naptime',
  'autovacuum_vacuum_scale_factor',
  'autovacuum_vacuum_threshold',
  'autovacuum_vacuum_insert_scale_factor',
  'autovacuum_vacuum_cost_limit',
  'autovacuum_max_workers',
  'fsync',
  'synchronous_commit',
  'full_page_writes',
  'wal_level',
  'shared_buffers',
  'max_wal_size',
  'checkpoint_timeout',
  'max_connections',
  'track_wal_io_timing',
  'idle_in_transaction_session_timeout',
  'work_mem',
  'effective_io_concurrency',
];

export const BENCH_DATABASE = 'bench';

export interface BenchCluster {
  /** postgres://postgres@127.0.0.1:PORT/bench */
  url: string;
  dir: string;
  logFile: string;
  /** Stops the server and deletes its directory; safe to call twice, synchronous (usable in an exit handler). */
  destroy(): void;
}

export async function startBenchCluster(): Promise<BenchCluster> {
  const cluster: Cluster = await startCluster({ settings: PRODUCTION_SETTINGS });
  try {
    const admin = new pg.Client({ connectionString: cluster.connectionString, application_name: 'bench:setup' });
    await admin.connect();
    try {
      await admin.query(`CREATE DATABASE ${BENCH_DATABASE}`);
    } finally {
      await admin.end();
    }
  } catch (e) {
    cluster.destroy();
    throw e;
  }
  return {
    url: cluster.connectionString.replace(/\/postgres$/, `/${BENCH_DATABASE}`),
    dir: cluster.dir,
    logFile: cluster.logFile,
    destroy: () => cluster.destroy(),
  };
}

/** SHOW of every recorded setting, on whatever server `url` points at. */
export async function readSettings(url: string): Promise<Record<string, string>> {
  const client = new pg.Client({ connectionString: url, application_name: 'bench:admin' });
  await client.connect();
  try {
    const { rows } = await client.query<{ name: string; setting: string }>(`SELECT name, current_setting(name) AS setting FROM unnest($1::text[]) AS name`, [
      RECORDED_SETTINGS,
    ]);
    return Object.fromEntries(rows.map((r) => [r.name, r.setting]));
  } finally {
    await client.end();
  }
}
