/**
 * The Inspector's writes: asynq's admin transitions (reference §1.5, T19–T23)
 * as single statements. Each says whether the queue exists and, for one task,
 * the state it found, so the Inspector can name the refusal; a statement acts
 * only on rows in a state it was told it may act on. Rows are written with
 * plain UPDATE/DELETE (not SKIP LOCKED): a row a worker is claiming is waited
 * for and re-checked, so a task that just became active is never touched.
 */
import { sql } from 'kysely';
import type { QueueLimits } from '../model/inspector-types.js';
import { TASK_STATES, type TaskState } from '../model/task.js';
import type { AnyTransaction, Db } from './db.js';
import { ensureQueues } from './servers.js';
import { transaction } from './transaction.js';
import type { InQueue } from './inspector-read.js';

/** What a one-task action found and did. */
export interface TaskActionResult {
  queueFound: boolean;
  /** The task's state when the statement ran; null when there is no such task. */
  state: TaskState | null;
  /** Whether the action was taken (the state was one of those allowed). */
  done: boolean;
}

/** What a bulk action found and did: whether the queue exists, and how many rows it changed. */
export type BulkActionResult = InQueue<number>;

/** Every state but active: what deleteQueue deletes. */
const NOT_ACTIVE = TASK_STATES.filter((s) => s !== 'active');

type ActionRow = { queue_found: boolean; state: TaskState | null; done: boolean | null };
const toAction = (r: ActionRow | undefined): TaskActionResult => ({ queueFound: r?.queue_found ?? false, state: r?.state ?? null, done: r?.done ?? false });
const toBulk = (r: { queue_found: boolean; n: number } | undefined): BulkActionResult => ({ queueFound: r?.queue_found ?? false, value: r?.n ?? 0 });

/** The owner's function of each move (migration 0012): the tasks view's trigger makes the same moves with them. */
const MOVES = { delete: 'delete_tasks', pending: 'run_tasks', archived: 'archive_tasks' } as const;
type Move = keyof typeof MOVES;

/**
 * Makes `move` on task `id` of `queue` if its state is in `allowed`: delete
 * it (T21, deleteTask; its unique lock is released with it), or move it to
 * 'pending' (T19, runTask: the back of its queue, servers woken) or
 * 'archived' (T20, archiveTask). The state is the one the function found
 * under its lock.
 */
export async function actOnTask(db: Db, queue: string, id: string, move: Move, allowed: readonly TaskState[]): Promise<TaskActionResult> {
  const rows = await db.run(sql<ActionRow>`
    SELECT EXISTS (SELECT 1 FROM ${db.table('queues')} WHERE name = ${queue}) AS queue_found, m.found AS state, m.done
    FROM (SELECT 1) one
    LEFT JOIN ${db.table(MOVES[move])}(ARRAY(SELECT t.seq FROM ${db.table('tasks')} t WHERE t.queue = ${queue} AND t.id = ${id}), ${allowed}::text[]) m ON true`);
  return toAction(rows[0]);
}

/**
 * Makes `move` on every task of `queue` in `state` (and `group`, for
 * aggregating), as actOnTask does for one (asynq's DeleteAll…, RunAll… and
 * ArchiveAll…). Tasks made pending keep their relative order.
 */
export async function actOnState(db: Db, queue: string, state: TaskState, move: Move, group: string | null): Promise<BulkActionResult> {
  const rows = await db.run(sql<{ queue_found: boolean; n: number }>`
    SELECT EXISTS (SELECT 1 FROM ${db.table('queues')} WHERE name = ${queue}) AS queue_found,
           (SELECT pg_catalog.count(*)::int FROM ${db.table(MOVES[move])}(
              ARRAY(SELECT t.seq FROM ${db.table('tasks')} t
                    WHERE t.queue = ${queue} AND t.state = ${state} AND (${group}::text IS NULL OR t.group_key = ${group})),
              ARRAY[${state}]::text[]) m WHERE m.done) AS n`);
  return toBulk(rows[0]);
}

/**
 * Replaces the payload of task `id` of `queue` if it is scheduled (T22). The
 * unique key is not recomputed, as in asynq.
 */
export async function updatePayload(db: Db, queue: string, id: string, json: string | null, bytes: Buffer | null): Promise<TaskActionResult> {
  const rows = await db.run(sql<ActionRow>`
    SELECT EXISTS (SELECT 1 FROM ${db.table('queues')} WHERE name = ${queue}) AS queue_found, m.found AS state, m.done
    FROM (SELECT t.seq FROM ${db.table('tasks')} t WHERE t.queue = ${queue} AND t.id = ${id}) target
    CROSS JOIN LATERAL ${db.table('set_payload')}(target.seq, ${json}::jsonb, ${bytes}::bytea) m
    RIGHT JOIN (SELECT 1) one ON true`);
  return toAction(rows[0]);
}

/**
 * Marks every active task with this id (in any queue) for cancellation and,
 * if any was marked, sends the id on the cancel channel. Servers abort the
 * handler on the NOTIFY; a heartbeat that sees the mark aborts it too, so a
 * lost notification delays the cancellation by one heartbeat at most.
 * Returns how many tasks were marked.
 */
export async function requestCancel(db: Db, id: string): Promise<number> {
  const rows = await db.run(sql<{ n: number }>`SELECT ${db.table('request_cancel')}(${id}) AS n`);
  return rows[0]?.n ?? 0;
}

/**
 * Sets a queue's paused flag. `wasPaused` is the flag before (null: no such
 * queue). With `create`, a queue not known yet is made known first (unpaused),
 * in the same transaction. Unpausing announces the queue on the tasks and
 * sweep channels, so servers claim its waiting tasks at once, from the head.
 */
export async function setPaused(db: Db, queue: string, paused: boolean, create: boolean): Promise<{ wasPaused: boolean | null }> {
  return transaction(db, async (trx) => {
    if (create) await ensureQueues(db, [queue], trx);
    return { wasPaused: await writePaused(db, trx, queue, paused) };
  });
}

/** Sets the paused flag of a queue in `trx`; resolves to the flag before (null: no such queue). */
async function writePaused(db: Db, trx: AnyTransaction, queue: string, paused: boolean): Promise<boolean | null> {
  const rows = await db.run(
    sql<{ was_paused: boolean | null }>`
    WITH q AS (SELECT name, paused FROM ${db.table('queues')} WHERE name = ${queue} FOR UPDATE),
    changed AS (
      UPDATE ${db.table('queues')} u SET paused = ${paused} FROM q WHERE u.name = q.name AND q.paused <> ${paused}::boolean
      RETURNING u.name, u.paused
    ),
    notified AS (
      -- The sweep: claims passed over the paused queue and may have raised their floors above its tasks.
      SELECT pg_notify(${db.channels.tasks}, name), pg_notify(${db.channels.sweep}, name) FROM changed WHERE NOT paused
    )
    SELECT (SELECT paused FROM q) AS was_paused, (SELECT pg_catalog.count(*) FROM notified) AS notifications`,
    trx,
  );
  return rows[0]?.was_paused ?? null;
}

/**
 * Sets a queue's limits, all at once (null clears one), making the queue
 * known first when it is not, in the same transaction: a limit set before the
 * first enqueue holds for the first task. The servers are woken so that the
 * next claim uses them; the sweep lets their claims start from the head of
 * the queue again, which the plain claim skipped while it was limited.
 */
export async function setLimits(db: Db, queue: string, limits: QueueLimits): Promise<void> {
  await transaction(db, async (trx) => {
    await ensureQueues(db, [queue], trx);
    await writeLimits(db, trx, queue, limits);
  });
}

async function writeLimits(db: Db, trx: AnyTransaction, queue: string, limits: QueueLimits): Promise<void> {
  await db.run(
    sql`
    WITH changed AS (
      UPDATE ${db.table('queues')}
      SET concurrency = ${limits.concurrency}::int, key_concurrency = ${limits.keyConcurrency}::int,
          rate_limit = ${limits.rateLimit?.limit ?? null}::int, rate_interval_ms = ${limits.rateLimit?.interval ?? null}::int
      WHERE name = ${queue}
      RETURNING name
    )
    SELECT pg_catalog.count(*) AS notifications FROM (SELECT pg_notify(${db.channels.tasks}, name), pg_notify(${db.channels.sweep}, name) FROM changed) n`,
    trx,
  );
}

/**
 * Makes a queue known (an existing one keeps its tasks and what is not
 * given), then applies what is given, in one transaction: `limits` as
 * setLimits() sets them, `paused` as the flag.
 */
export async function createQueue(db: Db, queue: string, config: { limits?: QueueLimits; paused?: boolean }): Promise<void> {
  await transaction(db, async (trx) => {
    await ensureQueues(db, [queue], trx);
    if (config.limits) await writeLimits(db, trx, queue, config.limits);
    if (config.paused !== undefined) await writePaused(db, trx, queue, config.paused);
  });
}

/** What deleteQueue found and did. */
export interface DeleteQueueResult {
  queueFound: boolean;
  hasActive: boolean;
  hasTasks: boolean;
  deleted: boolean;
}

/**
 * Removes a queue (T23): when it holds no task, or with `force` when none of
 * its tasks is active, in which case every task of the queue is deleted with
 * it (and the unique locks they hold). The queue's daily stats go too.
 */
export async function deleteQueue(db: Db, queue: string, force: boolean): Promise<DeleteQueueResult> {
  const rows = await db.run(sql<{ queue_found: boolean; has_active: boolean; has_tasks: boolean; deleted: boolean }>`
    WITH q AS (SELECT name FROM ${db.table('queues')} WHERE name = ${queue} FOR UPDATE),
    c AS (
      SELECT EXISTS (SELECT 1 FROM ${db.table('tasks')} WHERE queue = ${queue} AND state = 'active' AND lease_owner IS NOT NULL) AS has_active,
             EXISTS (SELECT 1 FROM ${db.table('tasks')} WHERE queue = ${queue}) AS has_tasks
    ),
    ok AS (SELECT q.name FROM q, c WHERE NOT c.has_active AND (NOT c.has_tasks OR ${force}::boolean)),
    deleted_tasks AS MATERIALIZED (
      SELECT m.* FROM ok CROSS JOIN LATERAL ${db.table('delete_tasks')}(
        ARRAY(SELECT t.seq FROM ${db.table('tasks')} t WHERE t.queue = ok.name AND t.state <> 'active'), ${NOT_ACTIVE}::text[]) m
    ),
    stats AS (DELETE FROM ${db.table('daily_stats')} s USING ok WHERE s.queue = ok.name AND (SELECT pg_catalog.count(*) FROM deleted_tasks) >= 0),
    gone AS (DELETE FROM ${db.table('queues')} u USING ok WHERE u.name = ok.name AND (SELECT pg_catalog.count(*) FROM deleted_tasks) >= 0 RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM q) AS queue_found, c.has_active, c.has_tasks, EXISTS (SELECT 1 FROM gone) AS deleted
    FROM c`);
  const r = rows[0];
  return { queueFound: r?.queue_found ?? false, hasActive: r?.has_active ?? false, hasTasks: r?.has_tasks ?? false, deleted: r?.deleted ?? false };
}
