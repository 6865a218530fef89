/**
 * The server registry and the processed/failed counters.
 */
import { sql } from 'kysely';
import type { ServerInfo } from '../model/inspector-types.js';
import type { AnyTransaction, Db } from './db.js';
import { transaction } from './transaction.js';

/** What a server writes of itself: its ServerInfo but for what the database knows (start time, workers). */
export type ServerRecord = Omit<ServerInfo, 'startedAt' | 'activeWorkers'>;

/** Inserts or refreshes the server's row; it counts as gone once `ttlMs` passes without a refresh. */
export async function upsertServer(db: Db, s: ServerRecord, ttlMs: number): Promise<void> {
  await db.run(sql`
    INSERT INTO ${db.table('servers')} (id, host, pid, concurrency, queues, strict_priority, status, expires_at)
    VALUES (${s.id}, ${s.host}, ${s.pid}, ${s.concurrency}, ${JSON.stringify(s.queues)}::jsonb, ${s.strictPriority}, ${s.status},
            ${db.now()} + ${ttlMs}::float8 * interval '1 millisecond')
    ON CONFLICT (id) DO UPDATE SET status = excluded.status, heartbeat_at = ${db.now()}, expires_at = excluded.expires_at`);
}

/**
 * Makes the queues known (ensure_queues(), migration 0009): each gets its row
 * in queues, unpaused and without limits when new; a known one is left as it
 * is. A server registers the queues it serves; an admin call that configures a
 * queue creates it.
 */
export async function ensureQueues(db: Db, queues: readonly string[], trx?: AnyTransaction): Promise<void> {
  await db.run(sql`SELECT ${db.table('ensure_queues')}(${queues}::text[])`, trx);
}

/** Removes the server's row (at shutdown) and rows of servers that stopped refreshing. */
export async function deleteServer(db: Db, id: string): Promise<void> {
  await db.run(sql`DELETE FROM ${db.table('servers')} WHERE id = ${id} OR expires_at < ${db.now()} - interval '1 minute'`);
}

export interface UnservedQueue {
  queue: string;
  /** Pending tasks, counted up to the cap given. */
  pending: number;
  /** Every queue some running server serves, sorted (the same in every row). */
  served: string[];
}

/**
 * Queues that hold pending tasks and that no running server serves: servers
 * whose row is active and unexpired, plus `own` (the queues of a server whose
 * row may not be written yet). One row per such queue, by name; pending
 * tasks counted up to `cap` (the pending index makes each count cheap).
 */
export async function unservedQueues(db: Db, own: readonly string[], cap: number): Promise<UnservedQueue[]> {
  return db.run(sql<UnservedQueue>`
    WITH served AS (
      SELECT pg_catalog.jsonb_object_keys(s.queues) AS queue FROM ${db.table('servers')} s WHERE s.status = 'active' AND s.expires_at > ${db.now()}
      UNION
      SELECT pg_catalog.unnest(${own}::text[])
    )
    SELECT q.name AS queue,
           (SELECT pg_catalog.count(*) FROM (SELECT 1 FROM ${db.table('tasks')} t WHERE t.queue = q.name AND t.state = 'pending' LIMIT ${cap}) c)::int AS pending,
           (SELECT pg_catalog.array_agg(queue ORDER BY queue) FROM served) AS served
    FROM ${db.table('queues')} q
    WHERE q.name NOT IN (SELECT queue FROM served)
      AND EXISTS (SELECT 1 FROM ${db.table('tasks')} t WHERE t.queue = q.name AND t.state = 'pending')
    ORDER BY q.name`);
}

export interface StatsDelta {
  queue: string;
  processed: number;
  failed: number;
}

/**
 * Adds counts to today's (UTC, database clock) row of each queue and to the
 * queues' totals, in one transaction. Every server flushes its own queues in
 * its own order, so rows are locked in a fixed order instead: the queues rows
 * first, by name (as deleteQueue does, then that queue's stats), then the
 * daily_stats rows, by name. Two flushes over the same queues then wait for
 * each other instead of deadlocking, which they did when each locked rows in
 * the order its counts happened to arrive (fault test F17).
 */
export async function addStats(db: Db, deltas: readonly StatsDelta[]): Promise<void> {
  if (deltas.length === 0) return;
  const sorted = [...deltas].sort((a, b) => (a.queue < b.queue ? -1 : a.queue > b.queue ? 1 : 0));
  const d = sql`ROWS FROM (pg_catalog.unnest(${sorted.map((x) => x.queue)}::text[]), pg_catalog.unnest(${sorted.map((x) => x.processed)}::bigint[]), pg_catalog.unnest(${sorted.map((x) => x.failed)}::bigint[]))
        WITH ORDINALITY AS d(queue, processed, failed, ord)`;
  await transaction(db, async (trx) => {
    await db.run(
      sql`
      UPDATE ${db.table('queues')} q SET processed_total = q.processed_total + d.processed, failed_total = q.failed_total + d.failed
      FROM ${d}, (SELECT name FROM ${db.table('queues')} WHERE name = ANY(${sorted.map((x) => x.queue)}::text[]) ORDER BY name FOR UPDATE) l
      WHERE q.name = d.queue AND l.name = d.queue`,
      trx,
    );
    await db.run(
      sql`
      INSERT INTO ${db.table('daily_stats')} AS s (queue, day, processed, failed)
      SELECT queue, (${db.now()} AT TIME ZONE 'UTC')::date, processed, failed FROM ${d} ORDER BY d.ord
      ON CONFLICT (queue, day) DO UPDATE SET processed = s.processed + excluded.processed, failed = s.failed + excluded.failed`,
      trx,
    );
  });
}

/** Deletes daily stats older than `days` days. */
export async function trimStats(db: Db, days: number): Promise<void> {
  await db.run(sql`DELETE FROM ${db.table('daily_stats')} WHERE day < (${db.now()} AT TIME ZONE 'UTC')::date - ${days}::int`);
}
