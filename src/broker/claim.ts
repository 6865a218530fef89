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
 * Most bytes of payloads and headers one claim brings (as they are sent:
 * JSON text, bytea), one task at least: a claim of many large tasks takes
 * fewer of them, and the rest wait for the next claim.
 */
export const MAX_CLAIM_BYTES = 64 * 1024 * 1024;

/**
 * The bytes of a task_inputs row (aliased `i`) as a claim sends them: its
 * payload (JSON as text, or bytea) and its headers. Measured in PostgreSQL:
 * only the number leaves it.
 */
const inputBytes = sql`(coalesce(pg_catalog.octet_length(i.payload_bytes), pg_catalog.octet_length(i.payload::text), 0)::float8
  + pg_catalog.octet_length(i.headers::text)::float8)`;

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
  /**
   * Rows the scans locked: the claim returns fewer when MAX_CLAIM_BYTES cut it
   * short (or a state row had no inputs). Fewer than asked: the scans ran out.
   */
  locked: number;
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
 * are locked. Of the locked rows, the claim takes the longest run in its order
 * whose payloads and headers stay within `maxBytes` (one task at least); the
 * others stay pending, locked only until the claim commits. A state row
 * without inputs is never taken: nothing could run it.
 */
export async function claimFrom(
  db: Db,
  queues: readonly string[],
  start: ClaimStart,
  shares: readonly number[],
  limit: number,
  owner: string,
  leaseMs: number,
  maxBytes = MAX_CLAIM_BYTES,
): Promise<{ mark: ClaimMark; rows: ClaimedRow[] }> {
  const ordOf = new Map(queues.map((q, i) => [q, i + 1]));
  const known = start.bands.filter((b) => ordOf.has(b.queue));
  const gaps = gapsBetween(queues, known);
  const result = await db.run(
    sql<ClaimedRow & { drawn: string; xid: string; xmin: string; drawers_gone: boolean | null; paused: string[]; limited: string[]; locked: number }>`
    WITH RECURSIVE mark AS MATERIALIZED (
      -- A sequence that has handed out nothing yet has drawn nothing.
      SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END AS drawn FROM ${db.table('task_seq')}
    ),
    me AS MATERIALIZED (
      -- The transaction id is taken after the sequence was read (see server/cursor.ts).
      SELECT m.drawn, pg_catalog.pg_current_xact_id() AS xid, pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot()) AS xmin FROM mark m
    ),
    -- Drawing a position locks task_seq until the transaction ends: when no holder of
    -- that lock in this database is older than olderThan, every position drawn before
    -- olderThan's claim is committed or gone. Unlike xmin, a long transaction elsewhere
    -- in the cluster does not hold this up. Live state, not the snapshot: a later
    -- claim's snapshot is the first that surely sees those commits.
    drawers AS MATERIALIZED (
      SELECT NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'relation' AND l.granted
          AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
          AND l.relation = ${db.qualified('task_seq')}::regclass
          -- A prepared transaction has no backend; a holder without an id has written nothing.
          AND (a.pid IS NULL OR pg_catalog.age(a.backend_xid) > pg_catalog.age(${start.olderThan}::xid8::xid))
      ) AS gone
      WHERE ${start.olderThan}::xid8 IS NOT NULL
    ),
    q AS MATERIALIZED (
      SELECT u.name, u.share, u.ord
      FROM ROWS FROM (pg_catalog.unnest(${queues}::text[]), pg_catalog.unnest(${shares}::int[])) WITH ORDINALITY AS u(name, share, ord)
      WHERE NOT EXISTS (SELECT 1 FROM ${db.table('queues')} p WHERE p.name = u.name AND (p.paused OR ${limitedQueue(sql`p`)}))
    ),
    -- The bands of each gap between the known ones, highest first: one index descent
    -- each, and one more that ends the gap.
    found(ord, name, lo, priority) AS (
      SELECT g.ord, q.name, g.lo, (
        SELECT s.priority FROM ${db.table('task_states')} s
        WHERE s.queue = q.name AND s.state = 'pending' AND s.priority < g.hi AND s.priority > g.lo
        ORDER BY s.priority DESC LIMIT 1)
      FROM ROWS FROM (pg_catalog.unnest(${gaps.ord}::int[]), pg_catalog.unnest(${gaps.hi}::int[]), pg_catalog.unnest(${gaps.lo}::int[]))
        AS g(ord, hi, lo) JOIN q ON q.ord = g.ord
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
        FROM ROWS FROM (pg_catalog.unnest(${known.map((b) => ordOf.get(b.queue)!)}::int[]),
                        pg_catalog.unnest(${known.map((b) => b.priority)}::int[]),
                        pg_catalog.unnest(${known.map((b) => b.floor)}::bigint[])) AS k(ord, priority, floor)
        UNION ALL
        SELECT f.ord, f.priority, ${HEAD}::bigint FROM found f WHERE f.priority IS NOT NULL
      ) b JOIN q ON q.ord = b.ord
      ORDER BY b.ord, b.priority DESC
    ),
    -- Each queue's share first (the weights' proportions within one claim)…
    shared AS (
      SELECT c.* FROM q CROSS JOIN LATERAL (
        SELECT x.* FROM bands b CROSS JOIN LATERAL (
          SELECT s.ctid, s.seq, s.queue, s.priority, s.pending_seq FROM ${db.table('task_states')} s
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
      SELECT m.* FROM bands b CROSS JOIN LATERAL (
        SELECT s.ctid, s.seq, s.queue, s.priority, s.pending_seq FROM ${db.table('task_states')} s
        WHERE s.queue = b.name AND s.state = 'pending' AND s.priority = b.priority AND s.pending_seq > b.floor
          AND s.ctid <> ALL(ARRAY(SELECT ctid FROM shared))
        ORDER BY s.pending_seq
        LIMIT ${limit} FOR UPDATE SKIP LOCKED
      ) m
      WHERE (SELECT pg_catalog.count(*) FROM shared) < ${limit}
      LIMIT greatest(${limit}::bigint - (SELECT pg_catalog.count(*) FROM shared), 0)
    ),
    c AS (SELECT * FROM shared UNION ALL SELECT * FROM more),
    -- The locked rows in the claim's order, with the running sum of their inputs' bytes.
    -- The inner join leaves out a state row without inputs: it is not claimed. (LIMIT 1
    -- keeps the lookup a primary key probe per row: a join planned on the CTE's guessed
    -- size may hash the whole table.)
    sized AS (
      SELECT c.ctid, pg_catalog.row_number() OVER w AS n, pg_catalog.sum(x.bytes) OVER w AS upto
      FROM c CROSS JOIN LATERAL (SELECT ${inputBytes} AS bytes FROM ${db.table('task_inputs')} i WHERE i.seq = c.seq LIMIT 1) x
      WINDOW w AS (ORDER BY pg_catalog.array_position(${queues}::text[], c.queue), c.priority DESC, c.pending_seq ROWS UNBOUNDED PRECEDING)
    ),
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
      SET state = 'active', lease_owner = ${owner}, lease_token = pg_catalog.gen_random_uuid(),
          lease_expires_at = ${db.now()} + ${ms(leaseMs)}, started_at = ${db.now()}, run_at = NULL,
          cancel_requested = false, updated_at = ${db.now()}
      WHERE s.ctid = ANY(ARRAY(SELECT ctid FROM sized WHERE n = 1 OR upto <= ${maxBytes}::float8))
      RETURNING s.seq, s.queue, s.pending_seq, s.priority, s.retried, s.lease_token
    ),
    tasks AS (
      SELECT u.seq::text AS seq, u.pending_seq::text AS pending_seq, u.priority, i.queue, i.id, i.type, i.payload, i.payload_bytes,
        i.headers, u.retried, i.max_retry,
        (extract(epoch FROM i.timeout) * 1000::numeric)::float8 AS timeout_ms,
        (extract(epoch FROM i.deadline - ${db.now()}) * 1000::numeric)::float8 AS deadline_in_ms,
        (extract(epoch FROM i.retention) * 1000::numeric)::float8 AS retention_ms,
        u.lease_token, pg_catalog.array_position(${queues}::text[], u.queue) AS ord, u.pending_seq AS position
      FROM claimed u CROSS JOIN LATERAL (SELECT * FROM ${db.table('task_inputs')} i WHERE i.seq = u.seq) i
    )
    SELECT me.drawn::text AS drawn, me.xid::text AS xid, me.xmin::text AS xmin, (SELECT gone FROM drawers) AS drawers_gone,
      (SELECT pg_catalog.count(*) FROM c)::float8 AS locked,
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
    locked: first.locked,
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

/** The owner's functions (migration 0010) the statements of this file call, by signature: broker/roles.ts grants them to the worker. */
export const CLAIM_FUNCTIONS: readonly string[] = [];
