/**
 * The claim: one call of the owner's claim_tasks() (migration 0010, SECURITY
 * DEFINER: the worker holds no UPDATE on the task tables) that takes pending
 * tasks into this server's leases, from each queue's share and above its
 * claim cursor's floor (server/cursor.ts), and returns each task's inputs with
 * its new lease token. Queues with limits are claim_limited()'s. Every later
 * write about a claimed task is leases.ts's, fenced by that token.
 */
import { sql } from 'kysely';
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

/**
 * Most bytes of payloads and headers one claim brings (as they are sent:
 * JSON text, bytea), one task at least: a claim of many large tasks takes
 * fewer of them, and the rest wait for the next claim.
 */
export const MAX_CLAIM_BYTES = 64 * 1024 * 1024;

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
 * Claims up to `limit` pending tasks in one statement (claim_tasks): from each queue its
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
    SELECT c.drawn::text AS drawn, c.xid::text AS xid, c.xmin::text AS xmin, c.drawers_gone, c.locked::float8 AS locked, c.paused, c.limited,
      c.seq::text AS seq, c.pending_seq::text AS pending_seq, c.priority, c.queue, c.id, c.type, c.payload, c.payload_bytes, c.headers,
      c.retried, c.max_retry, c.timeout_ms, c.deadline_in_ms, c.retention_ms, c.lease_token
    FROM ${db.table('claim_tasks')}(${queues}::text[], ${shares}::int[], ${gaps.ord}::int[], ${gaps.hi}::int[], ${gaps.lo}::int[],
      ${known.map((b) => ordOf.get(b.queue)!)}::int[], ${known.map((b) => b.priority)}::int[], ${known.map((b) => b.floor)}::bigint[],
      ${start.olderThan}::xid8, ${limit}::int, ${owner}, ${leaseMs}::float8, ${maxBytes}::float8, ${db.clockShift()}) c`,
    undefined,
    'claim',
  );
  // The claim's own fields ride on one row of their own, whose seq is null.
  const first = result.find((r) => r.seq === null)!;
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
 * Claims from queues with limits (claim_limited, migrations 0007 and 0010): up to
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
    FROM ${db.table('claim_limited')}(${queues}::text[], ${wanted}::int[], ${total}::int, ${owner}, ${leaseMs}::float8, ${db.clockShift()}) c`,
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

/** Below every position: a claim from the head of the queue (claim_tasks, migration 0010, spells it out too). */
export const HEAD = String(-(2n ** 62n));

/** The owner's functions (migration 0010) the statements of this file call, by signature: broker/roles.ts grants them to the worker. */
export const CLAIM_FUNCTIONS: readonly string[] = [
  'claim_tasks(text[], integer[], integer[], integer[], integer[], integer[], integer[], bigint[], xid8, integer, text, float8, float8, float8)',
  'claim_limited(text[], integer[], integer, text, float8, float8)',
];
