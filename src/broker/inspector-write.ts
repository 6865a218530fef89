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
import type { TaskState } from '../model/task.js';
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

type ActionRow = { queue_found: boolean; state: TaskState | null; n: number };
const toAction = (r: ActionRow | undefined): TaskActionResult => ({ queueFound: r?.queue_found ?? false, state: r?.state ?? null, done: (r?.n ?? 0) > 0 });
const toBulk = (r: { queue_found: boolean; n: number } | undefined): BulkActionResult => ({ queueFound: r?.queue_found ?? false, value: r?.n ?? 0 });

/**
 * Deletes task `id` of `queue` if its state is in `allowed`, and releases its
 * unique lock if the lock is held by this task (asynq's DeleteTask, T21).
 */
export async function deleteTask(db: Db, queue: string, id: string, allowed: readonly TaskState[]): Promise<TaskActionResult> {
  const rows = await db.run(sql<ActionRow>`
    WITH target AS (
      SELECT t.queue, t.id, t.state FROM ${db.table('tasks')} t WHERE t.queue = ${queue} AND t.id = ${id} FOR UPDATE
    ),
    deleted AS (
      DELETE FROM ${db.table('tasks')} t USING target
      WHERE t.queue = target.queue AND t.id = target.id AND target.state = ANY(${allowed}::text[])
      RETURNING t.queue, t.id, t.unique_key
    ),
    unlocked AS (
      DELETE FROM ${db.table('unique_locks')} l USING deleted d WHERE l.queue = d.queue AND l.key = d.unique_key AND l.task_id = d.id
    )
    SELECT EXISTS (SELECT 1 FROM ${db.table('queues')} WHERE name = ${queue}) AS queue_found,
           (SELECT state FROM target) AS state, (SELECT pg_catalog.count(*)::int FROM deleted) AS n`);
  return toAction(rows[0]);
}

/**
 * Moves task `id` of `queue` to `to` ('pending': T19, runTask; 'archived': T20,
 * archiveTask) if its state is in `allowed`. run_at becomes db.now(): the back
 * of the pending queue, or the archive time. Lease fields are cleared;
 * error_msg and last_failed_at are kept. A task made pending is announced on
 * the tasks channel so servers claim it at once.
 */
export async function moveTask(db: Db, queue: string, id: string, to: 'pending' | 'archived', allowed: readonly TaskState[]): Promise<TaskActionResult> {
  const rows = await db.run(sql<ActionRow>`
    WITH target AS (
      SELECT t.queue, t.id, t.state FROM ${db.table('tasks')} t WHERE t.queue = ${queue} AND t.id = ${id} FOR UPDATE
    ),
    moved AS (
      UPDATE ${db.table('tasks')} t
      SET state = ${to}, run_at = ${db.now()}, updated_at = ${db.now()}
      FROM target WHERE t.queue = target.queue AND t.id = target.id AND target.state = ANY(${allowed}::text[])
      RETURNING t.queue, t.state
    ),
    notified AS (
      SELECT pg_notify(${db.channels.tasks}, queue) FROM moved WHERE state = 'pending'
    )
    SELECT EXISTS (SELECT 1 FROM ${db.table('queues')} WHERE name = ${queue}) AS queue_found,
           (SELECT state FROM target) AS state, (SELECT pg_catalog.count(*)::int FROM moved) AS n,
           (SELECT pg_catalog.count(*) FROM notified) AS notifications`);
  return toAction(rows[0]);
}

/**
 * Replaces the payload of task `id` of `queue` if it is scheduled (T22). The
 * unique key is not recomputed, as in asynq.
 */
export async function updatePayload(db: Db, queue: string, id: string, json: string | null, bytes: Buffer | null): Promise<TaskActionResult> {
  const rows = await db.run(sql<ActionRow>`
    WITH target AS (
      SELECT t.queue, t.id, t.state FROM ${db.table('tasks')} t WHERE t.queue = ${queue} AND t.id = ${id} FOR UPDATE
    ),
    updated AS (
      UPDATE ${db.table('tasks')} t SET payload = ${json}::jsonb, payload_bytes = ${bytes}::bytea, updated_at = ${db.now()}
      FROM target WHERE t.queue = target.queue AND t.id = target.id AND target.state = 'scheduled'
      RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM ${db.table('queues')} WHERE name = ${queue}) AS queue_found,
           (SELECT state FROM target) AS state, (SELECT pg_catalog.count(*)::int FROM updated) AS n`);
  return toAction(rows[0]);
}

/**
 * Deletes every task of `queue` in `state` (and `group`, for aggregating),
 * releasing the unique locks the deleted tasks hold (asynq's DeleteAll…).
 */
export async function deleteAllInState(db: Db, queue: string, state: TaskState, group: string | null): Promise<BulkActionResult> {
  const rows = await db.run(sql<{ queue_found: boolean; n: number }>`
    WITH q AS (SELECT name FROM ${db.table('queues')} WHERE name = ${queue}),
    deleted AS (
      DELETE FROM ${db.table('tasks')} t USING q
      WHERE t.queue = q.name AND t.state = ${state} AND (${group}::text IS NULL OR t.group_key = ${group})
      RETURNING t.queue, t.id, t.unique_key
    ),
    unlocked AS (
      DELETE FROM ${db.table('unique_locks')} l USING deleted d WHERE l.queue = d.queue AND l.key = d.unique_key AND l.task_id = d.id
    )
    SELECT EXISTS (SELECT 1 FROM q) AS queue_found, (SELECT pg_catalog.count(*)::int FROM deleted) AS n`);
  return toBulk(rows[0]);
}

/**
 * Moves every task of `queue` in `from` (and `group`, for aggregating) to
 * `to`, as moveTask does for one (asynq's RunAll… and ArchiveAll…). They keep
 * their relative order: equal run_at, ties broken by enqueue order (seq).
 */
export async function moveAllInState(db: Db, queue: string, from: TaskState, to: 'pending' | 'archived', group: string | null): Promise<BulkActionResult> {
  const rows = await db.run(sql<{ queue_found: boolean; n: number }>`
    WITH q AS (SELECT name FROM ${db.table('queues')} WHERE name = ${queue}),
    moved AS (
      UPDATE ${db.table('tasks')} t
      SET state = ${to}, run_at = ${db.now()}, updated_at = ${db.now()}
      FROM q WHERE t.queue = q.name AND t.state = ${from} AND (${group}::text IS NULL OR t.group_key = ${group})
      RETURNING 1
    ),
    notified AS (
      SELECT pg_notify(${db.channels.tasks}, ${queue}) WHERE ${to}::text = 'pending' AND EXISTS (SELECT 1 FROM moved)
    )
    SELECT EXISTS (SELECT 1 FROM q) AS queue_found, (SELECT pg_catalog.count(*)::int FROM moved) AS n,
           (SELECT pg_catalog.count(*) FROM notified) AS notifications`);
  return toBulk(rows[0]);
}

/**
 * Marks every active task with this id (in any queue) for cancellation and,
 * if any was marked, sends the id on the cancel channel. Servers abort the
 * handler on the NOTIFY; a heartbeat that sees the mark aborts it too, so a
 * lost notification delays the cancellation by one heartbeat at most.
 * Returns how many tasks were marked.
 */
export async function requestCancel(db: Db, id: string): Promise<number> {
  const rows = await db.run(sql<{ n: number }>`
    WITH marked AS (
      UPDATE ${db.table('tasks')} SET cancel_requested = true, updated_at = ${db.now()}
      WHERE id = ${id} AND state = 'active' AND lease_owner IS NOT NULL -- tasks_active_idx (0003)
      RETURNING 1
    ),
    notified AS (
      SELECT pg_notify(${db.channels.cancel}, ${id}) WHERE EXISTS (SELECT 1 FROM marked)
    )
    SELECT (SELECT pg_catalog.count(*)::int FROM marked) AS n, (SELECT pg_catalog.count(*) FROM notified) AS notifications`);
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
    deleted_tasks AS (
      DELETE FROM ${db.table('tasks')} t USING ok WHERE t.queue = ok.name AND t.state <> 'active'
      RETURNING t.queue, t.id, t.unique_key
    ),
    unlocked AS (
      DELETE FROM ${db.table('unique_locks')} l USING deleted_tasks d WHERE l.queue = d.queue AND l.key = d.unique_key AND l.task_id = d.id
    ),
    stats AS (DELETE FROM ${db.table('daily_stats')} s USING ok WHERE s.queue = ok.name),
    gone AS (DELETE FROM ${db.table('queues')} u USING ok WHERE u.name = ok.name RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM q) AS queue_found, c.has_active, c.has_tasks, EXISTS (SELECT 1 FROM gone) AS deleted
    FROM c`);
  const r = rows[0];
  return { queueFound: r?.queue_found ?? false, hasActive: r?.has_active ?? false, hasTasks: r?.has_tasks ?? false, deleted: r?.deleted ?? false };
}
