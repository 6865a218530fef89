/**
 * Claiming tasks and every write about a claimed task. Each of those writes is
 * fenced: it matches the task's state row only while `state = 'active'` and
 * `lease_token` is the token of this claim, so a worker that lost its lease
 * changes nothing. Leases are found by the task's `seq` (the state row's
 * primary key); batch statements take one row per lease through unnest() and
 * lock rows in seq order, so concurrent batches cannot deadlock.
 * The claim and every fenced write touch task_states, the narrow row; the
 * task's inputs (payload, headers, options) are read at the claim and deleted
 * with the task, never rewritten.
 */
import { sql } from 'kysely';
import type { AnyTransaction, Db } from './db.js';
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

/** Identifies one lease: the task, its state row and the token it was claimed with. */
export interface LeaseKey {
  queue: string;
  id: string;
  /** The task's internal key (bigint, as text). */
  seq: string;
  token: string;
}

/** The items whose state row the statement returned: the leases that were still held. */
function held<T extends LeaseKey>(items: readonly T[], rows: readonly { seq: string }[]): T[] {
  const seqs = new Set(rows.map((r) => String(r.seq)));
  return items.filter((i) => seqs.has(String(i.seq)));
}

const bySeq = <T extends LeaseKey>(items: readonly T[]): T[] =>
  [...items].sort((a, b) => (BigInt(a.seq) < BigInt(b.seq) ? -1 : BigInt(a.seq) > BigInt(b.seq) ? 1 : 0));

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

/**
 * The leases of a batch as statement parameters: the seqs in ascending order
 * (an index scan of the primary key by `seq = ANY` meets, and locks, rows in
 * that order, so batches cannot deadlock on each other), and a JSON object
 * from seq to the lease's token (or to [token, …fields]), which each row
 * looks its own entry up in. No join with the batch: a join is planned on the
 * row estimate of `state = 'active'`, which is often 1, and then rescans the
 * batch once per row (seen: 125,000 comparisons for a batch of 500).
 */
function batch<T extends LeaseKey>(items: readonly T[], fields?: (item: T) => unknown[]) {
  const sorted = bySeq(items);
  const byseq: Record<string, unknown> = {};
  for (const i of sorted) byseq[i.seq] = fields ? [i.token, ...fields(i)] : i.token;
  return { seqs: sorted.map((i) => i.seq), json: JSON.stringify(byseq) };
}

/** The rows of a batch whose lease is still held (`s` is task_states). */
const fenced = (b: { seqs: string[]; json: string }, withFields = false) =>
  withFields
    ? sql`s.seq = ANY(${b.seqs}::bigint[]) AND s.state = 'active' AND s.lease_token = ((${b.json}::jsonb -> s.seq::text) ->> 0)::uuid`
    : sql`s.seq = ANY(${b.seqs}::bigint[]) AND s.state = 'active' AND s.lease_token = (${b.json}::jsonb ->> s.seq::text)::uuid`;

/** Field `n` (1-based after the token) of a row's batch entry, as text. */
const field = (b: { json: string }, n: number) => sql`((${b.json}::jsonb -> s.seq::text) ->> ${sql.lit(n)})`;

/**
 * Extends every lease still held, by `leaseMs` from now (database clock).
 * Returns the leases extended, each with whether a cancellation was requested;
 * a lease missing from the result is lost. lease_expires_at is in no index, so
 * an extension is a HOT update of the narrow row.
 */
export async function extendLeases<T extends LeaseKey>(db: Db, leases: readonly T[], leaseMs: number): Promise<{ lease: T; cancelRequested: boolean }[]> {
  if (leases.length === 0) return [];
  const b = batch(leases);
  const rows = await db.run(
    sql<{ seq: string; cancel_requested: boolean }>`
    UPDATE ${db.table('task_states')} s SET lease_expires_at = ${db.now()} + ${ms(leaseMs)}
    WHERE ${fenced(b)} AND s.lease_expires_at > ${db.now()}
    RETURNING s.seq, s.cancel_requested`,
    undefined,
    'extend',
  );
  const cancel = new Map(rows.map((r) => [String(r.seq), r.cancel_requested]));
  return leases.filter((l) => cancel.has(String(l.seq))).map((lease) => ({ lease, cancelRequested: cancel.get(String(lease.seq))! }));
}

/** A successful (or revoked) attempt: `keep` marks it completed for its retention, otherwise it is deleted. */
export interface Completion extends LeaseKey {
  keep: boolean;
}

/** Deletes the inputs of the tasks in `from` and the unique locks they still hold. */
const deleteInputs = (db: Db, from: string) => sql`
    inputs AS (
      DELETE FROM ${db.table('task_inputs')} i WHERE i.seq = ANY(ARRAY(SELECT seq FROM ${sql.raw(from)}))
      RETURNING i.seq, i.queue, i.id, i.unique_key
    ),
    unlocked AS (
      DELETE FROM ${db.table('unique_locks')} l USING inputs f
      WHERE f.unique_key IS NOT NULL AND l.queue = f.queue AND l.key = f.unique_key AND l.task_id = f.id
    )`;

/**
 * Finishes successful attempts: deletes each task, or marks it completed until
 * its retention ends, and releases its unique lock if it still holds it.
 * Returns the leases that were still held (the others are fenced off).
 */
export async function complete<T extends Completion>(db: Db, items: readonly T[], trx?: AnyTransaction): Promise<T[]> {
  if (items.length === 0) return [];
  if (!items.some((i) => i.keep)) return deleteCompleted(db, items, trx);
  const b = batch(items, (i) => [i.keep]);
  const rows = await db.run(
    sql<{ seq: string }>`
    WITH h AS MATERIALIZED (
      SELECT s.seq, ${field(b, 1)}::bool AS keep FROM ${db.table('task_states')} s
      WHERE ${fenced(b, true)} ORDER BY s.seq FOR UPDATE
    ),
    deleted AS (
      DELETE FROM ${db.table('task_states')} s WHERE s.seq = ANY(ARRAY(SELECT seq FROM h WHERE NOT keep))
      RETURNING s.seq
    ),
    ${deleteInputs(db, 'deleted')},
    kept AS (
      UPDATE ${db.table('task_states')} s
      SET state = 'completed', completed_at = ${db.now()},
          run_at = ${db.now()} + (SELECT i.retention FROM ${db.table('task_inputs')} i WHERE i.seq = s.seq),
          lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = ${db.now()}
      WHERE s.seq = ANY(ARRAY(SELECT seq FROM h WHERE keep))
      RETURNING s.seq
    ),
    unlocked_kept AS (
      DELETE FROM ${db.table('unique_locks')} l
      USING (SELECT i.queue, i.id, i.unique_key FROM ${db.table('task_inputs')} i
             WHERE i.seq = ANY(ARRAY(SELECT seq FROM kept)) AND i.unique_key IS NOT NULL) f
      WHERE l.queue = f.queue AND l.key = f.unique_key AND l.task_id = f.id
    )
    SELECT seq FROM h`,
    trx,
    'complete',
  );
  return held(items, rows);
}

/**
 * complete() when no task is kept (retention 0, the common case): a plain
 * fenced DELETE, each row written once, locked in seq order as the index scan
 * meets it.
 */
async function deleteCompleted<T extends Completion>(db: Db, items: readonly T[], trx?: AnyTransaction): Promise<T[]> {
  const b = batch(items);
  const rows = await db.run(
    sql<{ seq: string }>`
    WITH deleted AS (
      DELETE FROM ${db.table('task_states')} s WHERE ${fenced(b)}
      RETURNING s.seq
    ),
    ${deleteInputs(db, 'deleted')}
    SELECT seq FROM deleted`,
    trx,
    'complete-delete',
  );
  return held(items, rows);
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
export async function fail<T extends Failure>(db: Db, items: readonly T[]): Promise<T[]> {
  if (items.length === 0) return [];
  const b = batch(items, (i) => [i.archive, i.counts, i.delayMs, i.error]);
  const archive = sql`${field(b, 1)}::bool`;
  const rows = await db.run(
    sql<{ seq: string }>`
    UPDATE ${db.table('task_states')} s
    SET state = CASE WHEN ${archive} THEN 'archived' ELSE 'retry' END,
        retried = s.retried + CASE WHEN ${field(b, 2)}::bool AND NOT ${archive} THEN 1 ELSE 0 END,
        run_at = ${db.now()} + CASE WHEN ${archive} THEN interval '0' ELSE ${field(b, 3)}::float8 * interval '1 millisecond' END,
        error_msg = ${field(b, 4)}, last_failed_at = ${db.now()},
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = ${db.now()}
    WHERE ${fenced(b, true)}
    RETURNING s.seq`,
    undefined,
    'fail',
  );
  return held(items, rows);
}

/**
 * Gives leases back at shutdown: the tasks return to the front of pending with
 * their retry count unchanged (asynq's requeue). Returns the leases still held.
 */
export async function requeue<T extends LeaseKey>(db: Db, leases: readonly T[]): Promise<T[]> {
  if (leases.length === 0) return [];
  const b = batch(leases);
  const rows = await db.run(sql<{ seq: string }>`
  WITH requeued AS (
    UPDATE ${db.table('task_states')} s
    SET state = 'pending', run_at = h.front_at - interval '1 microsecond', pending_seq = h.front - h.n + h.rank - 1,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = ${db.now()}
    FROM (
      -- Ahead of the queue's first pending task, in the order they were claimed.
      SELECT l.seq, row_number() OVER w AS rank, count(*) OVER (PARTITION BY l.queue) AS n,
             coalesce((SELECT min(p.pending_seq) FROM ${db.table('task_states')} p WHERE p.queue = l.queue AND p.state = 'pending'),
                      nextval(${db.qualified('task_seq')})) AS front,
             coalesce((SELECT min(p.run_at) FROM ${db.table('task_states')} p WHERE p.queue = l.queue AND p.state = 'pending'),
                      ${db.now()}) AS front_at
      FROM (SELECT s.seq, s.queue FROM ${db.table('task_states')} s WHERE ${fenced(b)} ORDER BY s.seq FOR UPDATE) l
      WINDOW w AS (PARTITION BY l.queue ORDER BY l.seq)
    ) h
    WHERE s.seq = h.seq
    RETURNING s.seq, s.queue
  ),
  -- Below the claim cursors' floors: every server's next claim of the queue starts from its head.
  notified AS (SELECT pg_notify(${db.channels.sweep}, queue) FROM (SELECT DISTINCT queue FROM requeued) q)
  SELECT seq FROM requeued WHERE (SELECT count(*) FROM notified) >= 0`);
  return held(leases, rows);
}

/** Stores a handler's result on its task. Returns false when the lease is gone. */
export async function writeResult(db: Db, lease: LeaseKey, json: string | null, bytes: Buffer | null): Promise<boolean> {
  const rows = await db.run(sql<{ seq: string }>`
    UPDATE ${db.table('task_states')} SET result = ${json}::jsonb, result_bytes = ${bytes}, updated_at = ${db.now()}
    WHERE seq = ${lease.seq}::bigint AND lease_token = ${lease.token}::uuid AND state = 'active'
    RETURNING seq`);
  return rows.length === 1;
}

/**
 * Inside a handler's transaction: locks the task's state row if this lease
 * still holds it. While the lock is held no recoverer can take the task (they
 * skip locked rows), so the completion at the end of the transaction cannot miss.
 */
export async function lockLease(db: Db, trx: AnyTransaction, lease: LeaseKey): Promise<boolean> {
  const rows = await db.run(
    sql<{ seq: string }>`
    SELECT seq FROM ${db.table('task_states')}
    WHERE seq = ${lease.seq}::bigint AND lease_token = ${lease.token}::uuid AND state = 'active'
    FOR UPDATE`,
    trx,
  );
  return rows.length === 1;
}
