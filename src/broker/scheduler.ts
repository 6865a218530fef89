/**
 * Statements of the Scheduler: the database clock, each entry's last tick,
 * the one transaction that turns a tick into a task (exactly once across any
 * number of schedulers), and the scheduler_entries registry.
 *
 * Exactly once: scheduler_events has the primary key (entry_id, tick_at). A
 * scheduler that finds a tick due inserts that row and enqueues the task in
 * one transaction; every other scheduler's insert of the same row waits for
 * that transaction and then does nothing (ON CONFLICT DO NOTHING), or, if it
 * rolled back, takes its place. No leader, no lease, no advisory lock.
 */
import { sql } from 'kysely';
import { DuplicateTaskError, TaskIdConflictError } from '../model/errors.js';
import type { TaskRecord } from '../model/task.js';
import type { Db } from './db.js';
import { transaction } from './transaction.js';
import { insertTasks } from './enqueue.js';

/** Events kept per entry (asynq keeps about 1,000); older ones are deleted as new ones come. */
export const HISTORY_LIMIT = 1000;

/** The database's clock, now (clock_timestamp, not the transaction's start). */
export async function databaseNow(db: Db): Promise<Date> {
  const rows = await db.run(sql<{ now: Date }>`SELECT ${db.clockTimestamp()} AS now`);
  return (rows[0] as { now: Date }).now;
}

/**
 * The database's clock, and the latest recorded tick of each of `entryIds`
 * that has any (entries without history are absent from the map).
 */
export async function lastTicks(db: Db, entryIds: string[]): Promise<{ now: Date; last: Map<string, Date> }> {
  const rows = await db.run(sql<{ now: Date; entry_id: string | null; tick_at: Date | null }>`
    SELECT ${db.clockTimestamp()} AS now, l.entry_id, l.tick_at
    FROM (SELECT 1) one
    LEFT JOIN LATERAL (
      SELECT i.id AS entry_id, (SELECT pg_catalog.max(tick_at) FROM ${db.table('scheduler_events')} e WHERE e.entry_id = i.id) AS tick_at
      FROM pg_catalog.unnest(${entryIds}::text[]) AS i(id)
    ) l ON true`);
  const last = new Map<string, Date>();
  for (const r of rows) if (r.entry_id !== null && r.tick_at !== null) last.set(r.entry_id, r.tick_at);
  return { now: (rows[0] as { now: Date }).now, last };
}

export type TickOutcome =
  /** This scheduler recorded the tick and enqueued the task. */
  | { kind: 'enqueued'; taskId: string }
  /** Another scheduler had already recorded the tick: nothing done. */
  | { kind: 'taken' }
  /** The tick is later than the database's now(): nothing done (the host clock ran ahead). */
  | { kind: 'not-due' }
  /**
   * The tick is recorded, but the task conflicted with an existing one (its
   * unique lock is held, or its taskId exists): no task was added, and the
   * event names the task that holds the lock or the id.
   */
  | { kind: 'conflict'; error: DuplicateTaskError | TaskIdConflictError; taskId: string };

/**
 * One tick of one entry, in one transaction: records (entry_id, tick_at) in
 * scheduler_events unless it is there already or the tick is not yet due on
 * the database clock, and only then enqueues `record` (through insertTasks,
 * in the same transaction), moves the entry's prev/next and trims its
 * history to HISTORY_LIMIT events. A unique-lock or task-id conflict is
 * rolled back to a savepoint, so the tick stays recorded (it is not retried
 * by this or any other scheduler) and the caller is told.
 */
export async function enqueueTick(db: Db, p: { entryId: string; tickAt: Date; nextRunAt: Date | null; record: TaskRecord }): Promise<TickOutcome> {
  return transaction(db, async (trx) => {
    const [r] = await db.run(
      sql<{ inserted: boolean; due: boolean }>`
      WITH ev AS (
        INSERT INTO ${db.table('scheduler_events')} (entry_id, tick_at, task_id)
        SELECT ${p.entryId}, ${p.tickAt}::timestamptz, ${p.record.id} WHERE ${p.tickAt}::timestamptz <= ${db.now()}
        ON CONFLICT (entry_id, tick_at) DO NOTHING
        RETURNING 1
      ),
      moved AS (
        UPDATE ${db.table('scheduler_entries')}
        SET prev_run_at = greatest(prev_run_at, ${p.tickAt}::timestamptz), next_run_at = ${p.nextRunAt}::timestamptz
        WHERE id = ${p.entryId} AND EXISTS (SELECT 1 FROM ev)
      ),
      trimmed AS (
        -- Every part of this statement sees the table as it was before the insert,
        -- so keeping the newest LIMIT - 1 older events plus the new one keeps LIMIT.
        DELETE FROM ${db.table('scheduler_events')}
        WHERE entry_id = ${p.entryId} AND EXISTS (SELECT 1 FROM ev) AND tick_at < (
          SELECT tick_at FROM ${db.table('scheduler_events')} WHERE entry_id = ${p.entryId}
          ORDER BY tick_at DESC OFFSET ${HISTORY_LIMIT - 2} LIMIT 1)
      )
      SELECT EXISTS (SELECT 1 FROM ev) AS inserted, ${p.tickAt}::timestamptz <= ${db.now()} AS due`,
      trx,
    );
    if (!r?.due) return { kind: 'not-due' };
    if (!r.inserted) return { kind: 'taken' };
    await db.run(sql`SAVEPOINT pgasynq_tick`, trx);
    try {
      await insertTasks(db, [p.record], trx);
      return { kind: 'enqueued', taskId: p.record.id };
    } catch (err) {
      if (!(err instanceof DuplicateTaskError) && !(err instanceof TaskIdConflictError)) throw err;
      await db.run(sql`ROLLBACK TO SAVEPOINT pgasynq_tick`, trx);
      if (err instanceof TaskIdConflictError) return { kind: 'conflict', error: err, taskId: p.record.id };
      // The event points at the task that holds the lock: that task covers this tick.
      const [holder] = await db.run(
        sql<{ task_id: string }>`
        UPDATE ${db.table('scheduler_events')} e
        SET task_id = coalesce((SELECT l.task_id FROM ${db.table('unique_locks')} l
                                WHERE l.queue = ${p.record.queue} AND l.key = ${p.record.uniqueKey}), e.task_id)
        WHERE e.entry_id = ${p.entryId} AND e.tick_at = ${p.tickAt}::timestamptz
        RETURNING e.task_id`,
        trx,
      );
      return { kind: 'conflict', error: err, taskId: holder?.task_id ?? p.record.id };
    }
  });
}

/** What the registry holds about one entry. */
export interface EntryRow {
  id: string;
  spec: string;
  taskType: string;
  payload: { json: string | null; bytes: Buffer | null };
  /** The enqueue options (the task's, overridden by register's), as JSON. */
  options: string;
  location: string;
  nextRunAt: Date | null;
}

/**
 * Registers or refreshes `entries` for `schedulerId` until now() + ttlMs.
 * prev_run_at is the entry's latest recorded tick. Rows are written in id
 * order, so two schedulers refreshing the same entries never deadlock.
 */
export async function upsertEntries(db: Db, schedulerId: string, entries: EntryRow[], ttlMs: number): Promise<void> {
  if (entries.length === 0) return;
  const sorted = [...entries].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  const col = <T>(f: (e: EntryRow) => T): T[] => sorted.map(f);
  await db.run(sql`
    INSERT INTO ${db.table('scheduler_entries')} AS s
      (id, spec, task_type, payload, payload_bytes, options, location, scheduler_id, next_run_at, prev_run_at, heartbeat_at, expires_at)
    SELECT i.id, i.spec, i.task_type, i.payload, i.payload_bytes, i.options, i.location, ${schedulerId}, i.next_run_at,
           (SELECT pg_catalog.max(tick_at) FROM ${db.table('scheduler_events')} e WHERE e.entry_id = i.id),
           ${db.now()}, ${db.now()} + ${ttlMs}::float8 * interval '1 millisecond'
    FROM ROWS FROM (pg_catalog.unnest(${col((e) => e.id)}::text[]), pg_catalog.unnest(${col((e) => e.spec)}::text[]), pg_catalog.unnest(${col((e) => e.taskType)}::text[]), pg_catalog.unnest(${col((e) => e.payload.json)}::jsonb[]), pg_catalog.unnest(${col((e) => e.payload.bytes)}::bytea[]), pg_catalog.unnest(${col((e) => e.options)}::jsonb[]), pg_catalog.unnest(${col((e) => e.location)}::text[]), pg_catalog.unnest(${col((e) => e.nextRunAt)}::timestamptz[]))
      WITH ORDINALITY AS i(id, spec, task_type, payload, payload_bytes, options, location, next_run_at, ord)
    ORDER BY i.ord
    ON CONFLICT (id) DO UPDATE SET
      spec = excluded.spec, task_type = excluded.task_type, payload = excluded.payload, payload_bytes = excluded.payload_bytes,
      options = excluded.options, location = excluded.location, scheduler_id = excluded.scheduler_id,
      next_run_at = excluded.next_run_at,
      prev_run_at = greatest(s.prev_run_at, excluded.prev_run_at),
      heartbeat_at = excluded.heartbeat_at, expires_at = greatest(s.expires_at, excluded.expires_at)`);
}

/**
 * Removes `entryIds` from the registry where `schedulerId` was the last to
 * refresh them: an entry another scheduler still runs stays (it refreshes it).
 * History is kept. Returns how many rows went.
 */
export async function deleteEntries(db: Db, schedulerId: string, entryIds: string[]): Promise<number> {
  if (entryIds.length === 0) return 0;
  const rows = await db.run(sql<{ n: number }>`
    WITH d AS (
      DELETE FROM ${db.table('scheduler_entries')} WHERE id = ANY(${entryIds}::text[]) AND scheduler_id = ${schedulerId} RETURNING 1
    ) SELECT pg_catalog.count(*)::int AS n FROM d`);
  return rows[0]?.n ?? 0;
}

/** Removes registry rows no scheduler has refreshed before their expiry (their history stays). */
export async function deleteExpiredEntries(db: Db): Promise<number> {
  const rows = await db.run(sql<{ n: number }>`
    WITH d AS (
      DELETE FROM ${db.table('scheduler_entries')} s USING (
        SELECT id FROM ${db.table('scheduler_entries')} WHERE expires_at < ${db.now()} FOR UPDATE SKIP LOCKED
      ) x WHERE s.id = x.id RETURNING 1
    ) SELECT pg_catalog.count(*)::int AS n FROM d`);
  return rows[0]?.n ?? 0;
}
