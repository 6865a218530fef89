/**
 * Statements of the maintenance components: the forwarder (due scheduled and
 * retry tasks become pending), the recoverer (expired leases) and the janitor
 * (retention, unique locks, archive bounds). All of them skip locked rows, so
 * every server may run them at once and none waits on another.
 */
import { sql } from 'kysely';
import type { Db } from './db.js';
import { compareSeq, type TaskCore } from './rows.js';

/**
 * Makes up to `limit` due scheduled and retry tasks pending (or aggregating,
 * for a grouped task) and notifies their queues. Returns how many moved.
 */
export async function forwardDue(db: Db, limit: number): Promise<number> {
  const rows = await db.run(sql<{ n: number }>`SELECT ${db.table('forward_due')}(${limit}::int, ${db.clockShift()}) AS n`, undefined, 'forward');
  return rows[0]?.n ?? 0;
}

/** Milliseconds until the next scheduled or retry task is due (≤ 0: due now); null when none waits. */
export async function nextDueIn(db: Db): Promise<number | null> {
  const rows = await db.run(
    sql<{ ms: number | null }>`
    SELECT (extract(epoch FROM pg_catalog.min(run_at) - ${db.now()}) * 1000::numeric)::float8 AS ms
    FROM ${db.table('task_states')} WHERE state IN ('scheduled', 'retry')`,
    undefined,
    'next_due',
  );
  return rows[0]?.ms ?? null;
}

/**
 * An active task whose lease expired past the cutoff, as the recoverer needs
 * it: what it is and how many attempts it spent, not what it carries (its
 * payload and headers are read only for a retryDelay, by loadInputs).
 */
export interface ExpiredLease {
  seq: string;
  queue: string;
  /** null: the state row has no inputs (written outside the library), so nothing can run it. */
  id: string | null;
  type: string | null;
  retried: number;
  max_retry: number | null;
  lease_owner: string;
  lease_token: string;
  /** The lease ran out impossibly far in the future (R8): a clock or data problem, not a dead worker. */
  implausible: boolean;
  /** Bytes of the payload and headers as the client receives them (JSON text, bytea); null unless asked. */
  input_bytes: number | null;
}

/** How far past its expiry a lease is rescued, and how far ahead of now one is impossible. */
export interface RecoveryBounds {
  cutoffMs: number;
  leaseMs: number;
}

/**
 * Up to `limit` active tasks whose lease expired more than `cutoffMs` ago
 * (or is impossibly far in the future: clock abuse or corrupt data), through
 * the owner's expired_leases() (migration 0010: the worker reads no lease
 * token but these). A plain read: the recoverer decides what becomes of each
 * outside any transaction (its retry policy is the user's code), then
 * recoverLeases() writes that; recover_leases() and drop_orphans() check the
 * same bounds before they write. State rows without inputs come too (id
 * null). `sizes`: also measure each task's payload and headers (in
 * PostgreSQL: only the numbers leave it), for a recoverer that loads them in
 * bounded batches.
 */
export async function findExpired(db: Db, bounds: RecoveryBounds, limit: number, sizes = false): Promise<ExpiredLease[]> {
  return db.run(
    sql<ExpiredLease>`
    SELECT e.task_seq::text AS seq, e.queue, e.id, e.type, e.retried, e.max_retry, e.lease_owner, e.lease_token, e.implausible, e.input_bytes
    FROM ${db.table('expired_leases')}(${limit}::int, ${sizes}::bool, ${bounds.cutoffMs}::float8, ${bounds.leaseMs}::float8, ${db.clockShift()}) e`,
    undefined,
    'expired-leases',
  );
}

/** What a retryDelay is handed of a task besides its type: its payload and headers. */
export type TaskInputs = Pick<TaskCore, 'payload' | 'payload_bytes' | 'headers'> & { seq: string };

/** The payloads and headers of the tasks `seqs` (those still stored). */
export async function loadInputs(db: Db, seqs: readonly string[]): Promise<TaskInputs[]> {
  if (seqs.length === 0) return [];
  return db.run(sql<TaskInputs>`
    SELECT i.seq::text AS seq, i.payload, i.payload_bytes, i.headers FROM ${db.table('task_inputs')} i
    WHERE i.seq = ANY(${seqs}::bigint[])`);
}

/**
 * Deletes active state rows that have no inputs (a row written outside the
 * library: the tasks view, the Inspector and the CLI cannot see it, nothing
 * can run it, and while active it holds a slot of its queue's concurrency),
 * if still so under the same lease and still recoverable. A locked row is
 * left for the next tick. Resolves to the seqs deleted.
 */
export async function dropOrphans(db: Db, orphans: readonly { seq: string; token: string }[], bounds: RecoveryBounds): Promise<string[]> {
  if (orphans.length === 0) return [];
  const sorted = [...orphans].sort((a, b) => compareSeq(a.seq, b.seq));
  const rows = await db.run(sql<{ seq: string }>`
    SELECT d::text AS seq FROM ${db.table('drop_orphans')}(${sorted.map((r) => r.seq)}::bigint[], ${sorted.map((r) => r.token)}::uuid[],
      ${bounds.cutoffMs}::float8, ${bounds.leaseMs}::float8, ${db.clockShift()}) d`);
  return rows.map((r) => r.seq);
}

/** What the recoverer decided for one expired lease. */
export interface Recovery {
  seq: string;
  token: string;
  archive: boolean;
  delayMs: number;
}

/**
 * Moves each task to retry (after its delay) or to the archive, as decided,
 * if it is still active under the same lease and still recoverable: a
 * heartbeat that extended it meanwhile, or another recoverer that took it
 * first, leaves it out (the row lock makes the second writer re-check); a
 * row locked right now is left for the next tick.
 * Resolves to the seqs moved, each with whether it was archived.
 */
export async function recoverLeases(db: Db, recoveries: readonly Recovery[], bounds: RecoveryBounds): Promise<{ seq: string; archived: boolean }[]> {
  if (recoveries.length === 0) return [];
  const sorted = [...recoveries].sort((a, b) => compareSeq(a.seq, b.seq));
  return db.run(sql<{ seq: string; archived: boolean }>`
    SELECT r.task_seq::text AS seq, r.archived FROM ${db.table('recover_leases')}(
      ${sorted.map((r) => r.seq)}::bigint[], ${sorted.map((r) => r.token)}::uuid[], ${sorted.map((r) => r.archive)}::bool[],
      ${sorted.map((r) => r.delayMs)}::float8[], ${bounds.cutoffMs}::float8, ${bounds.leaseMs}::float8, ${db.clockShift()}) r`);
}

/** Deletes up to `limit` completed tasks whose retention has ended. */
export async function deleteExpiredCompleted(db: Db, limit: number): Promise<number> {
  const rows = await db.run(sql<{ n: number }>`SELECT ${db.table('delete_expired_completed')}(${limit}::int, ${db.clockShift()}) AS n`);
  return rows[0]?.n ?? 0;
}

/** Deletes up to `limit` unique locks past their TTL. */
export async function deleteExpiredLocks(db: Db, limit: number): Promise<number> {
  const rows = await db.run(sql<{ n: number }>`SELECT ${db.table('delete_expired_locks')}(${limit}::int, ${db.clockShift()}) AS n`);
  return rows[0]?.n ?? 0;
}

/**
 * Trims each queue's archive as asynq does: archived tasks older than 90 days
 * and all but the newest 10,000 go, up to `limit` rows per call (the bounds
 * are fixed in trim_archive(), migration 0010).
 */
export async function trimArchive(db: Db, limit: number): Promise<number> {
  const rows = await db.run(sql<{ n: number }>`SELECT ${db.table('trim_archive')}(${limit}::int, ${db.clockShift()}) AS n`);
  return rows[0]?.n ?? 0;
}

/** The owner's functions (migration 0010) the statements of this file call, by signature: broker/roles.ts grants them to the worker. */
export const MAINTENANCE_FUNCTIONS: readonly string[] = [
  'forward_due(integer, float8)',
  'expired_leases(integer, boolean, float8, float8, float8)',
  'recover_leases(bigint[], uuid[], boolean[], float8[], float8, float8, float8)',
  'drop_orphans(bigint[], uuid[], float8, float8, float8)',
  'delete_expired_completed(integer, float8)',
  'delete_expired_locks(integer, float8)',
  'trim_archive(integer, float8)',
];
