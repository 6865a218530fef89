/**
 * The projections of a task row beside TaskInfo's (task-columns.ts):
 * `previewColumns` → TaskPreview, what the dashboard's lists show, and
 * `taskPageColumns` → TaskPageInfo, its task page. Statements select them
 * from a row aliased `t`.
 */
import { sql, type RawBuilder } from 'kysely';
import {
  DEPENDS_PREVIEW,
  ERROR_PREVIEW_CHARS,
  PAGE_VALUE_CHARS,
  PREVIEW_CHARS,
  type TaskPageInfo,
  type TaskPreview,
  type ValueExcerpt,
} from '../model/previews.js';
import type { TaskState } from '../model/task.js';
import type { Db } from './db.js';
import { taskFacts, toTaskInfo, type TaskRow } from './task-columns.js';

/** Orders seqs (bigints as text) ascending: statements lock rows in seq order, so batches cannot deadlock. */
export const compareSeq = (a: string, b: string): number => (BigInt(a) < BigInt(b) ? -1 : BigInt(a) > BigInt(b) ? 1 : 0);

/**
 * What every read of a task returns, whatever it is for: which task, what it
 * runs, and how many of its attempts are spent. The claim (ClaimedRow), the
 * recoverer (loadInputs) add their own fields; the Inspector reads all of
 * TaskInfo (task-columns.ts).
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
  CASE t.state WHEN 'pending' THEN ${db.now()} WHEN 'scheduled' THEN t.run_at WHEN 'retry' THEN t.run_at END AS next_process_at,
  (t.state = 'active' AND t.lease_expires_at < ${db.now()}) AS is_orphaned,
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

/** Columns `<name>_text`, `_head`, `_size`, `_cut` of the excerpt of a value: JSON or text `text` (computed once), bytea `bytes`. */
function excerptColumns(name: string, text: RawBuilder<unknown>, bytes: RawBuilder<unknown> | null): RawBuilder<unknown> {
  const n = sql.lit(PAGE_VALUE_CHARS);
  const id = (suffix: string) => sql.id(`${name}_${suffix}`);
  if (bytes === null) {
    return sql`pg_catalog.left(${text}, ${n}) AS ${id('text')}, NULL::bytea AS ${id('head')},
      pg_catalog.octet_length(${text})::float8 AS ${id('size')}, pg_catalog.length(${text}) > ${n} AS ${id('cut')}`;
  }
  return sql`CASE WHEN ${bytes} IS NULL THEN pg_catalog.left(${text}, ${n}) END AS ${id('text')},
    substring(${bytes} FROM 1 FOR ${n}) AS ${id('head')},
    coalesce(pg_catalog.octet_length(${bytes}), pg_catalog.octet_length(${text}))::float8 AS ${id('size')},
    coalesce(pg_catalog.octet_length(${bytes}) > ${n}, pg_catalog.length(${text}) > ${n}) AS ${id('cut')}`;
}

/**
 * From a tasks row aliased `t`: the facts of TaskRow, and excerpts of its
 * values (each JSON value turned into text once, in PostgreSQL, and only
 * PAGE_VALUE_CHARS of it sent). With `hide` the values' columns are not in
 * the statement at all, only whether a result and a last error exist.
 */
export function taskPageColumns(db: Db, hide: boolean): RawBuilder<unknown> {
  if (hide) {
    return sql`${taskFacts(db)}, (t.result IS NOT NULL OR t.result_bytes IS NOT NULL) AS has_result, t.error_msg IS NOT NULL AS has_error`;
  }
  return sql`${taskFacts(db)}, true AS has_result, true AS has_error,
    ${excerptColumns('payload', sql`v.payload`, sql`t.payload_bytes`)}, ${excerptColumns('result', sql`v.result`, sql`t.result_bytes`)},
    ${excerptColumns('headers', sql`v.headers`, null)}, ${excerptColumns('error', sql`t.error_msg`, null)}`;
}

/** What taskPageColumns() joins for a visible page: the JSON values of `t` as text, computed once (OFFSET 0 keeps them from being inlined). */
export const pageValuesJoin = sql`LEFT JOIN LATERAL (
  SELECT t.payload::text AS payload, t.result::text AS result, t.headers::text AS headers OFFSET 0) v ON true`;

type ExcerptRow<N extends string> = { [K in `${N}_text`]: string | null } & { [K in `${N}_head`]: Buffer | null } & {
  [K in `${N}_size`]: number | null;
} & { [K in `${N}_cut`]: boolean | null };

export type TaskPageRow = TaskRow & {
  has_result: boolean;
  has_error: boolean;
} & Partial<ExcerptRow<'payload'> & ExcerptRow<'result'> & ExcerptRow<'headers'> & ExcerptRow<'error'>>;

function excerpt(
  kind: 'json' | 'text',
  text: string | null | undefined,
  head: Buffer | null | undefined,
  size: number | null | undefined,
  cut: boolean | null | undefined,
): ValueExcerpt | null {
  if (head != null) return { kind: 'bytes', head, bytes: size ?? head.length, truncated: cut === true };
  if (text == null) return null;
  return { kind, head: text, bytes: size ?? 0, truncated: cut === true };
}

export function toTaskPageInfo(r: TaskPageRow, hide: boolean): TaskPageInfo {
  const {
    payload: _p,
    result: _r,
    headers: _h,
    lastError: _e,
    ...facts
  } = toTaskInfo({
    ...r,
    payload: null,
    payload_bytes: null,
    headers: {},
    error_msg: null,
    result: null,
    result_bytes: null,
  });
  if (hide) {
    return { ...facts, payload: 'hidden', result: r.has_result ? 'hidden' : null, headers: 'hidden', lastError: r.has_error ? 'hidden' : null };
  }
  return {
    ...facts,
    payload: excerpt('json', r.payload_text, r.payload_head, r.payload_size, r.payload_cut),
    result: excerpt('json', r.result_text, r.result_head, r.result_size, r.result_cut),
    headers: excerpt('json', r.headers_text, null, r.headers_size, r.headers_cut) ?? { kind: 'json', head: '{}', bytes: 2, truncated: false },
    lastError: excerpt('text', r.error_text, null, r.error_size, r.error_cut),
  };
}
