/**
 * Every write about a claimed task (the claim itself is claim.ts). Each is
 * fenced: it matches the task's state row only while `state = 'active'` and
 * `lease_token` is the token of this claim, so a worker that lost its lease
 * changes nothing. Leases are found by the task's `seq` (the state row's
 * primary key); batch statements take one row per lease through unnest() and
 * lock rows in seq order, so concurrent batches cannot deadlock.
 * The claim and every fenced write touch task_states, the narrow row; the
 * task's inputs (payload, headers, options) are read at the claim and deleted
 * with the task, never rewritten.
 */
import { sql } from 'kysely';
import type { AnyTransaction, Db } from './db.js';
import { compareSeq, leaseReleased } from './rows.js';

/** Identifies one lease: the task, its state row and the token it was claimed with. */
export interface LeaseKey {
  queue: string;
  id: string;
  /** The task's internal key (bigint, as text). */
  seq: string;
  token: string;
}

/** The items whose state row the statement returned: the leases that were still held. */
function held<T extends LeaseKey>(items: readonly T[], rows: readonly { seq: string }[]): T[] {
  const seqs = new Set(rows.map((r) => String(r.seq)));
  return items.filter((i) => seqs.has(String(i.seq)));
}

const bySeq = <T extends LeaseKey>(items: readonly T[]): T[] => [...items].sort((a, b) => compareSeq(a.seq, b.seq));

const ms = (n: number) => sql`(${n}::float8 * interval '1 millisecond')`;

/**
 * The leases of a batch as statement parameters: the seqs in ascending order
 * (an index scan of the primary key by `seq = ANY` meets, and locks, rows in
 * that order, so batches cannot deadlock on each other), and a JSON object
 * from seq to the lease's token (or to [token, …fields]), which each row
 * looks its own entry up in. No join with the batch: a join is planned on the
 * row estimate of `state = 'active'`, which is often 1, and then rescans the
 * batch once per row (seen: 125,000 comparisons for a batch of 500).
 */
function batch<T extends LeaseKey>(items: readonly T[], fields?: (item: T) => unknown[]) {
  const sorted = bySeq(items);
  const byseq: Record<string, unknown> = {};
  for (const i of sorted) byseq[i.seq] = fields ? [i.token, ...fields(i)] : i.token;
  return { seqs: sorted.map((i) => i.seq), json: JSON.stringify(byseq) };
}

/** The rows of a batch whose lease is still held (`s` is task_states). */
const fenced = (b: { seqs: string[]; json: string }, withFields = false) =>
  withFields
    ? sql`s.seq = ANY(${b.seqs}::bigint[]) AND s.state = 'active' AND s.lease_token = ((${b.json}::jsonb -> s.seq::text) ->> 0)::uuid`
    : sql`s.seq = ANY(${b.seqs}::bigint[]) AND s.state = 'active' AND s.lease_token = (${b.json}::jsonb ->> s.seq::text)::uuid`;

/** Field `n` (1-based after the token) of a row's batch entry, as text. */
const field = (b: { json: string }, n: number) => sql`((${b.json}::jsonb -> s.seq::text) ->> ${sql.lit(n)})`;

/**
 * Extends every lease still held, by `leaseMs` from now (database clock).
 * Returns the leases extended, each with whether a cancellation was requested;
 * a lease missing from the result is lost. lease_expires_at is in no index, so
 * an extension is a HOT update of the narrow row.
 */
export async function extendLeases<T extends LeaseKey>(db: Db, leases: readonly T[], leaseMs: number): Promise<{ lease: T; cancelRequested: boolean }[]> {
  if (leases.length === 0) return [];
  const b = batch(leases);
  const rows = await db.run(
    sql<{ seq: string; cancel_requested: boolean }>`
    UPDATE ${db.table('task_states')} s SET lease_expires_at = ${db.now()} + ${ms(leaseMs)}
    WHERE ${fenced(b)} AND s.lease_expires_at > ${db.now()}
    RETURNING s.seq, s.cancel_requested`,
    undefined,
    'extend',
  );
  const cancel = new Map(rows.map((r) => [String(r.seq), r.cancel_requested]));
  return leases.filter((l) => cancel.has(String(l.seq))).map((lease) => ({ lease, cancelRequested: cancel.get(String(lease.seq))! }));
}

/**
 * The leases of `leases` whose task the database marks for cancellation
 * (`cancel_requested`, which Inspector.cancelProcessing sets) while `owner`
 * still holds them under the same token. A cancel notification names a task
 * id and anyone who can connect may send one: only this answer decides. A
 * plain read: it takes no lock, so a lease inside ctx.transaction does not
 * make it wait.
 */
export async function cancelRequested<T extends LeaseKey>(db: Db, leases: readonly T[], owner: string): Promise<T[]> {
  if (leases.length === 0) return [];
  const b = batch(leases);
  const rows = await db.run(
    sql<{ seq: string }>`
    SELECT s.seq FROM ${db.table('task_states')} s
    WHERE ${fenced(b)} AND s.lease_owner = ${owner} AND s.cancel_requested`,
    undefined,
    'cancel-requested',
  );
  return held(leases, rows);
}

/** A successful (or revoked) attempt: `keep` marks it completed for its retention, otherwise it is deleted. */
export interface Completion extends LeaseKey {
  keep: boolean;
}

/** Deletes the inputs of the tasks in `from` and the unique locks they still hold. */
const deleteInputs = (db: Db, from: string) => sql`
    inputs AS (
      DELETE FROM ${db.table('task_inputs')} i WHERE i.seq = ANY(ARRAY(SELECT seq FROM ${sql.raw(from)}))
      RETURNING i.seq, i.queue, i.id, i.unique_key
    ),
    unlocked AS (
      DELETE FROM ${db.table('unique_locks')} l USING inputs f
      WHERE f.unique_key IS NOT NULL AND l.queue = f.queue AND l.key = f.unique_key AND l.task_id = f.id
    )`;

/**
 * Finishes successful attempts: deletes each task, or marks it completed until
 * its retention ends, and releases its unique lock if it still holds it.
 * Returns the leases that were still held (the others are fenced off).
 */
export async function complete<T extends Completion>(db: Db, items: readonly T[], trx?: AnyTransaction): Promise<T[]> {
  if (items.length === 0) return [];
  if (!items.some((i) => i.keep)) return deleteCompleted(db, items, trx);
  const b = batch(items, (i) => [i.keep]);
  const rows = await db.run(
    sql<{ seq: string }>`
    WITH h AS MATERIALIZED (
      SELECT s.seq, ${field(b, 1)}::bool AS keep FROM ${db.table('task_states')} s
      WHERE ${fenced(b, true)} ORDER BY s.seq FOR UPDATE
    ),
    deleted AS (
      DELETE FROM ${db.table('task_states')} s WHERE s.seq = ANY(ARRAY(SELECT seq FROM h WHERE NOT keep))
      RETURNING s.seq
    ),
    ${deleteInputs(db, 'deleted')},
    kept AS (
      UPDATE ${db.table('task_states')} s
      SET state = 'completed', completed_at = ${db.now()},
          run_at = ${db.now()} + (SELECT i.retention FROM ${db.table('task_inputs')} i WHERE i.seq = s.seq),
          ${leaseReleased(db)}
      WHERE s.seq = ANY(ARRAY(SELECT seq FROM h WHERE keep))
      RETURNING s.seq
    ),
    unlocked_kept AS (
      DELETE FROM ${db.table('unique_locks')} l
      USING (SELECT i.queue, i.id, i.unique_key FROM ${db.table('task_inputs')} i
             WHERE i.seq = ANY(ARRAY(SELECT seq FROM kept)) AND i.unique_key IS NOT NULL) f
      WHERE l.queue = f.queue AND l.key = f.unique_key AND l.task_id = f.id
    )
    SELECT seq FROM h`,
    trx,
    'complete',
  );
  return held(items, rows);
}

/**
 * complete() when no task is kept (retention 0, the common case): a plain
 * fenced DELETE, each row written once, locked in seq order as the index scan
 * meets it.
 */
async function deleteCompleted<T extends Completion>(db: Db, items: readonly T[], trx?: AnyTransaction): Promise<T[]> {
  const b = batch(items);
  const rows = await db.run(
    sql<{ seq: string }>`
    WITH deleted AS (
      DELETE FROM ${db.table('task_states')} s WHERE ${fenced(b)}
      RETURNING s.seq
    ),
    ${deleteInputs(db, 'deleted')}
    SELECT seq FROM deleted`,
    trx,
    'complete-delete',
  );
  return held(items, rows);
}

/**
 * complete() of one task inside the transaction that holds its lease (ctx.transaction). Its
 * plan is made generic first, for the rest of this transaction only: PostgreSQL's choice
 * between a generic and a custom plan prices a batch of one so low that it plans the
 * statement afresh on every call, which cost more than running it (L1: 1.0 ms planned and
 * 1.3 ms run per completion; 0.5 ms run from a generic plan). The handler's statements ran
 * before this, under the session's own setting.
 */
export async function completeHeld(db: Db, trx: AnyTransaction, item: Completion): Promise<boolean> {
  if (db.preparesStatements) await db.run(sql`SELECT set_config('plan_cache_mode', 'force_generic_plan', true)`, trx, 'generic-plans');
  return (await complete(db, [item], trx)).length === 1;
}

/** A failed attempt: to retry after `delayMs`, or to the archive. */
export interface Failure extends LeaseKey {
  archive: boolean;
  /** Whether the failure uses up a retry (asynq's IsFailure). */
  counts: boolean;
  delayMs: number;
  error: string;
}

/** Moves failed attempts to retry or archived. Returns the leases that were still held. */
export async function fail<T extends Failure>(db: Db, items: readonly T[]): Promise<T[]> {
  if (items.length === 0) return [];
  const b = batch(items, (i) => [i.archive, i.counts, i.delayMs, i.error]);
  const archive = sql`${field(b, 1)}::bool`;
  const rows = await db.run(
    sql<{ seq: string }>`
    WITH failed AS (
      UPDATE ${db.table('task_states')} s
      SET state = CASE WHEN ${archive} THEN 'archived' ELSE 'retry' END,
          retried = s.retried + CASE WHEN ${field(b, 2)}::bool AND NOT ${archive} THEN 1 ELSE 0 END,
          run_at = ${db.now()} + CASE WHEN ${archive} THEN interval '0' ELSE ${field(b, 3)}::float8 * interval '1 millisecond' END,
          error_msg = ${field(b, 4)}, last_failed_at = ${db.now()},
          ${leaseReleased(db)}
      WHERE ${fenced(b, true)}
      RETURNING s.seq, s.queue, s.state
    ),
    -- A retry may be due sooner than the forwarders' sleep, as a delayed enqueue may.
    notified AS (SELECT pg_notify(${db.channels.delayed}, queue) FROM (SELECT DISTINCT queue FROM failed WHERE state = 'retry') q)
    SELECT seq FROM failed WHERE (SELECT pg_catalog.count(*) FROM notified) >= 0`,
    undefined,
    'fail',
  );
  return held(items, rows);
}

/** A snoozed attempt: due again in `delayMs`. */
export interface Snoozed extends LeaseKey {
  delayMs: number;
}

/**
 * Puts snoozed tasks back as scheduled, due in their delay (database clock),
 * retry count and last error unchanged, and wakes the forwarders of their
 * queues (a snooze may be shorter than their sleep). Returns the leases that
 * were still held.
 */
export async function snooze<T extends Snoozed>(db: Db, items: readonly T[]): Promise<T[]> {
  if (items.length === 0) return [];
  const b = batch(items, (i) => [i.delayMs]);
  const rows = await db.run(
    sql<{ seq: string }>`
    WITH snoozed AS (
      UPDATE ${db.table('task_states')} s
      SET state = 'scheduled', run_at = ${db.now()} + ${field(b, 1)}::float8 * interval '1 millisecond',
          ${leaseReleased(db)}
      WHERE ${fenced(b, true)}
      RETURNING s.seq, s.queue
    ),
    notified AS (SELECT pg_notify(${db.channels.delayed}, queue) FROM (SELECT DISTINCT queue FROM snoozed) q)
    SELECT seq FROM snoozed WHERE (SELECT pg_catalog.count(*) FROM notified) >= 0`,
    undefined,
    'snooze',
  );
  return held(items, rows);
}

/**
 * Gives leases back at shutdown: the tasks return to the front of pending with
 * their retry count unchanged (asynq's requeue). Returns the leases still held.
 */
export async function requeue<T extends LeaseKey>(db: Db, leases: readonly T[]): Promise<T[]> {
  if (leases.length === 0) return [];
  const b = batch(leases);
  const rows = await db.run(sql<{ seq: string }>`
  WITH requeued AS (
    UPDATE ${db.table('task_states')} s
    SET state = 'pending', run_at = h.front_at - interval '1 microsecond', pending_seq = h.front - h.n + h.rank - 1,
        ${leaseReleased(db)}
    FROM (
      -- Ahead of the queue's first pending task, in the order they were claimed.
      SELECT l.seq, row_number() OVER w AS rank, pg_catalog.count(*) OVER (PARTITION BY l.queue) AS n,
             coalesce((SELECT pg_catalog.min(p.pending_seq) FROM ${db.table('task_states')} p WHERE p.queue = l.queue AND p.state = 'pending'),
                      nextval(${db.qualified('task_seq')})) AS front,
             coalesce((SELECT pg_catalog.min(p.run_at) FROM ${db.table('task_states')} p WHERE p.queue = l.queue AND p.state = 'pending'),
                      ${db.now()}) AS front_at
      FROM (SELECT s.seq, s.queue FROM ${db.table('task_states')} s WHERE ${fenced(b)} ORDER BY s.seq FOR UPDATE) l
      WINDOW w AS (PARTITION BY l.queue ORDER BY l.seq)
    ) h
    WHERE s.seq = h.seq
    RETURNING s.seq, s.queue
  ),
  -- Below the claim cursors' floors: every server's next claim of the queue starts from its head.
  notified AS (SELECT pg_notify(${db.channels.sweep}, queue) FROM (SELECT DISTINCT queue FROM requeued) q)
  SELECT seq FROM requeued WHERE (SELECT pg_catalog.count(*) FROM notified) >= 0`);
  return held(leases, rows);
}

/** Stores a handler's result on its task. Returns false when the lease is gone. */
export async function writeResult(db: Db, lease: LeaseKey, json: string | null, bytes: Buffer | null): Promise<boolean> {
  const rows = await db.run(sql<{ seq: string }>`
    UPDATE ${db.table('task_states')} SET result = ${json}::jsonb, result_bytes = ${bytes}, updated_at = ${db.now()}
    WHERE seq = ${lease.seq}::bigint AND lease_token = ${lease.token}::uuid AND state = 'active'
    RETURNING seq`);
  return rows.length === 1;
}

/**
 * Inside a handler's transaction: locks the task's state row if this lease
 * still holds it. While the lock is held no recoverer can take the task (they
 * skip locked rows), so the completion at the end of the transaction cannot miss.
 */
export async function lockLease(db: Db, trx: AnyTransaction, lease: LeaseKey): Promise<boolean> {
  const rows = await db.run(
    sql<{ seq: string }>`
    SELECT seq FROM ${db.table('task_states')}
    WHERE seq = ${lease.seq}::bigint AND lease_token = ${lease.token}::uuid AND state = 'active'
    FOR UPDATE`,
    trx,
    'lock-lease',
  );
  return rows.length === 1;
}

/** The owner's functions (migration 0010) the statements of this file call, by signature: broker/roles.ts grants them to the worker. */
export const LEASE_FUNCTIONS: readonly string[] = [];
