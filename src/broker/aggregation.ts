/**
 * Statements of the aggregator (task groups). A group is the aggregating
 * tasks of one (queue, group_key). It closes, as in asynq, when
 *
 *   - maxSize > 0 and at least maxSize members wait (the oldest maxSize go),
 *   - maxDelay > 0 and the oldest member has waited maxDelay, or
 *   - the newest member arrived gracePeriod ago (nothing came since),
 *
 * all on the database clock. A member "arrived" when it became aggregating:
 * at enqueue, or when the forwarder moved it there once due (a scheduled
 * task with a group), which is the row's updated_at; members are handed over
 * in enqueue order (enqueued_at, then seq).
 *
 * Closing is one transaction: the members are locked, the aggregate task is
 * enqueued and the members deleted together, so a crash can neither lose the
 * members nor produce the aggregate twice (asynq's aggregation sets could do
 * the latter).
 */
import { sql, type RawBuilder } from 'kysely';
import type { TaskRecord } from '../task.js';
import { transaction, type Db } from './db.js';
import { insertTasks } from './enqueue.js';

/** When groups close; durations in ms, 0 for "no limit" (maxDelayMs, maxSize). */
export interface GroupRules {
  gracePeriodMs: number;
  maxDelayMs: number;
  maxSize: number;
}

/** A member as the aggregator's callback gets it. */
export interface MemberRow {
  id: string;
  type: string;
  payload: unknown;
  payload_bytes: Buffer | null;
  headers: Record<string, string>;
}

/** True when a group of `n` members, oldest and newest arrivals as given, is closed by `rules`. */
function closes(n: RawBuilder<unknown>, oldest: RawBuilder<unknown>, newest: RawBuilder<unknown>, r: GroupRules): RawBuilder<boolean> {
  return sql<boolean>`(
    ${n} > 0 AND (
      (${r.maxSize}::int > 0 AND ${n} >= ${r.maxSize}::int)
      OR (${r.maxDelayMs}::float8 > 0 AND ${oldest} <= now() - ${r.maxDelayMs}::float8 * interval '1 millisecond')
      OR ${newest} <= now() - ${r.gracePeriodMs}::float8 * interval '1 millisecond'))`;
}

/**
 * The groups of `queues` that close now, and the ms until the next of the
 * others will (by grace period or max delay; null when no group waits).
 */
export async function readyGroups(db: Db, queues: string[], rules: GroupRules): Promise<{ ready: { queue: string; group: string }[]; nextInMs: number | null }> {
  const rows = await db.run(sql<{ queue: string; group_key: string; ready: boolean; due_in_ms: number | null }>`
    SELECT queue, group_key,
           ${closes(sql`count(*)`, sql`min(updated_at)`, sql`max(updated_at)`, rules)} AS ready,
           (extract(epoch FROM least(
              max(updated_at) + ${rules.gracePeriodMs}::float8 * interval '1 millisecond',
              CASE WHEN ${rules.maxDelayMs}::float8 > 0 THEN min(updated_at) + ${rules.maxDelayMs}::float8 * interval '1 millisecond' END
            ) - now()) * 1000)::float8 AS due_in_ms
    FROM ${db.table('tasks')}
    WHERE state = 'aggregating' AND queue = ANY(${queues}::text[])
    GROUP BY queue, group_key
    ORDER BY min(enqueued_at)`);
  const ready = rows.filter((r) => r.ready).map((r) => ({ queue: r.queue, group: r.group_key }));
  const waiting = rows.filter((r) => !r.ready && r.due_in_ms !== null).map((r) => r.due_in_ms as number);
  return { ready, nextInMs: waiting.length === 0 ? null : Math.max(0, Math.min(...waiting)) };
}

/**
 * Closes one group, in one transaction, if it still closes by `rules`:
 * takes a transaction-scoped advisory lock on the group (another server
 * closing it at the same moment skips it), locks its members in enqueue
 * order (up to maxSize), hands them to `aggregate`, enqueues the task it
 * returns, and deletes the members and releases their unique locks. If
 * `aggregate` or the enqueue throws, everything is rolled back and the
 * members stay aggregating. Returns how many members were aggregated (0:
 * the group did not close, or was being closed elsewhere).
 */
export async function closeGroup(
  db: Db,
  queue: string,
  group: string,
  rules: GroupRules,
  aggregate: (members: MemberRow[]) => Promise<TaskRecord>,
): Promise<number> {
  return transaction(db, async (trx) => {
    const [lock] = await db.run(
      sql<{ locked: boolean }>`SELECT pg_try_advisory_xact_lock(hashtext(${`pgasynq:aggregate:${db.schema}`}), hashtext(${JSON.stringify([queue, group])})) AS locked`,
      trx,
    );
    if (!lock?.locked) return 0;
    const members = await db.run(
      sql<MemberRow>`
      WITH g AS (
        SELECT count(*) AS n, min(updated_at) AS oldest, max(updated_at) AS newest FROM ${db.table('tasks')}
        WHERE state = 'aggregating' AND queue = ${queue} AND group_key = ${group}
      )
      SELECT t.id, t.type, t.payload, t.payload_bytes, t.headers
      FROM ${db.table('tasks')} t, g
      WHERE t.state = 'aggregating' AND t.queue = ${queue} AND t.group_key = ${group}
        AND ${closes(sql`g.n`, sql`g.oldest`, sql`g.newest`, rules)}
      ORDER BY t.enqueued_at, t.seq
      LIMIT ${rules.maxSize > 0 ? rules.maxSize : null}
      FOR UPDATE OF t SKIP LOCKED`,
      trx,
    );
    if (members.length === 0) return 0;
    const record = await aggregate(members);
    await db.run(
      sql`
      WITH d AS (
        DELETE FROM ${db.table('tasks')} t
        WHERE t.queue = ${queue} AND t.id = ANY(${members.map((m) => m.id)}::text[]) AND t.state = 'aggregating'
        RETURNING t.queue, t.id, t.unique_key
      )
      DELETE FROM ${db.table('unique_locks')} l USING d
      WHERE l.queue = d.queue AND l.key = d.unique_key AND l.task_id = d.id`,
      trx,
    );
    await insertTasks(db, [record], trx);
    return members.length;
  });
}
