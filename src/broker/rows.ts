/**
 * The one projection of a task row that every read returns, and its mapping
 * to TaskInfo. Statements select `taskColumns` from a row aliased `t`.
 */
import { sql } from 'kysely';
import { decodePayload } from '../payload.js';
import type { TaskInfo, TaskState } from '../task.js';

export interface TaskRow {
  queue: string;
  id: string;
  type: string;
  payload: unknown;
  payload_bytes: Buffer | null;
  headers: Record<string, string>;
  state: TaskState;
  max_retry: number;
  retried: number;
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
}

/** Columns of TaskRow, computed from a tasks row aliased `t`, on the database clock. */
export const taskColumns = sql`
  t.queue, t.id, t.type, t.payload, t.payload_bytes, t.headers, t.state, t.max_retry, t.retried,
  (extract(epoch FROM t.timeout) * 1000)::float8 AS timeout_ms, t.deadline, t.group_key,
  CASE t.state WHEN 'pending' THEN now() WHEN 'scheduled' THEN t.run_at WHEN 'retry' THEN t.run_at END AS next_process_at,
  t.error_msg, t.last_failed_at, (extract(epoch FROM t.retention) * 1000)::float8 AS retention_ms,
  t.completed_at, t.result, t.result_bytes,
  (t.state = 'active' AND t.lease_expires_at < now()) AS is_orphaned,
  t.enqueued_at, t.started_at, t.lease_owner, t.lease_expires_at`;

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
  };
}
