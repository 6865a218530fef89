/**
 * The server registry and the processed/failed counters.
 */
import { sql } from 'kysely';
import type { Db } from './db.js';

export interface ServerRecord {
  id: string;
  host: string;
  pid: number;
  concurrency: number;
  queues: Record<string, number>;
  strictPriority: boolean;
  status: string;
}

/** Inserts or refreshes the server's row; it counts as gone once `ttlMs` passes without a refresh. */
export async function upsertServer(db: Db, s: ServerRecord, ttlMs: number): Promise<void> {
  await db.run(sql`
    INSERT INTO ${db.table('servers')} (id, host, pid, concurrency, queues, strict_priority, status, expires_at)
    VALUES (${s.id}, ${s.host}, ${s.pid}, ${s.concurrency}, ${JSON.stringify(s.queues)}::jsonb, ${s.strictPriority}, ${s.status},
            now() + ${ttlMs}::float8 * interval '1 millisecond')
    ON CONFLICT (id) DO UPDATE SET status = excluded.status, heartbeat_at = now(), expires_at = excluded.expires_at`);
}

/** Removes the server's row (at shutdown) and rows of servers that stopped refreshing. */
export async function deleteServer(db: Db, id: string): Promise<void> {
  await db.run(sql`DELETE FROM ${db.table('servers')} WHERE id = ${id} OR expires_at < now() - interval '1 minute'`);
}

export interface StatsDelta {
  queue: string;
  processed: number;
  failed: number;
}

/** Adds counts to today's (UTC, database clock) row of each queue and to the queues' totals. */
export async function addStats(db: Db, deltas: readonly StatsDelta[]): Promise<void> {
  if (deltas.length === 0) return;
  await db.run(sql`
    WITH d AS (
      SELECT * FROM unnest(${deltas.map((d) => d.queue)}::text[], ${deltas.map((d) => d.processed)}::bigint[], ${deltas.map((d) => d.failed)}::bigint[])
        AS d(queue, processed, failed)
    ),
    totals AS (
      UPDATE ${db.table('queues')} q SET processed_total = q.processed_total + d.processed, failed_total = q.failed_total + d.failed
      FROM d WHERE q.name = d.queue
    )
    INSERT INTO ${db.table('daily_stats')} AS s (queue, day, processed, failed)
    SELECT queue, (now() AT TIME ZONE 'UTC')::date, processed, failed FROM d
    ON CONFLICT (queue, day) DO UPDATE SET processed = s.processed + excluded.processed, failed = s.failed + excluded.failed`);
}

/** Deletes daily stats older than `days` days. */
export async function trimStats(db: Db, days: number): Promise<void> {
  await db.run(sql`DELETE FROM ${db.table('daily_stats')} WHERE day < (now() AT TIME ZONE 'UTC')::date - ${days}::int`);
}
