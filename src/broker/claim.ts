/**
 * The claim: one statement that takes pending tasks into this server's
 * leases, from each queue's share and above its claim cursor's floor
 * (server/cursor.ts), and returns each task's inputs with its new lease token.
 * Every later write about a claimed task is leases.ts's, fenced by that token.
 */
import { sql, type RawBuilder } from 'kysely';
import type { Db } from './db.js';
import type { TaskCore } from './rows.js';

/** A claimed task, as the processor needs it. */
export interface ClaimedRow extends TaskCore {
  seq: string;
  /** The task's position in its queue's pending order when claimed. */
  pending_seq: string;
  priority: number;
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
  /** Queues of the claim with limits, not paused: not scanned, they are claimLimited()'s. */
  limited: string[];
}

/** A priority band of a queue (its tasks of one priority) and the floor its claims start above. */
export interface Band {
  queue: string;
  priority: number;
  floor: string;
}

/**
 * Where a claim starts: the bands the cursor knows, with their floors, and
 * the transaction id the cursor waits on (server/cursor.ts). A band it does
 * not know yet is found by the claim and scanned from the head.
 */
export interface ClaimStart {
  bands: readonly Band[];
  olderThan: string | null;
}

/** Beyond every priority (−100…100): the ends of the gaps between known bands. */
const ABOVE = 101;
const BELOW = -101;

/**
 * Claims up to `limit` pending tasks in one statement: from each queue its
 * share, then what the shares left from the queues in the given order,
 * skipping paused queues and queues with limits (claimLimited's). Within a
 * queue, higher priority first, FIFO within a priority: each band of one
 * priority is scanned from above its floor (the claim cursor's; the head is
 * any number below every position). The bands the cursor does not know yet
 * are found first, by probing the gaps between the ones it knows: a probe
 * that finds nothing ends at the gap's end, without stepping over the
 * entries the floors skip. The LIMITs stop the scans as soon as enough rows
 * are locked, so no row is locked without being claimed.
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
  const ordOf = new Map(queues.map((q, i) => [q, i + 1]));
  const known = start.bands.filter((b) => ordOf.has(b.queue));
  const gaps = gapsBetween(queues, known);
  const result = await db.run(
    sql<ClaimedRow & { drawn: string; xid: string; xmin: string; drawers_gone: boolean | null; paused: string[]; limited: string[] }>`
    WITH RECURSIVE mark AS MATERIALIZED (
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
    q AS MATERIALIZED (
      SELECT u.name, u.share, u.ord
      FROM unnest(${queues}::text[], ${shares}::int[]) WITH ORDINALITY AS u(name, share, ord)
      WHERE NOT EXISTS (SELECT 1 FROM ${db.table('queues')} p WHERE p.name = u.name AND (p.paused OR ${limitedQueue(sql`p`)}))
    ),
    -- The bands of each gap between the known ones, highest first: one index descent
    -- each, and one more that ends the gap.
    found(ord, name, lo, priority) AS (
      SELECT g.ord, q.name, g.lo, (
        SELECT s.priority FROM ${db.table('task_states')} s
        WHERE s.queue = q.name AND s.state = 'pending' AND s.priority < g.hi AND s.priority > g.lo
        ORDER BY s.priority DESC LIMIT 1)
      FROM unnest(${gaps.ord}::int[], ${gaps.hi}::int[], ${gaps.lo}::int[]) AS g(ord, hi, lo) JOIN q ON q.ord = g.ord
      UNION ALL
      SELECT f.ord, f.name, f.lo, (
        SELECT s.priority FROM ${db.table('task_states')} s
        WHERE s.queue = f.name AND s.state = 'pending' AND s.priority < f.priority AND s.priority > f.lo
        ORDER BY s.priority DESC LIMIT 1)
      FROM found f WHERE f.priority IS NOT NULL
    ),
    -- Every band to scan, in the claim's order: by queue, highest priority first.
    bands AS MATERIALIZED (
      SELECT b.ord, q.name, b.priority, b.floor FROM (
        SELECT k.ord, k.priority, k.floor
        FROM unnest(${known.map((b) => ordOf.get(b.queue)!)}::int[], ${known.map((b) => b.priority)}::int[], ${known.map((b) => b.floor)}::bigint[]) AS k(ord, priority, floor)
        UNION ALL
        SELECT f.ord, f.priority, ${HEAD}::bigint FROM found f WHERE f.priority IS NOT NULL
      ) b JOIN q ON q.ord = b.ord
      ORDER BY b.ord, b.priority DESC
    ),
    -- Each queue's share first (the weights' proportions within one claim)…
    shared AS (
      SELECT c.ctid FROM q CROSS JOIN LATERAL (
        SELECT x.ctid FROM bands b CROSS JOIN LATERAL (
          SELECT s.ctid FROM ${db.table('task_states')} s
          WHERE s.queue = b.name AND s.state = 'pending' AND s.priority = b.priority AND s.pending_seq > b.floor
            -- Referenced here so that the mark is taken before the first row is locked
            -- (a row lock assigns the transaction id).
            AND (SELECT xid FROM me) IS NOT NULL
          ORDER BY s.pending_seq
          LIMIT q.share FOR UPDATE SKIP LOCKED
        ) x
        WHERE b.ord = q.ord
        LIMIT q.share
      ) c
    ),
    -- …then what the shares left, from the bands in order, so no slot stays idle while
    -- a queue has tasks. The outer LIMIT stops the scans as soon as enough rows are
    -- locked; the bands are read in the order they were materialized in (an ORDER BY
    -- here would sort, so lock, every band's rows first).
    more AS (
      SELECT m.ctid FROM bands b CROSS JOIN LATERAL (
        SELECT s.ctid FROM ${db.table('task_states')} s
        WHERE s.queue = b.name AND s.state = 'pending' AND s.priority = b.priority AND s.pending_seq > b.floor
          AND s.ctid <> ALL(ARRAY(SELECT ctid FROM shared))
        ORDER BY s.pending_seq
        LIMIT ${limit} FOR UPDATE SKIP LOCKED
      ) m
      WHERE (SELECT count(*) FROM shared) < ${limit}
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
      RETURNING s.seq, s.queue, s.pending_seq, s.priority, s.retried, s.lease_token
    ),
    tasks AS (
      SELECT u.seq::text AS seq, u.pending_seq::text AS pending_seq, u.priority, i.queue, i.id, i.type, i.payload, i.payload_bytes,
        i.headers, u.retried, i.max_retry,
        (extract(epoch FROM i.timeout) * 1000)::float8 AS timeout_ms,
        (extract(epoch FROM i.deadline - ${db.now()}) * 1000)::float8 AS deadline_in_ms,
        (extract(epoch FROM i.retention) * 1000)::float8 AS retention_ms,
        u.lease_token, array_position(${queues}::text[], u.queue) AS ord, u.pending_seq AS position
      FROM claimed u CROSS JOIN LATERAL (SELECT * FROM ${db.table('task_inputs')} i WHERE i.seq = u.seq) i
    )
    SELECT me.drawn::text AS drawn, me.xid::text AS xid, me.xmin::text AS xmin, (SELECT gone FROM drawers) AS drawers_gone,
      ARRAY(SELECT p.name FROM ${db.table('queues')} p WHERE p.paused AND p.name = ANY(${queues}::text[])) AS paused,
      ARRAY(SELECT p.name FROM ${db.table('queues')} p WHERE NOT p.paused AND ${limitedQueue(sql`p`)} AND p.name = ANY(${queues}::text[])) AS limited,
      t.*
    FROM me LEFT JOIN tasks t ON true
    ORDER BY t.ord, t.priority DESC, t.position`,
    undefined,
    'claim',
  );
  const first = result[0]!;
  const mark = {
    drawn: BigInt(first.drawn),
    xid: BigInt(first.xid),
    xmin: BigInt(first.xmin),
    drawersGone: first.drawers_gone,
    paused: first.paused,
    limited: first.limited,
  };
  return { mark, rows: result.filter((r) => r.seq !== null) };
}

/** A queue whose limits held back part of what a claimLimited() asked of it, and when its rate window frees a start (null: when an active task ends). */
export interface HeldBack {
  queue: string;
  waitMs: number | null;
}

/**
 * Claims from queues with limits (migration 0007 claim_limited): up to
 * `wanted[i]` tasks from `queues[i]`, `total` in all, each queue within its
 * concurrency, key concurrency and rate limits, counted across every server.
 */
export async function claimLimited(
  db: Db,
  queues: readonly string[],
  wanted: readonly number[],
  total: number,
  owner: string,
  leaseMs: number,
): Promise<{ rows: ClaimedRow[]; heldBack: HeldBack[] }> {
  const result = await db.run(
    sql<ClaimedRow & { wait_ms: number | null }>`
    SELECT c.queue, c.seq::text AS seq, c.pending_seq::text AS pending_seq, c.priority, c.id, c.type, c.payload, c.payload_bytes,
           c.headers, c.retried, c.max_retry, c.timeout_ms, c.deadline_in_ms, c.retention_ms, c.lease_token, c.wait_ms
    FROM ${db.table('claim_limited')}(${queues}::text[], ${wanted}::int[], ${total}::int, ${owner}, ${leaseMs}::float8, ${db.now()}, ${db.schema}) c`,
    undefined,
    'claim-limited',
  );
  const rows: ClaimedRow[] = [];
  const heldBack: HeldBack[] = [];
  for (const r of result) {
    if (r.seq === null) heldBack.push({ queue: r.queue, waitMs: r.wait_ms });
    else rows.push(r);
  }
  return { rows, heldBack };
}

/** A queues row (aliased `alias`) with any limit set: claimLimited() claims from it. */
const limitedQueue = (alias: RawBuilder<unknown>) =>
  sql`(${alias}.concurrency IS NOT NULL OR ${alias}.key_concurrency IS NOT NULL OR ${alias}.rate_limit IS NOT NULL)`;

/** The open intervals of priorities between a queue's known bands (each queue's whole range when it knows none), by queue number. */
function gapsBetween(queues: readonly string[], known: readonly Band[]): { ord: number[]; hi: number[]; lo: number[] } {
  const gaps = { ord: [] as number[], hi: [] as number[], lo: [] as number[] };
  queues.forEach((queue, i) => {
    const priorities = known.filter((b) => b.queue === queue).map((b) => b.priority);
    const edges = [ABOVE, ...priorities.sort((a, b) => b - a), BELOW];
    for (let n = 0; n + 1 < edges.length; n++) {
      // Adjacent priorities leave no gap to probe.
      if (edges[n]! - edges[n + 1]! <= 1) continue;
      gaps.ord.push(i + 1);
      gaps.hi.push(edges[n]!);
      gaps.lo.push(edges[n + 1]!);
    }
  });
  return gaps;
}

/** Below every position: a claim from the head of the queue. */
export const HEAD = String(-(2n ** 62n));

/** claimFrom() from the head of every queue, taking the queues strictly in order. */
export async function claim(db: Db, queues: readonly string[], limit: number, owner: string, leaseMs: number): Promise<ClaimedRow[]> {
  return (
    await claimFrom(
      db,
      queues,
      { bands: [], olderThan: null },
      queues.map((_, i) => (i === 0 ? limit : 0)),
      limit,
      owner,
      leaseMs,
    )
  ).rows;
}
