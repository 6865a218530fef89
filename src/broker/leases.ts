/**
 * Every write about a claimed task (the claim itself is claim.ts). Each is a
 * call of one of the owner's functions (migration 0010, SECURITY DEFINER: the
 * worker holds no UPDATE or DELETE on the task tables), fenced inside it: it
 * matches the task's state row only while `state = 'active'` and
 * `lease_token` is the token of this claim, so a worker that lost its lease
 * changes nothing. Leases are found by the task's `seq` (the state row's
 * primary key); a batch is sent as parallel arrays in seq order, and the
 * functions lock rows in that order, so concurrent batches cannot deadlock.
 * The claim and every fenced write touch task_states, the narrow row; the
 * task's inputs (payload, headers, options) are read at the claim and deleted
 * with the task, never rewritten.
 */
import { sql } from 'kysely';
import type { AnyTransaction, Db } from './db.js';
import { compareSeq } from './rows.js';

/** Identifies one lease: the task, its state row and the token it was claimed with. */
export interface LeaseKey {
  queue: string;
  id: string;
  /** The task's internal key (bigint, as text). */
  seq: string;
  token: string;
}

/**
 * ctx.log() lines a write carries for its lease (append_task_logs(), 0013):
 * attempt, age in ms when sent (the database dates a line by its own clock
 * less the age), message.
 */
export type LogLines = readonly (readonly [attempt: number, ageMs: number, message: string])[];

/** A lease's write, with the log lines it carries, if any. */
export interface WithLines {
  lines?: LogLines | undefined;
}

/** The lines of a batch as the functions take them: `{"<seq>": {"t": token, "l": lines}}`, or null when none has any. */
function logsOf(items: readonly (LeaseKey & WithLines)[]): string | null {
  let out = '';
  for (const i of items) {
    if (i.lines === undefined || i.lines.length === 0) continue;
    out += `${out === '' ? '{' : ','}"${i.seq}":{"t":"${i.token}","l":${JSON.stringify(i.lines)}}`;
  }
  return out === '' ? null : `${out}}`;
}

/** The items whose seq the function returned: the leases that were still held. */
function held<T extends LeaseKey>(items: readonly T[], rows: readonly { seq: string }[]): T[] {
  const seqs = new Set(rows.map((r) => String(r.seq)));
  return items.filter((i) => seqs.has(String(i.seq)));
}

/** A batch in seq order, as the functions take it: its seqs and tokens as array parameters. */
function batch<T extends LeaseKey>(items: readonly T[]) {
  const sorted = [...items].sort((a, b) => compareSeq(a.seq, b.seq));
  return { sorted, keys: sql`${arrayLiteral(sorted, 'seq')}::bigint[], ${arrayLiteral(sorted, 'token')}::uuid[]` };
}

/**
 * The array literal of the items' seqs or tokens, written out: both came from the
 * database as digits and UUIDs, which need no quoting, and pg's own serializer
 * quotes and escapes each element (a tenth of the worker's garbage at a drain's pace).
 */
function arrayLiteral(items: readonly LeaseKey[], key: 'seq' | 'token'): string {
  return `{${items.map((i) => i[key]).join(',')}}`;
}

/**
 * Extends every lease still held, by `leaseMs` from now (database clock).
 * Returns the leases extended, each with whether a cancellation was requested,
 * and the leases whose row another transaction holds locked (a completion
 * under way, an admin's write), with `cancelRequested` null: not extended this
 * time, not lost either (the heartbeat never waits for a row lock, 0016). A
 * lease missing from the result is lost.
 */
export async function extendLeases<T extends LeaseKey & WithLines>(
  db: Db,
  leases: readonly T[],
  leaseMs: number,
): Promise<{ lease: T; cancelRequested: boolean | null }[]> {
  if (leases.length === 0) return [];
  const b = batch(leases);
  const rows = await db.run(
    sql<{ seq: string; cancel_requested: boolean | null }>`
    SELECT e.task_seq::text AS seq, e.cancel_requested
    FROM ${db.table('extend_leases')}(${b.keys}, ${leaseMs}::float8, ${logsOf(leases)}::jsonb, ${db.clockShift()}) e`,
    undefined,
    'extend',
  );
  const cancel = new Map(rows.map((r) => [String(r.seq), r.cancel_requested]));
  return leases.filter((l) => cancel.has(String(l.seq))).map((lease) => ({ lease, cancelRequested: cancel.get(String(lease.seq))! }));
}

/**
 * The leases of `leases` whose task the database marks for cancellation
 * (`cancel_requested`, which Inspector.cancelProcessing sets) while `owner`
 * still holds them. A cancel notification names a task
 * id and anyone who can connect may send one: only this answer decides. A
 * plain read: it takes no lock, so a lease inside ctx.transaction does not
 * make it wait.
 */
export async function cancelRequested<T extends LeaseKey>(db: Db, leases: readonly T[], owner: string): Promise<T[]> {
  if (leases.length === 0) return [];
  // By seq and owner, not token: the worker reads no token (roles.ts), and a server's lease
  // table holds one lease per seq, so an active row of this seq owned by this server is that lease.
  const rows = await db.run(
    sql<{ seq: string }>`
    SELECT s.seq::text AS seq FROM ${db.table('task_states')} s
    WHERE s.seq = ANY(${leases.map((l) => l.seq)}::bigint[]) AND s.state = 'active' AND s.lease_owner = ${owner} AND s.cancel_requested`,
    undefined,
    'cancel-requested',
  );
  return held(leases, rows);
}

/** A successful (or revoked) attempt: `keep` marks it completed for its retention, otherwise it is deleted. */
export interface Completion extends LeaseKey, WithLines {
  keep: boolean;
}

/**
 * Finishes successful attempts (complete_tasks): deletes each task, or marks
 * it completed until its retention ends, and releases its unique lock if it
 * still holds it. Returns the leases that were still held (the others are
 * fenced off).
 */
export async function complete<T extends Completion>(db: Db, items: readonly T[], trx?: AnyTransaction): Promise<T[]> {
  if (items.length === 0) return [];
  const b = batch(items);
  const rows = await db.run(
    sql<{ seq: string }>`
    SELECT c::text AS seq FROM ${db.table('complete_tasks')}(${b.keys}, ${b.sorted.map((i) => i.keep)}::bool[], ${logsOf(items)}::jsonb, ${db.clockShift()}) c`,
    trx,
    'complete',
  );
  return held(items, rows);
}

/**
 * complete() of one task inside the transaction that holds its lease (ctx.transaction). Its
 * plan is made generic first, for the rest of this transaction only: PostgreSQL's choice
 * between a generic and a custom plan prices a batch of one so low that it plans the
 * statements afresh on every call, which cost more than running them (L1: 1.0 ms planned and
 * 1.3 ms run per completion; 0.5 ms run from a generic plan). The setting reaches the
 * statements inside complete_tasks(), which are planned as prepared statements are. The
 * handler's statements ran before this, under the session's own setting.
 */
export async function completeHeld(db: Db, trx: AnyTransaction, item: Completion): Promise<boolean> {
  if (db.preparesStatements) await db.run(sql`SELECT set_config('plan_cache_mode', 'force_generic_plan', true)`, trx, 'generic-plans');
  return (await complete(db, [item], trx)).length === 1;
}

/** A failed attempt: to retry after `delayMs`, or to the archive. */
export interface Failure extends LeaseKey, WithLines {
  archive: boolean;
  /** How the run ended, as its attempt record says. */
  outcome: 'failed' | 'timeout' | 'canceled';
  /** Whether the failure uses up a retry (asynq's IsFailure). */
  counts: boolean;
  delayMs: number;
  error: string;
}

/**
 * Moves failed attempts to retry or archived (fail_tasks), and wakes the
 * forwarders of the queues with a retry. Returns the leases that were still held.
 */
export async function fail<T extends Failure>(db: Db, items: readonly T[]): Promise<T[]> {
  if (items.length === 0) return [];
  const b = batch(items);
  const rows = await db.run(
    sql<{ seq: string }>`
    SELECT f::text AS seq FROM ${db.table('fail_tasks')}(${b.keys}, ${b.sorted.map((i) => i.archive)}::bool[],
      ${b.sorted.map((i) => i.counts)}::bool[], ${b.sorted.map((i) => i.delayMs)}::float8[], ${b.sorted.map((i) => i.error)}::text[],
      ${b.sorted.map((i) => i.outcome)}::text[], ${logsOf(items)}::jsonb, ${db.clockShift()}) f`,
    undefined,
    'fail',
  );
  return held(items, rows);
}

/** A snoozed attempt: due again in `delayMs`. */
export interface Snoozed extends LeaseKey, WithLines {
  delayMs: number;
}

/**
 * Puts snoozed tasks back as scheduled (snooze_tasks), due in their delay
 * (database clock), retry count and last error unchanged, and wakes the
 * forwarders of their queues (a snooze may be shorter than their sleep).
 * Returns the leases that were still held.
 */
export async function snooze<T extends Snoozed>(db: Db, items: readonly T[]): Promise<T[]> {
  if (items.length === 0) return [];
  const b = batch(items);
  const rows = await db.run(
    sql<{ seq: string }>`
    SELECT z::text AS seq FROM ${db.table('snooze_tasks')}(${b.keys}, ${b.sorted.map((i) => i.delayMs)}::float8[], ${logsOf(items)}::jsonb, ${db.clockShift()}) z`,
    undefined,
    'snooze',
  );
  return held(items, rows);
}

/**
 * Gives leases back at shutdown (requeue_tasks): the tasks return to the
 * front of pending with their retry count unchanged (asynq's requeue).
 * Returns the leases still held.
 */
export async function requeue<T extends LeaseKey & WithLines>(db: Db, leases: readonly T[]): Promise<T[]> {
  if (leases.length === 0) return [];
  const b = batch(leases);
  const rows = await db.run(
    sql<{ seq: string }>`SELECT r::text AS seq FROM ${db.table('requeue_tasks')}(${b.keys}, ${logsOf(leases)}::jsonb, ${db.clockShift()}) r`,
  );
  return held(leases, rows);
}

/** Stores a handler's result on its task (write_result), with its log lines. Returns false when the lease is gone. */
export async function writeResult(db: Db, lease: LeaseKey & WithLines, json: string | null, bytes: Buffer | null): Promise<boolean> {
  const rows = await db.run(
    sql<{ held: boolean }>`
    SELECT ${db.table('write_result')}(${lease.seq}::bigint, ${lease.token}::uuid, ${json}::jsonb, ${bytes}::bytea, ${logsOf([lease])}::jsonb,
      ${db.clockShift()}) AS held`,
  );
  return rows[0]?.held === true;
}

/**
 * Stores ctx.progress()'s value (JSON text, checked by model/following.ts and
 * again by write_progress()), with the lease's log lines, and tells the
 * watchers. Returns false when the lease is gone.
 */
export async function writeProgress(db: Db, lease: LeaseKey & WithLines, json: string): Promise<boolean> {
  const rows = await db.run(
    sql<{ held: boolean }>`
    SELECT ${db.table('write_progress')}(${lease.seq}::bigint, ${lease.token}::uuid, ${json}::jsonb, ${logsOf([lease])}::jsonb, ${db.clockShift()}) AS held`,
    undefined,
    'progress',
  );
  return rows[0]?.held === true;
}

/**
 * Inside a handler's transaction: locks the task's state row if this lease
 * still holds it (lock_lease). While the lock is held no recoverer can take
 * the task (they skip locked rows), so the completion at the end of the
 * transaction cannot miss.
 */
export async function lockLease(db: Db, trx: AnyTransaction, lease: LeaseKey): Promise<boolean> {
  const rows = await db.run(sql<{ held: boolean }>`SELECT ${db.table('lock_lease')}(${lease.seq}::bigint, ${lease.token}::uuid) AS held`, trx, 'lock-lease');
  return rows[0]?.held === true;
}

/** The owner's functions (migrations 0010, 0013) the statements of this file call, by signature: broker/roles.ts grants them to the worker. */
export const LEASE_FUNCTIONS: readonly string[] = [
  'extend_leases(bigint[], uuid[], float8, jsonb, float8)',
  'complete_tasks(bigint[], uuid[], boolean[], jsonb, float8)',
  'fail_tasks(bigint[], uuid[], boolean[], boolean[], float8[], text[], text[], jsonb, float8)',
  'snooze_tasks(bigint[], uuid[], float8[], jsonb, float8)',
  'requeue_tasks(bigint[], uuid[], jsonb, float8)',
  'write_result(bigint, uuid, jsonb, bytea, jsonb, float8)',
  'write_progress(bigint, uuid, jsonb, jsonb, float8)',
  'lock_lease(bigint, uuid)',
];
