/**
 * The fault tests' kit: what every test of the suite did for itself, once.
 *
 *   faultTest     a node:test test on a harness of its own (cluster, migrated
 *                 schema, oracle tables), torn down after it, pass or fail
 *                 (the children killed, the Client, Inspector and whatever
 *                 h.defer() was given closed, the cluster destroyed);
 *   report        the end of most tests: the figures recorded, then I1–I7
 *                 asserted (no child may have died unasked);
 *   outageBound   I4's bound for a run whose database was down a while;
 *   ownedSchema   for the tests that run the library in-process (Servers,
 *                 Clients) rather than as children: a cluster and a migrated
 *                 schema for the file, a pool, SQL on the schema, the
 *                 deadlock counter, Servers started together, all closed after;
 *   logTrigger    the SQL of a trigger that logs a row change into a table of
 *                 the test's, in the transaction that makes it (audits, claim
 *                 logs, completion and release logs).
 *
 * The samplers are samplers.ts's, the faults crashes.ts's, the workflow and
 * limit setups setups.ts's.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { migrate, Server, type ServerConfig, type Task, type TaskContext } from '../../src/index.js';
import type { Checks, Query } from './checks.js';
import { startCluster, type Cluster, type ClusterOptions } from './cluster.js';
import { assertInvariants, createHarness, ORACLE_BOUND_S, recordFigures, type Figures, type Harness } from './harness.js';

export interface FaultTestOptions {
  /** The test schema, and the name of its logs' folder under results/logs/. */
  schema: string;
  timeout: number;
  /** The cluster's settings; a function when they depend on what the test sets up first (a network namespace's address). */
  cluster?: ClusterOptions | (() => ClusterOptions);
}

/** A test on a harness of its own, torn down once the test is over (also when it failed or timed out). */
export function faultTest(title: string, o: FaultTestOptions, body: (h: Harness) => Promise<void>): void {
  test(title, { timeout: o.timeout }, async (t) => {
    const h = await createHarness(o.schema, typeof o.cluster === 'function' ? o.cluster() : o.cluster);
    t.after(() => h.teardown());
    await body(h);
  });
}

/**
 * Records the figures of check `c` (h.figures() with `extra`), then asserts I1–I7 by the check's
 * options (its maxRetry, I4's bound) and that no child died unasked. Returns the figures.
 */
export function report(h: Harness, c: Checks, test: string, extra: Partial<Figures> = {}): Figures {
  const fig = h.figures(test, c, extra);
  recordFigures(fig);
  const { maxRetry, stuckBoundS, allowedExitCodes } = c.options;
  const unexpected = h.unexpectedExits(allowedExitCodes);
  assert.deepEqual(assertInvariants(c, { maxRetry, unexpected, ...(stuckBoundS === undefined ? {} : { stuckBoundS }) }), []);
  return fig;
}

/** SQLSTATE of an error or of any error on its cause chain. */
export function sqlState(err: unknown): string | undefined {
  for (let e = err, i = 0; typeof e === 'object' && e !== null && i < 10; e = (e as { cause?: unknown }).cause, i++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) return code;
  }
  return undefined;
}

/** I4's bound when the database was down `downMs` and took up to the longest of `startMs` to start again: leases expire meanwhile. */
export const outageBound = (downMs: number, startMs: number[]): number => ORACLE_BOUND_S + downMs / 1000 + Math.max(...startMs) / 1000 + 1;

export interface OwnedSchema {
  readonly schema: string;
  readonly cluster: Cluster;
  readonly pool: pg.Pool;
  /** SQL with `{{schema}}` replaced by the quoted schema. */
  q: Query;
  /** pg_stat_database.deadlocks of the database, now (the stats snapshot cleared first). */
  deadlocks(): Promise<number>;
  /** Servers on the schema, `n` of them, each with `config(i)`, started with `handler`; shut down after the file. */
  startServers(
    n: number,
    config: (i: number) => Omit<ServerConfig, 'schema'>,
    handler: (task: Task, ctx: TaskContext) => Promise<void> | void,
  ): Promise<Server[]>;
  /** Runs `fn` after the file's tests, before the pool and the cluster go (in the order given). */
  defer(fn: () => unknown): void;
}

/**
 * A cluster and a migrated schema for the whole test file (before), a pool of `poolMax` on it
 * (application_name `harness`), torn down after the file: what defer() was given, then the pool, then the cluster.
 */
export function ownedSchema(schema: string, { cluster: clusterOptions = {}, poolMax = 4 }: { cluster?: ClusterOptions; poolMax?: number } = {}): OwnedSchema {
  let cluster: Cluster | undefined;
  let pool: pg.Pool | undefined;
  const deferred: (() => unknown)[] = [];
  before(async () => {
    cluster = await startCluster(clusterOptions);
    await migrate({ connectionString: cluster.connectionString, schema });
    pool = new pg.Pool({ connectionString: cluster.connectionString, max: poolMax, application_name: 'harness' });
  });
  after(async () => {
    for (const fn of deferred) await Promise.resolve(fn()).catch(() => {});
    await pool?.end().catch(() => {});
    cluster?.destroy();
  });
  const q: Query = async (text, values) => (await pool!.query(text.replaceAll('{{schema}}', `"${schema}"`), values)).rows;
  return {
    schema,
    get cluster() {
      return cluster!;
    },
    get pool() {
      return pool!;
    },
    q,
    async deadlocks() {
      const [r] = await q<{ n: string }>('SELECT pg_stat_clear_snapshot(), deadlocks::text AS n FROM pg_stat_database WHERE datname = current_database()');
      return Number(r?.n ?? 0);
    },
    async startServers(n, config, handler) {
      const servers = Array.from({ length: n }, (_, i) => new Server({ connectionString: cluster!.connectionString, schema, ...config(i) }));
      deferred.push(() => Promise.allSettled(servers.map((s) => s.shutdown())));
      await Promise.all(servers.map((s) => s.start(handler)));
      return servers;
    },
    defer(fn) {
      deferred.push(fn);
    },
  };
}

export interface LogTrigger {
  /** The trigger's name, and its function's. */
  name: string;
  /** The log table's definition, `{{schema}}.name (...)`; omitted when the table exists already. */
  table?: string;
  /** The statement the function runs per row (NEW and OLD as the event has them). */
  insert: string;
  /** `AFTER UPDATE OF state ON {{schema}}.task_states` and the like. */
  on: string;
  /** The trigger's WHEN condition. */
  when?: string;
  /** Arguments the function gets (TG_ARGV). */
  args?: string;
}

/**
 * A row trigger that runs `insert` in the transaction that makes the change, so that what the
 * change loses (a crash, a rollback) its log row loses too, and a change made twice logs twice.
 */
export function logTrigger(t: LogTrigger): string {
  return `${t.table ? `CREATE TABLE ${t.table};\n` : ''}CREATE FUNCTION {{schema}}.${t.name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  ${t.insert};
  RETURN NULL;
END $$;
CREATE TRIGGER ${t.name} ${t.on} FOR EACH ROW${t.when ? ` WHEN (${t.when})` : ''} EXECUTE FUNCTION {{schema}}.${t.name}(${t.args ?? ''});`;
}
