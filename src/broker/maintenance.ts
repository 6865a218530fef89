/**
 * Statements of the maintenance components: the forwarder (due scheduled and
 * retry tasks become pending), the recoverer (expired leases) and the janitor
 * (retention, unique locks, archive bounds). All of them skip locked rows, so
 * every server may run them at once and none waits on another.
 */
import { sql } from 'kysely';
import { transaction, type Db } from './db.js';
import type { TaskCore } from './rows.js';

/**
 * Makes up to `limit` due scheduled and retry tasks pending (or aggregating,
 * for a grouped task) and notifies their queues. Returns how many moved.
 */
export async function forwardDue(db: Db, limit: number): Promise<number> {
  const rows = await db.run(sql<{ n: number }>`
    WITH moved AS (
      UPDATE ${db.table('task_states')} s
      SET state = CASE WHEN s.group_key IS NULL THEN 'pending' ELSE 'aggregating' END,
          run_at = CASE WHEN s.group_key IS NULL THEN now() END,
          pending_seq = CASE WHEN s.group_key IS NULL THEN d.position END, updated_at = now()
      FROM (
        -- Positions drawn after the sort: tasks due first go first.
        SELECT x.seq, nextval(${db.qualified('task_seq')}) AS position FROM (
          SELECT seq FROM ${db.table('task_states')}
          WHERE state IN ('scheduled', 'retry') AND run_at <= now()
          ORDER BY run_at LIMIT ${limit} FOR UPDATE SKIP LOCKED
        ) x
      ) d
      WHERE s.seq = d.seq
      RETURNING s.queue, s.state
    ),
    notified AS (
      SELECT pg_notify(${db.channels.tasks}, queue) FROM (SELECT DISTINCT queue FROM moved WHERE state = 'pending') q
    )
    SELECT count(*)::int AS n FROM moved WHERE (SELECT count(*) FROM notified) >= 0`, undefined, 'forward');
  return rows[0]?.n ?? 0;
}

/** Milliseconds until the next scheduled or retry task is due (≤ 0: due now); null when none waits. */
export async function nextDueIn(db: Db): Promise<number | null> {
  const rows = await db.run(sql<{ ms: number | null }>`
    SELECT (extract(epoch FROM min(run_at) - now()) * 1000)::float8 AS ms
    FROM ${db.table('task_states')} WHERE state IN ('scheduled', 'retry')`, undefined, 'next_due');
  return rows[0]?.ms ?? null;
}

/** An active task whose lease expired past the cutoff, as the recoverer needs it. */
export interface ExpiredLease extends TaskCore {
  seq: string;
  lease_owner: string;
  /** The lease ran out impossibly far in the future (R8): a clock or data problem, not a dead worker. */
  implausible: boolean;
}

/**
 * Recovers up to `limit` active tasks whose lease expired more than `cutoffMs`
 * ago (or whose lease is impossibly far in the future: clock abuse or corrupt
 * data). `decide` says, for each, whether it is archived and else after how
 * long it is retried. Rows are locked with SKIP LOCKED in one short transaction,
 * so concurrent recoverers never take the same task.
 */
export async function recoverExpired(
  db: Db,
  opts: { cutoffMs: number; leaseMs: number; limit: number },
  decide: (task: ExpiredLease) => { archive: boolean; delayMs: number },
): Promise<{ retried: number; archived: number }> {
  return transaction(db, async (trx) => {
    const expired = await db.run(
      sql<ExpiredLease>`
      SELECT s.seq::text AS seq, i.queue, i.id, i.type, i.payload, i.payload_bytes, i.headers, s.retried, i.max_retry, s.lease_owner,
             s.lease_expires_at > now() + ${opts.leaseMs}::float8 * interval '1 millisecond' + interval '1 minute' AS implausible
      FROM ${db.table('task_states')} s JOIN ${db.table('task_inputs')} i ON i.seq = s.seq
      WHERE s.state = 'active' AND s.lease_owner IS NOT NULL -- always true; lets task_states_active_idx serve
        AND (s.lease_expires_at < now() - ${opts.cutoffMs}::float8 * interval '1 millisecond'
             OR s.lease_expires_at > now() + ${opts.leaseMs}::float8 * interval '1 millisecond' + interval '1 minute')
      ORDER BY s.seq LIMIT ${opts.limit} FOR UPDATE OF s SKIP LOCKED`,
      trx,
    );
    if (expired.length === 0) return { retried: 0, archived: 0 };
    const decisions = expired.map(decide);
    await db.run(
      sql`
      UPDATE ${db.table('task_states')} s
      SET state = CASE WHEN h.archive THEN 'archived' ELSE 'retry' END,
          retried = s.retried + CASE WHEN h.archive THEN 0 ELSE 1 END,
          run_at = now() + CASE WHEN h.archive THEN interval '0' ELSE h.delay_ms * interval '1 millisecond' END,
          error_msg = 'task lease expired', last_failed_at = now(),
          lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = now()
      FROM unnest(${expired.map((e) => e.seq)}::bigint[],
                  ${decisions.map((d) => d.archive)}::bool[], ${decisions.map((d) => d.delayMs)}::float8[])
        AS h(seq, archive, delay_ms)
      WHERE s.seq = h.seq AND s.state = 'active'`,
      trx,
    );
    const archived = decisions.filter((d) => d.archive).length;
    return { retried: decisions.length - archived, archived };
  });
}

/** Deletes up to `limit` completed tasks whose retention has ended. */
export async function deleteExpiredCompleted(db: Db, limit: number): Promise<number> {
  const rows = await db.run(sql<{ n: number }>`
    WITH d AS (
      DELETE FROM ${db.table('task_states')} s USING (
        SELECT seq FROM ${db.table('task_states')} WHERE state = 'completed' AND run_at <= now()
        ORDER BY run_at LIMIT ${limit} FOR UPDATE SKIP LOCKED
      ) x WHERE s.seq = x.seq RETURNING s.seq
    ),
    inputs AS (DELETE FROM ${db.table('task_inputs')} i USING d WHERE i.seq = d.seq)
    SELECT count(*)::int AS n FROM d`);
  return rows[0]?.n ?? 0;
}

/** Deletes up to `limit` unique locks past their TTL. */
export async function deleteExpiredLocks(db: Db, limit: number): Promise<number> {
  const rows = await db.run(sql<{ n: number }>`
    WITH d AS (
      DELETE FROM ${db.table('unique_locks')} l USING (
        SELECT queue, key FROM ${db.table('unique_locks')} WHERE expires_at <= now()
        LIMIT ${limit} FOR UPDATE SKIP LOCKED
      ) x WHERE l.queue = x.queue AND l.key = x.key RETURNING 1
    ) SELECT count(*)::int AS n FROM d`);
  return rows[0]?.n ?? 0;
}

/**
 * Trims each queue's archive as asynq does: archived tasks older than
 * `maxAgeMs` and all but the newest `maxSize` go, up to `limit` rows per call.
 */
export async function trimArchive(db: Db, maxSize: number, maxAgeMs: number, limit: number): Promise<number> {
  const rows = await db.run(sql<{ n: number }>`
    WITH doomed AS (
      SELECT a.seq FROM ${db.table('queues')} q CROSS JOIN LATERAL (
        SELECT s.seq FROM ${db.table('task_states')} s
        WHERE s.queue = q.name AND s.state = 'archived'
        ORDER BY s.run_at DESC OFFSET ${maxSize}
      ) a
      UNION
      SELECT seq FROM ${db.table('task_states')}
      WHERE state = 'archived' AND run_at < now() - ${maxAgeMs}::float8 * interval '1 millisecond'
    ),
    d AS (
      DELETE FROM ${db.table('task_states')} s USING (
        SELECT s.seq FROM ${db.table('task_states')} s JOIN doomed USING (seq)
        WHERE s.state = 'archived' LIMIT ${limit} FOR UPDATE OF s SKIP LOCKED
      ) x WHERE s.seq = x.seq RETURNING s.seq
    ),
    inputs AS (DELETE FROM ${db.table('task_inputs')} i USING d WHERE i.seq = d.seq)
    SELECT count(*)::int AS n FROM d`);
  return rows[0]?.n ?? 0;
}
