/**
 * The claim: one statement that takes pending tasks into this server's
 * leases, from each queue's share and above its claim cursor's floor
 * (server/cursor.ts), and returns each task's inputs with its new lease token.
 * Every later write about a claimed task is leases.ts's, fenced by that token.
 */
import { sql } from 'kysely';
import type { Db } from './db.js';
import type { TaskCore } from './rows.js';

/** A claimed task, as the processor needs it. */
export interface ClaimedRow extends TaskCore {
  seq: string;
  /** The task's position in its queue's pending order when claimed. */
  pending_seq: string;
  timeout_ms: number;
  /** ms from the claim (database clock) to the task's deadline; null without one. */
  deadline_in_ms: number | null;
  retention_ms: number;
  lease_token: string;
}

const ms = (n: number) => sql`(${n}::float8 * interval '1 millisecond')`;

/**
 * What a claim read besides its tasks, for the claim cursor (server/cursor.ts):
 * how far task_seq had drawn before the claim took its transaction id `xid`,
 * the oldest transaction still running when its snapshot was taken, and
 * whether any transaction older than the cursor's `olderThan` still held
 * task_seq (null when not asked).
 */
export interface ClaimMark {
  drawn: bigint;
  xid: bigint;
  xmin: bigint;
  drawersGone: boolean | null;
  /** Queues of the claim that were paused: not scanned. */
  paused: string[];
}

/** Where a claim starts: a floor per queue, and the transaction id the cursor waits on (server/cursor.ts). */
export interface ClaimStart {
  floors: readonly string[];
  olderThan: string | null;
}

/**
 * Claims up to `limit` pending tasks in one statement: from each queue its
 * share, then what the shares left from the queues in the given order,
 * skipping paused queues, each from above its floor (the claim cursor's; the
 * head is any number below every position). The LIMITs stop the scans as soon
 * as enough rows are locked, so no row is locked without being claimed.
 */
export async function claimFrom(
  db: Db,
  queues: readonly string[],
  start: ClaimStart,
  shares: readonly number[],
  limit: number,
  owner: string,
  leaseMs: number,
): Promise<{ mark: ClaimMark; rows: ClaimedRow[] }> {
  const result = await db.run(
    sql<ClaimedRow & { drawn: string; xid: string; xmin: string; drawers_gone: boolean | null; paused: string[] }>`
    WITH mark AS MATERIALIZED (
      -- A sequence that has handed out nothing yet has drawn nothing.
      SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END AS drawn FROM ${db.table('task_seq')}
    ),
    me AS MATERIALIZED (
      -- The transaction id is taken after the sequence was read (see server/cursor.ts).
      SELECT m.drawn, pg_current_xact_id() AS xid, pg_snapshot_xmin(pg_current_snapshot()) AS xmin FROM mark m
    ),
    -- Drawing a position locks task_seq until the transaction ends: when no holder of
    -- that lock in this database is older than olderThan, every position drawn before
    -- olderThan's claim is committed or gone. Unlike xmin, a long transaction elsewhere
    -- in the cluster does not hold this up. Live state, not the snapshot: a later
    -- claim's snapshot is the first that surely sees those commits.
    drawers AS MATERIALIZED (
      SELECT NOT EXISTS (
        SELECT 1 FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'relation' AND l.granted
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.relation = ${db.qualified('task_seq')}::regclass
          -- A prepared transaction has no backend; a holder without an id has written nothing.
          AND (a.pid IS NULL OR age(a.backend_xid) > age(${start.olderThan}::xid8::xid))
      ) AS gone
      WHERE ${start.olderThan}::xid8 IS NOT NULL
    ),
    q AS (
      SELECT u.name, u.floor, u.share, u.ord
      FROM unnest(${queues}::text[], ${start.floors}::bigint[], ${shares}::int[]) WITH ORDINALITY AS u(name, floor, share, ord)
      WHERE NOT EXISTS (SELECT 1 FROM ${db.table('queues')} p WHERE p.name = u.name AND p.paused)
    ),
    -- Each queue's share first (the weights' proportions within one claim)…
    shared AS (
      SELECT c.ctid FROM q CROSS JOIN LATERAL (
        SELECT s.ctid FROM ${db.table('task_states')} s
        WHERE s.queue = q.name AND s.state = 'pending' AND s.pending_seq > q.floor
          -- Referenced here so that the mark is taken before the first row is locked
          -- (a row lock assigns the transaction id).
          AND (SELECT xid FROM me) IS NOT NULL
        ORDER BY s.pending_seq
        LIMIT q.share FOR UPDATE SKIP LOCKED
      ) c
    ),
    -- …then what the shares left, from the queues in order, so no slot stays idle
    -- while a queue has tasks. The outer LIMIT stops the scans as soon as enough rows
    -- are locked. The queues' order is the weighted shuffle: without ORDER BY a hash
    -- anti-join may reorder them (unnest WITH ORDINALITY is already in order: no sort).
    more AS (
      SELECT m.ctid FROM q CROSS JOIN LATERAL (
        SELECT s.ctid FROM ${db.table('task_states')} s
        WHERE s.queue = q.name AND s.state = 'pending' AND s.pending_seq > q.floor
          AND s.ctid <> ALL(ARRAY(SELECT ctid FROM shared))
        ORDER BY s.pending_seq
        LIMIT ${limit} FOR UPDATE SKIP LOCKED
      ) m
      WHERE (SELECT count(*) FROM shared) < ${limit}
      ORDER BY q.ord
      LIMIT greatest(${limit} - (SELECT count(*) FROM shared), 0)
    ),
    c AS (SELECT ctid FROM shared UNION ALL SELECT ctid FROM more),
    -- Rows are found by key arrays (= ANY) and index probes, never by joining CTEs:
    -- their row estimates are guesses, and a join planned on a guess either hashes a
    -- whole table or rescans a CTE once per row. The locked rows are updated by ctid
    -- (a TID scan): nothing can move a row this statement holds locked, and a primary
    -- key descent per row was a quarter of the claim. (A pending row that another
    -- transaction rewrote after this statement's snapshot is locked in its new version,
    -- which this UPDATE cannot see: it stays pending for the next claim.)
    -- pending_seq stays on the active row (only pending rows are indexed by it), so
    -- the claim order can be returned.
    claimed AS (
      UPDATE ${db.table('task_states')} s
      SET state = 'active', lease_owner = ${owner}, lease_token = gen_random_uuid(),
          lease_expires_at = ${db.now()} + ${ms(leaseMs)}, started_at = ${db.now()}, run_at = NULL,
          cancel_requested = false, updated_at = ${db.now()}
      WHERE s.ctid = ANY(ARRAY(SELECT ctid FROM c))
      RETURNING s.seq, s.queue, s.pending_seq, s.retried, s.lease_token
    ),
    tasks AS (
      SELECT u.seq::text AS seq, u.pending_seq::text AS pending_seq, i.queue, i.id, i.type, i.payload, i.payload_bytes,
        i.headers, u.retried, i.max_retry,
        (extract(epoch FROM i.timeout) * 1000)::float8 AS timeout_ms,
        (extract(epoch FROM i.deadline - ${db.now()}) * 1000)::float8 AS deadline_in_ms,
        (extract(epoch FROM i.retention) * 1000)::float8 AS retention_ms,
        u.lease_token, array_position(${queues}::text[], u.queue) AS ord, u.pending_seq AS position
      FROM claimed u CROSS JOIN LATERAL (SELECT * FROM ${db.table('task_inputs')} i WHERE i.seq = u.seq) i
    )
    SELECT me.drawn::text AS drawn, me.xid::text AS xid, me.xmin::text AS xmin, (SELECT gone FROM drawers) AS drawers_gone,
      ARRAY(SELECT p.name FROM ${db.table('queues')} p WHERE p.paused AND p.name = ANY(${queues}::text[])) AS paused, t.*
    FROM me LEFT JOIN tasks t ON true
    ORDER BY t.ord, t.position`,
    undefined,
    'claim',
  );
  const first = result[0]!;
  const mark = { drawn: BigInt(first.drawn), xid: BigInt(first.xid), xmin: BigInt(first.xmin), drawersGone: first.drawers_gone, paused: first.paused };
  return { mark, rows: result.filter((r) => r.seq !== null) };
}

/** Below every position: a claim from the head of the queue. */
export const HEAD = String(-(2n ** 62n));

/** claimFrom() from the head of every queue, taking the queues strictly in order. */
export async function claim(db: Db, queues: readonly string[], limit: number, owner: string, leaseMs: number): Promise<ClaimedRow[]> {
  return (
    await claimFrom(
      db,
      queues,
      { floors: queues.map(() => HEAD), olderThan: null },
      queues.map((_, i) => (i === 0 ? limit : 0)),
      limit,
      owner,
      leaseMs,
    )
  ).rows;
}
