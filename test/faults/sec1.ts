/**
 * SEC1's cluster and helpers, for sec1-roles*.test.ts: a throwaway cluster
 * per file (roles are cluster-global), the roles' SQL printed by the CLI as a
 * user would get it and applied before and after the owner migrates, and once
 * more (idempotent); a pool per role's login, the CLI as each role, and the
 * assertion that a statement is refused with SQLSTATE 42501 and nothing else.
 */
import assert from 'node:assert/strict';
import { after, before } from 'node:test';
import pg from 'pg';
import { migrate, roleSetupSql, Server, type Logger, type ServerConfig } from '../../src/index.js';
import { run } from '../../src/cli/program.js';
import { runCli } from '../helpers.js';
import { startCluster, type Cluster } from './cluster.js';

export const S = 'sec1';
export const KINDS = ['owner', 'producer', 'worker', 'monitor', 'inspector', 'admin'] as const;
export type Kind = (typeof KINDS)[number];

export let cluster: Cluster;
export let su: pg.Pool;
export const pools = new Map<Kind, pg.Pool>();
export const url = (kind: Kind) => `postgres://pgasynq_${kind}_login@127.0.0.1:${cluster.port}/postgres`;
export const as = (kind: Kind, text: string, values?: unknown[]) => pools.get(kind)!.query(text.replaceAll('{{S}}', `"${S}"`), values);
export const cli = (kind: Kind, ...args: string[]) => runCli(['--database-url', url(kind), '--schema', S, ...args]);

/**
 * The same CLI in this process (program.ts run(), what main.ts calls): child
 * processes cost seconds each on a loaded machine, so only `roles` and the
 * inspector's `stats`, the commands SEC1 names, run as children.
 */
export async function cliHere(kind: Kind, ...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = '';
  let stderr = '';
  const code = await run(['--database-url', url(kind), '--schema', S, ...args], {
    out: { write: (s: string) => (stdout += s) },
    err: { write: (s: string) => (stderr += s) },
    env: {},
  });
  return { code, stdout, stderr };
}

/** Rejects with SQLSTATE 42501 (insufficient_privilege), and nothing else. */
export async function refused(p: Promise<unknown>, what: string): Promise<void> {
  await assert.rejects(
    p,
    (err: { code?: string; message?: string }) => {
      assert.equal(err?.code, '42501', `${what}: expected SQLSTATE 42501, got ${err?.code}: ${err?.message}`);
      return true;
    },
    what,
  );
}

/** DDL and TRUNCATE: nobody but the owner. Tasks are two tables (task_inputs, task_states) and the view tasks. */
export async function refusesDdl(kind: Kind): Promise<void> {
  for (const stmt of [
    'CREATE TABLE {{S}}.evil (a int)',
    'ALTER TABLE {{S}}.task_inputs ADD COLUMN evil int',
    'ALTER TABLE {{S}}.task_states ADD COLUMN evil int',
    'CREATE INDEX evil ON {{S}}.task_states (retried)',
    'DROP TABLE {{S}}.daily_stats',
    'DROP VIEW {{S}}.queue_stats',
    'DROP VIEW {{S}}.tasks',
    'DROP TRIGGER tasks_write ON {{S}}.tasks',
    // tasks_write() runs as the owner: replacing it would be writing as the owner.
    'CREATE OR REPLACE FUNCTION {{S}}.tasks_write() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$',
    'TRUNCATE {{S}}.task_inputs',
    'TRUNCATE {{S}}.task_states',
    'TRUNCATE {{S}}.queues CASCADE',
    'CREATE SCHEMA evil',
  ]) {
    await refused(as(kind, stmt), `${kind}: ${stmt}`);
  }
}

export type LogLine = { msg: string | undefined; code: unknown; err: string };

/**
 * A Server as the worker role's login: 4 slots, polling every 100 ms, shutdown within 1 s, its warnings
 * and errors into `logs` (captureLogger), and `config` (its queues, and what else the test needs).
 */
export function workerRoleServer(logs: LogLine[], config: Omit<ServerConfig, 'schema'>): Server {
  return new Server({
    connectionString: url('worker'),
    schema: S,
    concurrency: 4,
    taskCheckInterval: 100,
    shutdownTimeout: 1000,
    logger: captureLogger(logs),
    ...config,
  });
}

/** No component logged a refusal (SQLSTATE 42501, "permission denied"). */
export function assertNoneRefused(logs: LogLine[]): void {
  assert.deepEqual(
    logs.filter((l) => l.code === '42501' || /permission denied/.test(l.err)),
    [],
    'no component was refused',
  );
}

/** Records warnings and errors, so a background component's 42501 cannot go unseen. */
export function captureLogger(lines: LogLine[]): Logger {
  const push = (obj: object, msg?: string) => {
    const err = (obj as { err?: { code?: unknown; message?: string } }).err;
    lines.push({ msg, code: err?.code, err: err?.message ?? '' });
  };
  const logger: Logger = { debug() {}, info() {}, warn: push, error: push, child: () => logger };
  return logger;
}

/** The cluster of a SEC1 file, with the roles set up as a user would, torn down after the file. */
export function useRolesCluster(): void {
  before(async () => {
    // As a user would: print the SQL with the CLI (it needs no database: while the
    // cluster starts), apply it as a superuser before the first migrate (roles and
    // schema only), migrate as the owner, apply it again.
    const [started, printed] = await Promise.all([startCluster(), runCli(['--schema', S, 'roles', '--logins'])]);
    cluster = started;
    su = new pg.Pool({ connectionString: cluster.connectionString, max: 2 });
    assert.equal(printed.code, 0, printed.stderr);
    assert.equal(printed.stdout, roleSetupSql({ schema: S, logins: true }));
    await su.query(printed.stdout);
    await migrate({ connectionString: `postgres://pgasynq_owner_login@127.0.0.1:${cluster.port}/postgres`, schema: S });
    // Before the rerun, what the migration created is nobody's: a SECURITY DEFINER
    // function callable by PUBLIC would run as the owner for anyone with USAGE.
    const callable = await su.query<{ role: string }>(
      `SELECT r.rolname AS role FROM pg_roles r
     WHERE r.rolname = ANY($2::text[]) AND has_function_privilege(r.oid, $1::text::regprocedure, 'EXECUTE')`,
      [`"${S}".settle_completed(bigint[], jsonb[], bytea[], text)`, KINDS.filter((k) => k !== 'owner').map((k) => `pgasynq_${k}`)],
    );
    assert.deepEqual(callable.rows, [], 'settle_completed() is callable between migrate and the rerun');
    await su.query(printed.stdout);
    await su.query(printed.stdout); // a rerun changes nothing and fails nothing
    for (const kind of KINDS) pools.set(kind, new pg.Pool({ connectionString: url(kind), max: 2 }));
  });

  after(async () => {
    await Promise.all([...pools.values()].map((p) => p.end().catch(() => {})));
    await su?.end().catch(() => {});
    cluster?.destroy();
  });
}
