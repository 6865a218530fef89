/**
 * Following a task from outside the server (migration 0013): its recorded
 * attempts and log lines, waiting for its outcome (await_tasks(), which marks
 * a task so that its completion keeps it and announces it on the done
 * channel), and registering a watcher so that the servers send events. The
 * writes are the owner's functions: a producer waits and watches with no
 * privilege on the tables.
 */
import { sql } from 'kysely';
import type { AttemptInfo, AttemptOutcome, TaskLogLine } from '../model/following.js';
import type { TaskInfo, TaskState } from '../model/task.js';
import type { AnyTransaction, Db } from './db.js';
import type { InQueue } from './inspector-read.js';
import { taskColumns, toTaskInfo, type TaskRow } from './task-columns.js';

/** A task's runs, oldest first: the ended ones recorded, then the one running now, if any. Undefined: no such task. */
export async function taskAttempts(db: Db, queue: string, id: string): Promise<InQueue<AttemptInfo[] | undefined>> {
  const rows = await db.run(sql<{ queue_found: boolean; found: boolean | null; attempts: AttemptRow[] | null }>`
    SELECT EXISTS (SELECT 1 FROM ${db.table('queues')} WHERE name = ${queue}) AS queue_found, t.seq IS NOT NULL AS found,
      (SELECT pg_catalog.json_agg(a ORDER BY a.run) FROM (
         SELECT r.run, r.attempt, r.server, r.started_at, r.finished_at, r.outcome, r.error
         FROM ${db.table('task_attempts')} r WHERE r.seq = t.seq
         UNION ALL
         -- The run going on: its row is the task's, until it ends.
         SELECT s.runs + 1, s.retried + 1, s.lease_owner, s.started_at, NULL, 'running', NULL
         FROM ${db.table('task_states')} s WHERE s.seq = t.seq AND s.state = 'active'
       ) a) AS attempts
    FROM (SELECT 1) one
    LEFT JOIN ${db.table('tasks')} t ON t.queue = ${queue} AND t.id = ${id}`);
  const row = rows[0];
  return { queueFound: row?.queue_found ?? false, value: row?.found ? (row.attempts ?? []).map(toAttempt) : undefined };
}

interface AttemptRow {
  attempt: number;
  server: string | null;
  started_at: string | null;
  finished_at: string | null;
  outcome: AttemptOutcome;
  error: string | null;
}

const date = (s: string | null): Date | null => (s === null ? null : new Date(s));

const toAttempt = (r: AttemptRow): AttemptInfo => ({
  attempt: r.attempt,
  serverId: r.server,
  startedAt: date(r.started_at),
  finishedAt: date(r.finished_at),
  outcome: r.outcome,
  error: r.error,
});

/** A task's log lines, oldest first; the newest `tail` when given. Undefined: no such task. */
export async function taskLogs(db: Db, queue: string, id: string, tail: number | undefined): Promise<InQueue<TaskLogLine[] | undefined>> {
  const rows = await db.run(sql<{ queue_found: boolean; found: boolean | null; lines: { attempt: number; at: string; message: string }[] | null }>`
    SELECT EXISTS (SELECT 1 FROM ${db.table('queues')} WHERE name = ${queue}) AS queue_found, t.seq IS NOT NULL AS found,
      (SELECT pg_catalog.json_agg(l ORDER BY l.line) FROM (
         SELECT x.line, x.attempt, x.at, x.message FROM ${db.table('task_logs')} x WHERE x.seq = t.seq
         ORDER BY x.line DESC LIMIT ${tail ?? null}::int
       ) l) AS lines
    FROM (SELECT 1) one
    LEFT JOIN ${db.table('tasks')} t ON t.queue = ${queue} AND t.id = ${id}`);
  const row = rows[0];
  const lines = row?.found ? (row.lines ?? []).map((l) => ({ attempt: l.attempt, at: new Date(l.at), message: l.message })) : undefined;
  return { queueFound: row?.queue_found ?? false, value: lines };
}

/** What await_tasks() says of one task. */
export interface AwaitedTask {
  queue: string;
  id: string;
  queueFound: boolean;
  /** Null: no such task (never was, or deleted). */
  state: TaskState | null;
  /** How its last recorded run ended (a canceled run makes an archived task canceled, not failed). */
  lastOutcome: AttemptOutcome | null;
  /** The task, read in the same statement, once it has finished (completed or archived). */
  finished: TaskInfo | undefined;
}

type AwaitedRow = { queue: string; id: string; queue_found: boolean; state: TaskState | null; last_outcome: AttemptOutcome | null; read: boolean } & TaskRow;

/**
 * Marks the tasks awaited (unless finished) and reads where each stands, and
 * those that finished whole: one round trip for a waiter woken by their end.
 */
export async function awaitTasks(db: Db, tasks: readonly { queue: string; id: string }[], trx?: AnyTransaction): Promise<AwaitedTask[]> {
  if (tasks.length === 0) return [];
  const rows = await db.run(
    sql<AwaitedRow>`
    SELECT a.queue AS awaited_queue, a.id AS awaited_id, a.queue_found, a.state AS awaited_state, a.last_outcome, t.seq IS NOT NULL AS read, ${taskColumns(db)}
    FROM ${db.table('await_tasks')}(${tasks.map((t) => t.queue)}::text[], ${tasks.map((t) => t.id)}::text[]) a
    -- Each finished task looked up by its key: as a join, the generic plan of a small table hashed
    -- every task at each wake (1 ms of enqueueAndWait's round trip, RT), and of a large one could.
    LEFT JOIN LATERAL (
      SELECT * FROM ${db.table('tasks')} t WHERE a.state IN ('completed', 'archived') AND t.queue = a.queue AND t.id = a.id LIMIT 1
    ) t ON true`,
    trx,
    'await',
  );
  return rows.map((r) => {
    const row = r as unknown as Record<string, unknown>;
    return {
      queue: row.awaited_queue as string,
      id: row.awaited_id as string,
      queueFound: r.queue_found,
      state: row.awaited_state as TaskState | null,
      lastOutcome: r.last_outcome,
      finished: r.read ? toTaskInfo(r) : undefined,
    };
  });
}

/** Registers a watcher of `queue` (null: every queue) for `ttlMs`, or renews `watcher`; returns its id. */
export async function watchTasks(db: Db, watcher: string | null, queue: string | null, ttlMs: number): Promise<string> {
  const rows = await db.run(sql<{ id: string }>`SELECT ${db.table('watch_tasks')}(${watcher}::uuid, ${queue}::text, ${ttlMs}::float8) AS id`);
  return rows[0]!.id;
}

/** Ends a watch. */
export async function unwatchTasks(db: Db, watcher: string): Promise<void> {
  await db.run(sql`SELECT ${db.table('unwatch_tasks')}(${watcher}::uuid)`);
}

/** The owner's functions a waiting or watching client calls, by signature: broker/roles.ts grants them. */
export const FOLLOWING_FUNCTIONS: readonly string[] = ['await_tasks(text[], text[])', 'watch_tasks(uuid, text, float8)', 'unwatch_tasks(uuid)'];
