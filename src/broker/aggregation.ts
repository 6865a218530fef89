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
 * Closing is read, aggregate, commit: the members of a closing group are
 * read (groupToClose), the user's aggregator runs in no transaction, and one
 * transaction then deletes exactly those members and enqueues the aggregate
 * (commitGroup). If any member was moved or deleted meanwhile (an Inspector
 * action, another server that closed the group first), nothing commits. So a
 * crash can neither lose the members nor produce the aggregate twice (asynq's
 * aggregation sets could do the latter), and no row stays locked while user
 * code runs.
 */
import { sql, type RawBuilder } from 'kysely';
import type { TaskRecord } from '../model/task.js';
import type { Db } from './db.js';
import { transaction } from './transaction.js';
import { insertTasks } from './enqueue.js';
import { compareSeq } from './rows.js';

/** When groups close; durations in ms, 0 for "no limit" (maxDelayMs, maxSize). */
export interface GroupRules {
  gracePeriodMs: number;
  maxDelayMs: number;
  maxSize: number;
}

/** A member as the aggregator's callback gets it. */
export interface MemberRow {
  seq: string;
  id: string;
  type: string;
  payload: unknown;
  payload_bytes: Buffer | null;
  headers: Record<string, string>;
}

/** True when a group of `n` members, oldest and newest arrivals as given, is closed by `rules`. */
function closes(db: Db, n: RawBuilder<unknown>, oldest: RawBuilder<unknown>, newest: RawBuilder<unknown>, r: GroupRules): RawBuilder<boolean> {
  return sql<boolean>`(
    ${n} > 0 AND (
      (${r.maxSize}::int > 0 AND ${n} >= ${r.maxSize}::int)
      OR (${r.maxDelayMs}::float8 > 0 AND ${oldest} <= ${db.now()} - ${r.maxDelayMs}::float8 * interval '1 millisecond')
      OR ${newest} <= ${db.now()} - ${r.gracePeriodMs}::float8 * interval '1 millisecond'))`;
}

/**
 * The groups of `queues` that close now, and the ms until the next of the
 * others will (by grace period or max delay; null when no group waits).
 * Read from task_states alone (the narrow rows the aggregating index covers),
 * oldest group (by its first member's seq) first.
 */
export async function readyGroups(
  db: Db,
  queues: string[],
  rules: GroupRules,
): Promise<{ ready: { queue: string; group: string }[]; nextInMs: number | null }> {
  const rows = await db.run(sql<{ queue: string; group_key: string; ready: boolean; due_in_ms: number | null }>`
    SELECT queue, group_key,
           ${closes(db, sql`pg_catalog.count(*)`, sql`pg_catalog.min(updated_at)`, sql`pg_catalog.max(updated_at)`, rules)} AS ready,
           (extract(epoch FROM least(
              pg_catalog.max(updated_at) + ${rules.gracePeriodMs}::float8 * interval '1 millisecond',
              CASE WHEN ${rules.maxDelayMs}::float8 > 0 THEN pg_catalog.min(updated_at) + ${rules.maxDelayMs}::float8 * interval '1 millisecond' END
            ) - ${db.now()}) * 1000)::float8 AS due_in_ms
    FROM ${db.table('task_states')}
    WHERE state = 'aggregating' AND queue = ANY(${queues}::text[])
    GROUP BY queue, group_key
    ORDER BY pg_catalog.min(seq)`);
  const ready = rows.filter((r) => r.ready).map((r) => ({ queue: r.queue, group: r.group_key }));
  const waiting = rows.filter((r) => !r.ready && r.due_in_ms !== null).map((r) => r.due_in_ms as number);
  return { ready, nextInMs: waiting.length === 0 ? null : Math.max(0, Math.min(...waiting)) };
}

/**
 * The members of the group that closes now by `rules`, in enqueue order (up
 * to maxSize); none when it does not close. A plain read: commitGroup()
 * checks that they are all still there.
 *
 * No join, so no plan that rests on a row estimate: the group's size and
 * arrivals are counted once (a MATERIALIZED CTE: inlined, it was rescanned for
 * every member when the planner, on stale statistics, took the group for one
 * row: 4.5 s for 2,000 members, hours for 100,000), and the members' inputs
 * are found by their seqs, one primary-key probe each.
 */
export async function groupToClose(db: Db, queue: string, group: string, rules: GroupRules): Promise<MemberRow[]> {
  const members = sql`s.state = 'aggregating' AND s.queue = ${queue} AND s.group_key = ${group}`;
  return db.run(sql<MemberRow>`
    WITH g AS MATERIALIZED (
      SELECT pg_catalog.count(*) AS n, pg_catalog.min(s.updated_at) AS oldest, pg_catalog.max(s.updated_at) AS newest FROM ${db.table('task_states')} s WHERE ${members}
    )
    SELECT i.seq::text AS seq, i.id, i.type, i.payload, i.payload_bytes, i.headers
    FROM ${db.table('task_inputs')} i
    WHERE i.seq = ANY(ARRAY(
      SELECT s.seq FROM ${db.table('task_states')} s
      WHERE ${members} AND (SELECT ${closes(db, sql`g.n`, sql`g.oldest`, sql`g.newest`, rules)} FROM g)))
    ORDER BY i.enqueued_at, i.seq
    LIMIT ${rules.maxSize > 0 ? rules.maxSize : null}`);
}

/**
 * In one transaction: deletes the members (releasing their unique locks) and
 * enqueues `aggregate`, only if every member is still aggregating in the
 * group. True when it committed; false (nothing written) when a member was
 * moved, deleted or taken by another server's commitGroup first, whose row
 * locks make this one wait and then find the rows gone.
 *
 * The members are deleted from the tables by their seqs (commit_group(),
 * migration 0010): through the view, each member was a trigger call of three
 * statements, and the view's join was planned on the estimate of the group's
 * size (one row, on stale statistics), which rescanned the queue's inputs
 * once per member.
 */
export async function commitGroup(db: Db, queue: string, group: string, members: readonly MemberRow[], aggregate: TaskRecord): Promise<boolean> {
  const seqs = members.map((m) => m.seq).sort(compareSeq);
  try {
    await transaction(db, async (trx) => {
      const rows = await db.run(sql<{ n: number }>`SELECT ${db.table('commit_group')}(${queue}::text, ${group}::text, ${seqs}::bigint[]) AS n`, trx);
      if (rows[0]?.n !== members.length) throw new GroupChanged();
      await insertTasks(db, [aggregate], trx);
    });
    return true;
  } catch (err) {
    if (err instanceof GroupChanged) return false;
    throw err;
  }
}

/** Rolls commitGroup's transaction back: the group is no longer what the aggregator was given. */
class GroupChanged extends Error {}

/** The owner's functions (migration 0010) the statements of this file call, by signature: broker/roles.ts grants them to the worker. */
export const AGGREGATION_FUNCTIONS: readonly string[] = ['commit_group(text, text, bigint[])'];
