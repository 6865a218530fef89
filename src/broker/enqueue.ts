/**
 * Enqueue: one statement for any number of tasks, so enqueueMany is one round
 * trip and all-or-nothing. The unique locks, the queue registry, the rows and
 * one NOTIFY per (channel, queue) are all written by that statement.
 */
import { sql } from 'kysely';
import { DuplicateTaskError, TaskIdConflictError } from '../errors.js';
import type { TaskInfo, TaskRecord } from '../task.js';
import type { Db, Transactional } from './db.js';
import { taskColumns, toTaskInfo, type TaskRow } from './rows.js';

export async function insertTasks(db: Db, records: TaskRecord[], tx?: Transactional): Promise<TaskInfo[]> {
  const col = <T>(f: (r: TaskRecord) => T): T[] => records.map(f);
  const query = sql<TaskRow>`
    WITH input AS (
      SELECT * FROM unnest(
        ${col((r) => r.id)}::text[], ${col((r) => r.queue)}::text[], ${col((r) => r.type)}::text[],
        ${col((r) => r.payload.json)}::jsonb[], ${col((r) => r.payload.bytes)}::bytea[],
        ${col((r) => JSON.stringify(r.headers))}::jsonb[], ${col((r) => r.maxRetry)}::int[],
        ${col((r) => r.timeoutMs)}::float8[], ${col((r) => r.deadline)}::timestamptz[],
        ${col((r) => r.uniqueKey)}::text[], ${col((r) => r.uniqueTtlMs)}::float8[],
        ${col((r) => r.group)}::text[], ${col((r) => r.retentionMs)}::float8[],
        ${col((r) => r.processAt)}::timestamptz[], ${col((r) => r.processInMs)}::float8[]
      ) WITH ORDINALITY AS i(id, queue, type, payload, payload_bytes, headers, max_retry, timeout_ms, deadline,
                             unique_key, unique_ttl_ms, group_key, retention_ms, process_at, process_in_ms, ord)
    ),
    routed AS (
      -- asynq's routing: due later → scheduled (group or not); else group → aggregating; else pending.
      SELECT i.*, CASE WHEN i.due > now() THEN 'scheduled' WHEN i.group_key IS NOT NULL THEN 'aggregating' ELSE 'pending' END AS state
      FROM (SELECT input.*, coalesce(process_at, now() + process_in_ms * interval '1 millisecond', now()) AS due FROM input) i
    ),
    expired_locks AS (
      DELETE FROM ${db.table('unique_locks')} l USING routed r
      WHERE l.queue = r.queue AND l.key = r.unique_key AND l.expires_at <= now()
      RETURNING 1
    ),
    locks AS (
      -- A live lock makes this insert fail with unique_locks_pkey: the whole statement,
      -- tasks included, is then undone. Reading expired_locks first makes its delete run first.
      INSERT INTO ${db.table('unique_locks')} (queue, key, task_id, expires_at)
      SELECT queue, unique_key, id, greatest(due, now()) + unique_ttl_ms * interval '1 millisecond'
      FROM routed WHERE unique_key IS NOT NULL AND (SELECT count(*) FROM expired_locks) >= 0
      RETURNING 1
    ),
    registered AS (
      INSERT INTO ${db.table('queues')} (name) SELECT DISTINCT queue FROM routed ON CONFLICT DO NOTHING
    ),
    t AS (
      INSERT INTO ${db.table('tasks')} (queue, id, type, payload, payload_bytes, headers, state, max_retry, timeout,
                                        deadline, unique_key, group_key, retention, run_at)
      SELECT queue, id, type, payload, payload_bytes, headers, state, max_retry, timeout_ms * interval '1 millisecond',
             deadline, unique_key, group_key, retention_ms * interval '1 millisecond',
             CASE state WHEN 'pending' THEN now() WHEN 'scheduled' THEN due END
      FROM routed ORDER BY ord
      RETURNING *
    ),
    notified AS (
      SELECT pg_notify(CASE WHEN s.pending THEN ${db.channels.tasks} ELSE ${db.channels.delayed} END, s.queue)
      FROM (SELECT DISTINCT state = 'pending', queue FROM t WHERE state <> 'aggregating') s(pending, queue)
    )
    SELECT ${taskColumns} FROM t WHERE (SELECT count(*) FROM notified) >= 0`;
  let rows: TaskRow[];
  try {
    rows = await db.run(query, tx);
  } catch (err) {
    throw translateConflict(err, records);
  }
  const byKey = new Map(rows.map((r) => [`${r.queue}\0${r.id}`, r]));
  return records.map((r) => toTaskInfo(byKey.get(`${r.queue}\0${r.id}`) as TaskRow));
}

/** Maps PostgreSQL's unique violations to the errors asynq users know. */
function translateConflict(err: unknown, records: TaskRecord[]): unknown {
  const e = err as { code?: string; constraint?: string; detail?: string };
  if (e.code !== '23505') return err;
  // detail: Key (queue, id)=(default, abc) already exists.
  const [queue = '', key = ''] = /=\((.*?), (.*)\) already exists/.exec(e.detail ?? '')?.slice(1) ?? [];
  if (e.constraint === 'tasks_pkey') return new TaskIdConflictError(queue, key);
  if (e.constraint === 'unique_locks_pkey') {
    const first = records.find((r) => r.queue === queue && r.uniqueKey === key);
    return new DuplicateTaskError(queue || (first?.queue ?? ''), key);
  }
  return err;
}

/** One task as TaskInfo, or undefined. */
export async function selectTask(db: Db, queue: string, id: string): Promise<TaskInfo | undefined> {
  const rows = await db.run(sql<TaskRow>`SELECT ${taskColumns} FROM ${db.table('tasks')} t WHERE t.queue = ${queue} AND t.id = ${id}`);
  return rows[0] && toTaskInfo(rows[0]);
}
