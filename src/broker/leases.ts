/**
 * Claiming tasks and every write about a claimed task. Each of those writes is
 * fenced: it matches the row only while `state = 'active'` and `lease_token`
 * is the token of this claim, so a worker that lost its lease changes nothing.
 * Batch statements take one row per lease through unnest() and lock rows in
 * (queue, id) order, so concurrent batches cannot deadlock.
 */
import { sql, type Transaction } from 'kysely';
import type { Db } from './db.js';

/** A claimed task, as the processor needs it. */
export interface ClaimedRow {
  queue: string;
  id: string;
  type: string;
  payload: unknown;
  payload_bytes: Buffer | null;
  headers: Record<string, string>;
  retried: number;
  max_retry: number;
  timeout_ms: number;
  /** ms from the claim (database clock) to the task's deadline; null without one. */
  deadline_in_ms: number | null;
  retention_ms: number;
  lease_token: string;
}

/** Identifies one lease: the row and the token it was claimed with. */
export interface LeaseKey {
  queue: string;
  id: string;
  token: string;
}

const ms = (n: number) => sql`(${n}::float8 * interval '1 millisecond')`;

/**
 * Claims up to `limit` pending tasks in one statement, taking queues in the
 * given order and skipping paused ones. The inner LIMIT stops the lateral scan
 * as soon as enough rows are locked, so no row is locked without being claimed.
 */
export async function claim(db: Db, queues: readonly string[], limit: number, owner: string, leaseMs: number): Promise<ClaimedRow[]> {
  return db.run(sql<ClaimedRow>`
    WITH q AS (
      SELECT u.name, u.ord FROM unnest(${queues}::text[]) WITH ORDINALITY AS u(name, ord)
      WHERE NOT EXISTS (SELECT 1 FROM ${db.table('queues')} p WHERE p.name = u.name AND p.paused)
    ),
    c AS (
      SELECT c.queue, c.id FROM q CROSS JOIN LATERAL (
        SELECT t.queue, t.id FROM ${db.table('tasks')} t
        WHERE t.queue = q.name AND t.state = 'pending'
        ORDER BY t.run_at, t.seq
        LIMIT ${limit} FOR UPDATE SKIP LOCKED
      ) c
      -- The queues' order is the weighted shuffle: without ORDER BY a hash anti-join may
      -- reorder them. unnest WITH ORDINALITY is already in ord order, so this costs no sort.
      ORDER BY q.ord
      LIMIT ${limit}
    )
    UPDATE ${db.table('tasks')} t
    SET state = 'active', lease_owner = ${owner}, lease_token = gen_random_uuid(),
        lease_expires_at = now() + ${ms(leaseMs)}, started_at = now(), run_at = NULL,
        cancel_requested = false, updated_at = now()
    FROM c WHERE t.queue = c.queue AND t.id = c.id
    RETURNING t.queue, t.id, t.type, t.payload, t.payload_bytes, t.headers, t.retried, t.max_retry,
      (extract(epoch FROM t.timeout) * 1000)::float8 AS timeout_ms,
      (extract(epoch FROM t.deadline - now()) * 1000)::float8 AS deadline_in_ms,
      (extract(epoch FROM t.retention) * 1000)::float8 AS retention_ms,
      t.lease_token`, undefined, 'claim');
}

const leaseRows = (db: Db, leases: readonly LeaseKey[]) => sql`(
  SELECT t.queue, t.id FROM ${db.table('tasks')} t
  JOIN unnest(${leases.map((l) => l.queue)}::text[], ${leases.map((l) => l.id)}::text[], ${leases.map((l) => l.token)}::uuid[]) AS h(queue, id, token)
    ON t.queue = h.queue AND t.id = h.id AND t.lease_token = h.token
  WHERE t.state = 'active'
  ORDER BY t.queue, t.id
  FOR UPDATE OF t)`;

/**
 * Extends every lease still held, by `leaseMs` from now (database clock).
 * Returns the leases extended, each with whether a cancellation was requested;
 * a lease missing from the result is lost.
 */
export async function extendLeases(db: Db, leases: readonly LeaseKey[], leaseMs: number): Promise<{ queue: string; id: string; cancel_requested: boolean }[]> {
  if (leases.length === 0) return [];
  return db.run(sql<{ queue: string; id: string; cancel_requested: boolean }>`
    UPDATE ${db.table('tasks')} t SET lease_expires_at = now() + ${ms(leaseMs)}
    FROM ${leaseRows(db, leases)} h
    WHERE t.queue = h.queue AND t.id = h.id AND t.lease_expires_at > now()
    RETURNING t.queue, t.id, t.cancel_requested`, undefined, 'extend');
}

/** A successful (or revoked) attempt: `keep` marks it completed for its retention, otherwise it is deleted. */
export interface Completion extends LeaseKey {
  keep: boolean;
}

/**
 * Finishes successful attempts: deletes each row, or marks it completed until
 * its retention ends, and releases its unique lock if it still holds it.
 * Returns the leases that were still held (the others are fenced off).
 */
export async function complete(db: Db, items: readonly Completion[], trx?: Transaction<any>): Promise<{ queue: string; id: string }[]> {
  if (items.length === 0) return [];
  if (!items.some((i) => i.keep)) return deleteCompleted(db, items, trx);
  const fenced = sql`(
    SELECT t.queue, t.id, h.keep FROM ${db.table('tasks')} t
    JOIN unnest(${items.map((l) => l.queue)}::text[], ${items.map((l) => l.id)}::text[],
                ${items.map((l) => l.token)}::uuid[], ${items.map((l) => l.keep)}::bool[]) AS h(queue, id, token, keep)
      ON t.queue = h.queue AND t.id = h.id AND t.lease_token = h.token
    WHERE t.state = 'active' ORDER BY t.queue, t.id FOR UPDATE OF t)`;
  return db.run(
    sql<{ queue: string; id: string }>`
    WITH h AS MATERIALIZED ${fenced},
    deleted AS (
      DELETE FROM ${db.table('tasks')} t USING h
      WHERE t.queue = h.queue AND t.id = h.id AND NOT h.keep
      RETURNING t.queue, t.id, t.unique_key
    ),
    kept AS (
      UPDATE ${db.table('tasks')} t
      SET state = 'completed', completed_at = now(), run_at = now() + t.retention,
          lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = now()
      FROM h WHERE t.queue = h.queue AND t.id = h.id AND h.keep
      RETURNING t.queue, t.id, t.unique_key
    ),
    finished AS (SELECT * FROM deleted UNION ALL SELECT * FROM kept),
    unlocked AS (
      DELETE FROM ${db.table('unique_locks')} l USING finished f
      WHERE l.queue = f.queue AND l.key = f.unique_key AND l.task_id = f.id
    )
    SELECT queue, id FROM finished`,
    trx,
    'complete',
  );
}

/**
 * complete() when no task is kept (retention 0, the common case): a plain
 * fenced DELETE. Without the separate FOR UPDATE pass each row is written
 * once, not locked and then deleted. Rows are locked as the plan meets them:
 * the leases go in sorted by (queue, id) and the plan is a nested loop over
 * them, so this meets rows in the same order as every other batch statement.
 */
async function deleteCompleted(db: Db, items: readonly Completion[], trx?: Transaction<any>): Promise<{ queue: string; id: string }[]> {
  const sorted = [...items].sort((a, b) => (a.queue === b.queue ? (a.id < b.id ? -1 : a.id > b.id ? 1 : 0) : a.queue < b.queue ? -1 : 1));
  return db.run(
    sql<{ queue: string; id: string }>`
    WITH deleted AS (
      DELETE FROM ${db.table('tasks')} t
      USING unnest(${sorted.map((l) => l.queue)}::text[], ${sorted.map((l) => l.id)}::text[], ${sorted.map((l) => l.token)}::uuid[]) AS h(queue, id, token)
      WHERE t.queue = h.queue AND t.id = h.id AND t.lease_token = h.token AND t.state = 'active'
      RETURNING t.queue, t.id, t.unique_key
    ),
    unlocked AS (
      DELETE FROM ${db.table('unique_locks')} l USING deleted f
      WHERE f.unique_key IS NOT NULL AND l.queue = f.queue AND l.key = f.unique_key AND l.task_id = f.id
    )
    SELECT queue, id FROM deleted`,
    trx,
    'complete-delete',
  );
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
export async function fail(db: Db, items: readonly Failure[]): Promise<{ queue: string; id: string }[]> {
  if (items.length === 0) return [];
  return db.run(sql<{ queue: string; id: string }>`
    UPDATE ${db.table('tasks')} t
    SET state = CASE WHEN h.archive THEN 'archived' ELSE 'retry' END,
        retried = t.retried + CASE WHEN h.counts AND NOT h.archive THEN 1 ELSE 0 END,
        run_at = now() + CASE WHEN h.archive THEN interval '0' ELSE h.delay_ms * interval '1 millisecond' END,
        error_msg = h.error, last_failed_at = now(),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = now()
    FROM (
      SELECT t.queue, t.id, h.archive, h.counts, h.delay_ms, h.error FROM ${db.table('tasks')} t
      JOIN unnest(${items.map((l) => l.queue)}::text[], ${items.map((l) => l.id)}::text[], ${items.map((l) => l.token)}::uuid[],
                  ${items.map((l) => l.archive)}::bool[], ${items.map((l) => l.counts)}::bool[],
                  ${items.map((l) => l.delayMs)}::float8[], ${items.map((l) => l.error)}::text[])
        AS h(queue, id, token, archive, counts, delay_ms, error)
        ON t.queue = h.queue AND t.id = h.id AND t.lease_token = h.token
      WHERE t.state = 'active' ORDER BY t.queue, t.id FOR UPDATE OF t
    ) h
    WHERE t.queue = h.queue AND t.id = h.id
    RETURNING t.queue, t.id`, undefined, 'fail');
}

/**
 * Gives leases back at shutdown: the tasks return to the front of pending with
 * their retry count unchanged (asynq's requeue). Returns the leases still held.
 */
export async function requeue(db: Db, leases: readonly LeaseKey[]): Promise<{ queue: string; id: string }[]> {
  if (leases.length === 0) return [];
  return db.run(sql<{ queue: string; id: string }>`
    UPDATE ${db.table('tasks')} t
    SET state = 'pending',
        run_at = coalesce((SELECT min(p.run_at) FROM ${db.table('tasks')} p WHERE p.queue = t.queue AND p.state = 'pending'), now())
                 - interval '1 microsecond',
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = now()
    FROM ${leaseRows(db, leases)} h
    WHERE t.queue = h.queue AND t.id = h.id
    RETURNING t.queue, t.id`);
}

/** Stores a handler's result on its task. Returns false when the lease is gone. */
export async function writeResult(db: Db, lease: LeaseKey, json: string | null, bytes: Buffer | null): Promise<boolean> {
  const rows = await db.run(sql<{ id: string }>`
    UPDATE ${db.table('tasks')} SET result = ${json}::jsonb, result_bytes = ${bytes}, updated_at = now()
    WHERE queue = ${lease.queue} AND id = ${lease.id} AND lease_token = ${lease.token}::uuid AND state = 'active'
    RETURNING id`);
  return rows.length === 1;
}

/**
 * Inside a handler's transaction: locks the task's row if this lease still
 * holds it. While the lock is held no recoverer can take the task (they skip
 * locked rows), so the completion at the end of the transaction cannot miss.
 */
export async function lockLease(db: Db, trx: Transaction<any>, lease: LeaseKey): Promise<boolean> {
  const rows = await db.run(
    sql<{ id: string }>`
    SELECT id FROM ${db.table('tasks')}
    WHERE queue = ${lease.queue} AND id = ${lease.id} AND lease_token = ${lease.token}::uuid AND state = 'active'
    FOR UPDATE`,
    trx,
  );
  return rows.length === 1;
}
