/**
 * The projections of a task row and their mappings: `taskColumns` → TaskInfo,
 * what every read of the Inspector returns, and `previewColumns` →
 * TaskPreview, what the dashboard's lists show. Statements select them from a
 * row aliased `t`.
 */
import { sql, type RawBuilder } from 'kysely';
import { decodePayload } from '../model/payload.js';
import type { TaskInfo, TaskRef, TaskState } from '../model/task.js';
import type { Db } from './db.js';

/** Orders seqs (bigints as text) ascending: statements lock rows in seq order, so batches cannot deadlock. */
export const compareSeq = (a: string, b: string): number => (BigInt(a) < BigInt(b) ? -1 : BigInt(a) > BigInt(b) ? 1 : 0);

/**
 * What every read of a task returns, whatever it is for: which task, what it
 * runs, and how many of its attempts are spent. The claim (ClaimedRow), the
 * recoverer (ExpiredLease) and the Inspector (TaskRow) add their own fields.
 */
export interface TaskCore {
  queue: string;
  id: string;
  type: string;
  payload: unknown;
  payload_bytes: Buffer | null;
  headers: Record<string, string>;
  retried: number;
  max_retry: number;
}

export interface TaskRow extends TaskCore {
  state: TaskState;
  timeout_ms: number;
  deadline: Date | null;
  group_key: string | null;
  next_process_at: Date | null;
  error_msg: string | null;
  last_failed_at: Date | null;
  retention_ms: number;
  completed_at: Date | null;
  result: unknown;
  result_bytes: Buffer | null;
  is_orphaned: boolean;
  enqueued_at: Date;
  started_at: Date | null;
  lease_owner: string | null;
  lease_expires_at: Date | null;
  waiting_for: number | null;
  priority: number;
  concurrency_key: string | null;
  /** [queue, id] pairs; null for a task without dependencies. */
  depends_on: [string, string][] | null;
}

/** Columns of TaskRow, computed from a tasks row aliased `t`, on the database clock. */
export const taskColumns = (db: Db) => sql`
  t.queue, t.id, t.type, t.payload, t.payload_bytes, t.headers, t.state, t.max_retry, t.retried,
  (extract(epoch FROM t.timeout) * 1000)::float8 AS timeout_ms, t.deadline, t.group_key,
  CASE t.state WHEN 'pending' THEN now() WHEN 'scheduled' THEN t.run_at WHEN 'retry' THEN t.run_at END AS next_process_at,
  t.error_msg, t.last_failed_at, (extract(epoch FROM t.retention) * 1000)::float8 AS retention_ms,
  t.completed_at, t.result, t.result_bytes,
  (t.state = 'active' AND t.lease_expires_at < now()) AS is_orphaned,
  t.enqueued_at, t.started_at, t.lease_owner, t.lease_expires_at, t.waiting_for, t.priority, t.concurrency_key,
  CASE WHEN t.waiting_for IS NOT NULL THEN
    (SELECT pg_catalog.json_agg(pg_catalog.json_build_array(d.dependency_queue, d.dependency_id) ORDER BY d.dependency_seq)
     FROM ${db.table('task_dependencies')} d WHERE d.dependent_seq = t.seq)
  END AS depends_on`;

export function toTaskInfo(r: TaskRow): TaskInfo {
  return {
    id: r.id,
    queue: r.queue,
    type: r.type,
    payload: decodePayload(r.payload, r.payload_bytes),
    state: r.state,
    maxRetry: r.max_retry,
    retried: r.retried,
    lastError: r.error_msg,
    lastFailedAt: r.last_failed_at,
    timeout: r.timeout_ms,
    deadline: r.deadline,
    group: r.group_key,
    nextProcessAt: r.next_process_at,
    isOrphaned: r.is_orphaned,
    retention: r.retention_ms,
    completedAt: r.completed_at,
    result: decodePayload(r.result, r.result_bytes),
    headers: r.headers,
    enqueuedAt: r.enqueued_at,
    startedAt: r.started_at,
    leaseOwner: r.lease_owner,
    leaseExpiresAt: r.lease_expires_at,
    dependsOn: (r.depends_on ?? []).map(([queue, id]) => ({ queue, id })),
    waitingFor: r.waiting_for ?? 0,
    priority: r.priority,
    concurrencyKey: r.concurrency_key,
  };
}

/** Characters of a payload or result a preview carries: one more than a list shows, so it knows to add "…". */
export const PREVIEW_CHARS = 201;
/** Characters of a last error a preview carries (a list shows 120, and up to this many on hover). */
export const ERROR_PREVIEW_CHARS = 500;
/** Dependencies a waiting task's preview names (the list shows them and "…" for the rest). */
export const DEPENDS_PREVIEW = 5;

/**
 * A task as a list of the dashboard shows it: no headers, and the payload,
 * result and last error cut short by PostgreSQL, so a page of tasks over
 * megabyte payloads stays a few kilobytes wherever it goes (pool, process,
 * browser). Not part of the public API: the Inspector's lists return TaskInfo.
 */
export interface TaskPreview {
  id: string;
  queue: string;
  type: string;
  state: TaskState;
  maxRetry: number;
  retried: number;
  /** The payload's first PREVIEW_CHARS characters as JSON text, or `<n bytes> 0a1b…`; '' without one; null when hidden. */
  payload: string | null;
  /** As `payload`, for the result. */
  result: string | null;
  /** The last error's first ERROR_PREVIEW_CHARS characters; null without one, or when hidden. */
  lastError: string | null;
  lastFailedAt: Date | null;
  group: string | null;
  nextProcessAt: Date | null;
  isOrphaned: boolean;
  retention: number;
  completedAt: Date | null;
  /** Dependencies not yet settled; 0 for a task that is not waiting. */
  waitingFor: number;
  /**
   * A waiting task's first DEPENDS_PREVIEW dependencies, the unfinished ones
   * first (what it still waits for), each in the order they were enqueued,
   * with how each settled one ended (null: not yet); [] in any other state.
   */
  dependsOn: (TaskRef & { outcome: 'completed' | 'failed' | null })[];
  /** How many dependencies a waiting task has in all; 0 in any other state. */
  dependsTotal: number;
}

export interface TaskPreviewRow {
  queue: string;
  id: string;
  type: string;
  state: TaskState;
  max_retry: number;
  retried: number;
  payload_preview: string | null;
  result_preview: string | null;
  error_preview: string | null;
  last_failed_at: Date | null;
  group_key: string | null;
  next_process_at: Date | null;
  is_orphaned: boolean;
  retention_ms: number;
  completed_at: Date | null;
  waiting_for: number | null;
  /** [queue, id, outcome] triples; null unless waiting. */
  depends_preview: [string, string, 'completed' | 'failed' | null][] | null;
  depends_total: number | null;
}

/**
 * A preview of a jsonb column and its bytea twin, as text: the first
 * PREVIEW_CHARS characters of the JSON, or the size and first 48 bytes in hex.
 * Only bytea's first bytes are read (substring and octet_length do not
 * detoast the whole value); jsonb is turned into text in PostgreSQL, and only
 * the cut text leaves it. NULL when `hide` is true: then nothing leaves it.
 */
export function previewOf(json: RawBuilder<unknown>, bytes: RawBuilder<unknown>, hide: boolean): RawBuilder<unknown> {
  return sql`CASE
    WHEN ${hide}::boolean THEN NULL
    WHEN ${bytes} IS NOT NULL THEN '<' || octet_length(${bytes}) || ' bytes> ' || encode(substring(${bytes} FROM 1 FOR 48), 'hex')
                                   || CASE WHEN octet_length(${bytes}) > 48 THEN '…' ELSE '' END
    ELSE coalesce(left(${json}::text, ${PREVIEW_CHARS}), '') END`;
}

/**
 * Columns of TaskPreviewRow from a tasks row aliased `t`; `hide` leaves out
 * payload, result and last error (not the dependencies' names: they are ids,
 * not content). The edges are read for waiting tasks only, the one tab that
 * shows them, so a list of tasks in any other state reads no more than before
 * (the primary key of task_dependencies finds a task's edges; ordering the
 * few shown sorts at most MAX_DEPENDENCIES of them).
 */
export function previewColumns(db: Db, hide: boolean): RawBuilder<unknown> {
  return sql`
  t.queue, t.id, t.type, t.state, t.max_retry, t.retried,
  ${previewOf(sql`t.payload`, sql`t.payload_bytes`, hide)} AS payload_preview,
  ${previewOf(sql`t.result`, sql`t.result_bytes`, hide)} AS result_preview,
  CASE WHEN ${hide}::boolean THEN NULL ELSE left(t.error_msg, ${ERROR_PREVIEW_CHARS}) END AS error_preview,
  t.last_failed_at, t.group_key,
  CASE t.state WHEN 'pending' THEN now() WHEN 'scheduled' THEN t.run_at WHEN 'retry' THEN t.run_at END AS next_process_at,
  (t.state = 'active' AND t.lease_expires_at < now()) AS is_orphaned,
  (extract(epoch FROM t.retention) * 1000)::float8 AS retention_ms, t.completed_at,
  CASE WHEN t.state = 'waiting' THEN t.waiting_for END AS waiting_for,
  CASE WHEN t.state = 'waiting' THEN
    (SELECT pg_catalog.json_agg(pg_catalog.json_build_array(d.dependency_queue, d.dependency_id, d.outcome) ORDER BY d.outcome IS NOT NULL, d.dependency_seq)
     FROM (SELECT d.dependency_queue, d.dependency_id, d.outcome, d.dependency_seq FROM ${db.table('task_dependencies')} d
           WHERE d.dependent_seq = t.seq ORDER BY d.outcome IS NOT NULL, d.dependency_seq LIMIT ${DEPENDS_PREVIEW}) d)
  END AS depends_preview,
  CASE WHEN t.state = 'waiting' THEN
    (SELECT pg_catalog.count(*)::float8 FROM ${db.table('task_dependencies')} d WHERE d.dependent_seq = t.seq)
  END AS depends_total`;
}

export function toTaskPreview(r: TaskPreviewRow): TaskPreview {
  return {
    id: r.id,
    queue: r.queue,
    type: r.type,
    state: r.state,
    maxRetry: r.max_retry,
    retried: r.retried,
    payload: r.payload_preview,
    result: r.result_preview,
    lastError: r.error_preview,
    lastFailedAt: r.last_failed_at,
    group: r.group_key,
    nextProcessAt: r.next_process_at,
    isOrphaned: r.is_orphaned,
    retention: r.retention_ms,
    completedAt: r.completed_at,
    waitingFor: r.waiting_for ?? 0,
    dependsOn: (r.depends_preview ?? []).map(([queue, id, outcome]) => ({ queue, id, outcome })),
    dependsTotal: r.depends_total ?? 0,
  };
}
