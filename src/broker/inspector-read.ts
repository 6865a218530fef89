/**
 * The Inspector's reads. Every statement that takes a queue also says whether
 * the queue exists, in the same round trip, so "no such queue" and "nothing
 * there" are told apart without a second query (or a race between two).
 * Counts are float8 (exact up to 2^53) so they arrive as numbers, not strings.
 */
import { sql, type RawBuilder } from 'kysely';
import { QueueNotFoundError } from '../model/errors.js';
import { decodePayload } from '../model/payload.js';
import type { TaskInfo, TaskState } from '../model/task.js';
import type { DailyStats, GroupInfo, QueueInfo, SchedulerEnqueueEvent, SchedulerEntry, ServerInfo } from '../model/inspector-types.js';
import type { ServerPreview, ServerWith, TaskPageInfo, TaskPreview } from '../model/previews.js';
import type { Db } from './db.js';
import { pageValuesJoin, previewColumns, previewOf, taskPageColumns, toTaskPageInfo, toTaskPreview, type TaskPageRow, type TaskPreviewRow } from './rows.js';
import { taskColumns, toTaskInfo, type TaskRow } from './task-columns.js';

/** A result about one queue: `queueFound` is false when the queue does not exist. */
export interface InQueue<T> {
  queueFound: boolean;
  value: T;
}

/** A result's value, or QueueNotFoundError when its queue does not exist. */
export function inQueue<T>(queue: string, r: InQueue<T>): T {
  if (!r.queueFound) throw new QueueNotFoundError(queue);
  return r.value;
}

/** Every queue's name, in name order (asynq's Queues, sorted). */
export async function listQueues(db: Db): Promise<string[]> {
  const rows = await db.run(sql<{ name: string }>`SELECT name FROM ${db.table('queues')} ORDER BY name`);
  return rows.map((r) => r.name);
}

/**
 * One queue's row of the queue_stats view (migration 0002): counts per state,
 * latency, today's and all-time processed/failed. Undefined when the queue
 * does not exist.
 */
export async function queueStats(db: Db, queue: string): Promise<QueueInfo | undefined> {
  const rows = await db.run(sql<Omit<QueueInfo, 'limits'> & LimitColumns>`
    SELECT s.queue, s.size::float8 AS size, s.groups::float8 AS groups, s.latency_ms AS latency,
           s.pending::float8 AS pending, s.active::float8 AS active, s.scheduled::float8 AS scheduled,
           s.retry::float8 AS retry, s.archived::float8 AS archived, s.completed::float8 AS completed,
           s.aggregating::float8 AS aggregating, s.waiting::float8 AS waiting, s.processed::float8 AS processed, s.failed::float8 AS failed,
           s.processed_total::float8 AS "processedTotal", s.failed_total::float8 AS "failedTotal",
           s.paused, s.timestamp, q.concurrency, q.key_concurrency, q.rate_limit, q.rate_interval_ms
    FROM ${db.table('queue_stats')} s JOIN ${db.table('queues')} q ON q.name = s.queue
    WHERE s.queue = ${queue}`);
  const r = rows[0];
  if (r === undefined) return undefined;
  const { concurrency, key_concurrency, rate_limit, rate_interval_ms, ...info } = r;
  return {
    ...info,
    limits: {
      concurrency,
      keyConcurrency: key_concurrency,
      rateLimit: rate_limit === null || rate_interval_ms === null ? null : { limit: rate_limit, interval: rate_interval_ms },
    },
  };
}

/** A queue's limits as the queues table holds them. */
interface LimitColumns {
  concurrency: number | null;
  key_concurrency: number | null;
  rate_limit: number | null;
  rate_interval_ms: number | null;
}

/**
 * The last `days` UTC days of a queue's processed/failed counts, today first,
 * zeros for days without a row. `date` is the day's UTC midnight. No rows:
 * the queue does not exist.
 */
export async function dailyStats(db: Db, queue: string, days: number): Promise<DailyStats[]> {
  return db.run(sql<DailyStats>`
    SELECT q.name AS queue, ((today.d - g.i)::timestamp AT TIME ZONE 'UTC') AS date,
           coalesce(s.processed, 0)::float8 AS processed, coalesce(s.failed, 0)::float8 AS failed
    FROM ${db.table('queues')} q
    CROSS JOIN (SELECT (${db.now()} AT TIME ZONE 'UTC')::date AS d) today
    CROSS JOIN generate_series(0, ${days}::int - 1) AS g(i)
    LEFT JOIN ${db.table('daily_stats')} s ON s.queue = q.name AND s.day = today.d - g.i
    WHERE q.name = ${queue}
    ORDER BY g.i`);
}

/** One task as TaskInfo (undefined: no such task), and whether its queue exists. */
export async function taskInfo(db: Db, queue: string, id: string): Promise<InQueue<TaskInfo | undefined>> {
  const rows = await db.run(sql<{ queue_found: boolean } & TaskRow>`
    SELECT EXISTS (SELECT 1 FROM ${db.table('queues')} WHERE name = ${queue}) AS queue_found, ${taskColumns(db)}
    FROM (SELECT 1) one
    LEFT JOIN ${db.table('tasks')} t ON t.queue = ${queue} AND t.id = ${id}`);
  const row = rows[0];
  return { queueFound: row?.queue_found ?? false, value: row?.id == null ? undefined : toTaskInfo(row) };
}

/**
 * The queues that hold a task with this id, by name ([] when none does).
 * Task ids are unique per queue, not across queues: one probe of the
 * (queue, id) key per queue, so the cost grows with the number of queues,
 * never with the number of tasks.
 */
export async function queuesWithTask(db: Db, id: string): Promise<string[]> {
  const rows = await db.run(sql<{ name: string }>`
    SELECT q.name FROM ${db.table('queues')} q
    WHERE EXISTS (SELECT 1 FROM ${db.table('tasks')} t WHERE t.queue = q.name AND t.id = ${id})
    ORDER BY q.name`);
  return rows.map((r) => r.name);
}

/**
 * One task for the dashboard's task page (undefined: no such task), and
 * whether its queue exists: its payload, result, headers and last error cut
 * to PAGE_VALUE_CHARS in PostgreSQL, or with `hide` not read at all.
 */
export async function taskPageInfo(db: Db, queue: string, id: string, hide: boolean): Promise<InQueue<TaskPageInfo | undefined>> {
  const rows = await db.run(sql<{ queue_found: boolean } & TaskPageRow>`
    SELECT EXISTS (SELECT 1 FROM ${db.table('queues')} WHERE name = ${queue}) AS queue_found, ${taskPageColumns(db, hide)}
    FROM (SELECT 1) one
    LEFT JOIN ${db.table('tasks')} t ON t.queue = ${queue} AND t.id = ${id}
    ${hide ? sql`` : pageValuesJoin}`);
  const row = rows[0];
  return { queueFound: row?.queue_found ?? false, value: row?.id == null ? undefined : toTaskPageInfo(row, hide) };
}

/** Always true of an active row; saying it lets the planner use tasks_active_idx (migration 0003). */
const ACTIVE_INDEXED = sql`AND t.lease_owner IS NOT NULL`;

/**
 * The order each list is paged in, as the index of that state serves it:
 * pending in run order, scheduled and retry by due time, archived by archive
 * time, completed by the end of retention (asynq's scores), active by start,
 * aggregating and waiting by enqueue time. `seq` breaks ties, so pages never overlap.
 */
const LIST_ORDER: Record<TaskState, RawBuilder<unknown>> = {
  // The claim's order: higher priority first, FIFO within one (task_states_pending_idx).
  pending: sql`t.priority DESC, t.pending_seq`,
  active: sql`t.started_at, t.seq`,
  scheduled: sql`t.run_at, t.seq`,
  retry: sql`t.run_at, t.seq`,
  archived: sql`t.run_at, t.seq`,
  completed: sql`t.run_at, t.seq`,
  aggregating: sql`t.enqueued_at, t.seq`,
  // seq is enqueue order, and task_states_waiting_idx's.
  waiting: sql`t.seq`,
};

/** Which page of which tasks: rows `offset` to `offset + limit - 1` in LIST_ORDER, of `group` for aggregating tasks. */
export interface TaskPage {
  limit: number;
  offset: number;
  group?: string | undefined;
}

/**
 * A page of a queue's tasks in `state`, as `columns` of a row aliased `t`.
 * One statement: the queue row is the outer side of a lateral join, so an
 * empty page of an existing queue still returns one (all-NULL) row, and no
 * row at all means no such queue.
 */
function tasksPage(db: Db, columns: RawBuilder<unknown>, queue: string, state: TaskState, page: TaskPage): RawBuilder<{ id: string | null }> {
  const order = LIST_ORDER[state];
  return sql<{ id: string | null }>`
    SELECT ${columns}
    FROM ${db.table('queues')} q
    LEFT JOIN LATERAL (
      SELECT t.* FROM ${db.table('tasks')} t
      WHERE t.queue = q.name AND t.state = ${state} ${state === 'active' ? ACTIVE_INDEXED : sql``}
        AND (${page.group ?? null}::text IS NULL OR t.group_key = ${page.group ?? null})
      ORDER BY ${order} LIMIT ${page.limit} OFFSET ${page.offset}
    ) t ON true
    WHERE q.name = ${queue}
    ORDER BY ${order}`;
}

/** A page of a queue's tasks in `state` as TaskInfo: whole rows, payloads and results included. */
export async function listTasks(db: Db, queue: string, state: TaskState, page: TaskPage): Promise<InQueue<TaskInfo[]>> {
  const rows = (await db.run(tasksPage(db, taskColumns(db), queue, state, page))) as unknown as TaskRow[];
  return { queueFound: rows.length > 0, value: rows.filter((r) => r.id != null).map(toTaskInfo) };
}

/**
 * The same page as previews (the dashboard's lists): payload, result and
 * last error cut short in PostgreSQL, no headers; with `hide`, none of the
 * three. What one call can load is bounded by `limit` times a few kilobytes.
 */
export async function listTaskPreviews(db: Db, queue: string, state: TaskState, page: TaskPage, hide: boolean): Promise<InQueue<TaskPreview[]>> {
  const rows = (await db.run(tasksPage(db, previewColumns(db, hide), queue, state, page))) as unknown as TaskPreviewRow[];
  return { queueFound: rows.length > 0, value: rows.filter((r) => r.id != null).map(toTaskPreview) };
}

/**
 * What /metrics estimates about a queue, measured in PostgreSQL so that no
 * payload leaves it: for each of `states`, the mean size in bytes of up to
 * `sample` of its tasks (payload and result as JSON text or bytes, last error,
 * headers, id, type: the fields TaskInfo carries), and the number of active
 * tasks whose lease expired (orphans no recoverer has taken yet).
 */
export async function queueFootprint(
  db: Db,
  queue: string,
  states: readonly TaskState[],
  sample: number,
): Promise<{ meanBytes: Map<TaskState, number>; orphaned: number }> {
  const rows = await db.run(sql<{ state: TaskState | null; mean: number }>`
    SELECT s.state, pg_catalog.avg(
             coalesce(octet_length(t.payload::text), octet_length(t.payload_bytes), 4)
           + coalesce(octet_length(t.result::text), octet_length(t.result_bytes), 0)
           + coalesce(octet_length(t.error_msg), 0) + octet_length(t.headers::text)
           + octet_length(t.id) + octet_length(t.type))::float8 AS mean
    FROM pg_catalog.unnest(${states}::text[]) AS s(state)
    CROSS JOIN LATERAL (
      SELECT * FROM ${db.table('tasks')} t WHERE t.queue = ${queue} AND t.state = s.state LIMIT ${sample}
    ) t
    GROUP BY s.state
    UNION ALL
    SELECT NULL, pg_catalog.count(*)::float8 FROM ${db.table('tasks')} t
    WHERE t.queue = ${queue} AND t.state = 'active' ${ACTIVE_INDEXED} AND t.lease_expires_at < ${db.now()}`);
  const meanBytes = new Map<TaskState, number>();
  let orphaned = 0;
  for (const r of rows) {
    if (r.state === null) orphaned = r.mean;
    else meanBytes.set(r.state, r.mean);
  }
  return { meanBytes, orphaned };
}

/** The groups of a queue's aggregating tasks with their sizes, by group name. */
export async function listGroups(db: Db, queue: string): Promise<InQueue<GroupInfo[]>> {
  const rows = await db.run(sql<{ group: string | null; size: number }>`
    SELECT g.group_key AS "group", g.size
    FROM ${db.table('queues')} q
    LEFT JOIN LATERAL (
      SELECT t.group_key, pg_catalog.count(*)::float8 AS size FROM ${db.table('tasks')} t
      WHERE t.queue = q.name AND t.state = 'aggregating'
      GROUP BY t.group_key
    ) g ON true
    WHERE q.name = ${queue}
    ORDER BY g.group_key`);
  return { queueFound: rows.length > 0, value: rows.filter((r) => r.group !== null) as GroupInfo[] };
}

interface ServerTaskRow {
  id: string;
  host: string;
  pid: number;
  concurrency: number;
  queues: Record<string, number>;
  strict_priority: boolean;
  status: string;
  started_at: Date;
  task_id: string | null;
  task_queue: string;
  task_type: string;
  task_started_at: Date;
  lease_expires_at: Date;
  deadline: Date | null;
}

/**
 * Live servers (row not expired), oldest first, one row per (server, active
 * task it holds a lease on), or one row with NULL task columns for an idle
 * server, with `payload` columns of the task. A worker's deadline is the
 * earlier of its attempt's timeout and the task's deadline, as asynq's
 * WorkerInfo.Deadline.
 */
function serverRows<P>(db: Db, payload: RawBuilder<unknown>): RawBuilder<ServerTaskRow & P> {
  return sql<ServerTaskRow & P>`
    SELECT s.id, s.host, s.pid, s.concurrency, s.queues, s.strict_priority, s.status, s.started_at,
           t.id AS task_id, t.queue AS task_queue, t.type AS task_type, ${payload},
           t.started_at AS task_started_at, t.lease_expires_at,
           least(CASE WHEN t.timeout > interval '0' THEN t.started_at + t.timeout END, t.deadline) AS deadline
    FROM ${db.table('servers')} s
    LEFT JOIN ${db.table('tasks')} t ON t.lease_owner = s.id AND t.state = 'active'
    WHERE s.expires_at > ${db.now()}
    ORDER BY s.started_at, s.id, t.started_at, t.queue, t.id`;
}

/** Server rows grouped into servers, each worker's payload made by `payloadOf`. */
function groupServers<R extends ServerTaskRow, P>(rows: R[], payloadOf: (r: R) => P): ServerWith<P>[] {
  const servers = new Map<string, ServerWith<P>>();
  for (const r of rows) {
    let s = servers.get(r.id);
    if (!s) {
      s = {
        id: r.id,
        host: r.host,
        pid: r.pid,
        concurrency: r.concurrency,
        queues: r.queues,
        strictPriority: r.strict_priority,
        status: r.status,
        startedAt: r.started_at,
        activeWorkers: [],
      };
      servers.set(r.id, s);
    }
    if (r.task_id === null) continue;
    s.activeWorkers.push({
      taskId: r.task_id,
      queue: r.task_queue,
      type: r.task_type,
      payload: payloadOf(r),
      startedAt: r.task_started_at,
      leaseExpiresAt: r.lease_expires_at,
      deadline: r.deadline,
    });
  }
  return [...servers.values()];
}

/** Live servers, oldest first, each with the tasks it is running and their whole payloads. */
export async function listServers(db: Db): Promise<ServerInfo[]> {
  const rows = await db.run(serverRows<{ payload: unknown; payload_bytes: Buffer | null }>(db, sql`t.payload, t.payload_bytes`));
  return groupServers(rows, (r) => decodePayload(r.payload, r.payload_bytes));
}

/** listServers with payload previews: what a server runs costs a few hundred bytes per task, however large its payload. */
export async function listServerPreviews(db: Db, hide: boolean): Promise<ServerPreview[]> {
  const rows = await db.run(
    serverRows<{ payload_preview: string | null }>(db, sql`${previewOf(sql`t.payload`, sql`t.payload_bytes`, hide)} AS payload_preview`),
  );
  return groupServers(rows, (r) => r.payload_preview);
}

/** Cron entries of live schedulers (row not expired), by id. */
export async function listSchedulerEntries(db: Db): Promise<SchedulerEntry[]> {
  const rows = await db.run(sql<{
    id: string;
    spec: string;
    task_type: string;
    payload: unknown;
    payload_bytes: Buffer | null;
    options: Record<string, unknown>;
    next_run_at: Date | null;
    prev_run_at: Date | null;
  }>`
    SELECT id, spec, task_type, payload, payload_bytes, options, next_run_at, prev_run_at
    FROM ${db.table('scheduler_entries')} WHERE expires_at > ${db.now()} ORDER BY id`);
  return rows.map((r) => ({
    id: r.id,
    spec: r.spec,
    task: { type: r.task_type, payload: decodePayload(r.payload, r.payload_bytes) },
    options: r.options,
    next: r.next_run_at,
    prev: r.prev_run_at,
  }));
}

/** A page of an entry's enqueue history, newest tick first (the primary key's order). */
export async function listSchedulerEvents(db: Db, entryId: string, limit: number, offset: number): Promise<SchedulerEnqueueEvent[]> {
  return db.run(sql<SchedulerEnqueueEvent>`
    SELECT task_id AS "taskId", enqueued_at AS "enqueuedAt", tick_at AS "tickAt"
    FROM ${db.table('scheduler_events')} WHERE entry_id = ${entryId}
    ORDER BY tick_at DESC LIMIT ${limit} OFFSET ${offset}`);
}

/** At most this many tasks of one type are read for pgasynq/testing's enqueue assertions. */
export const MAX_TASKS_OF_TYPE = 1000;

/**
 * pgasynq/testing's requireEnqueued(): the tasks of `type` in any state, in
 * `queue` or in every queue, oldest enqueue first, whole rows (payloads
 * included), at most MAX_TASKS_OF_TYPE.
 */
export async function listTasksOfType(db: Db, type: string, queue: string | undefined): Promise<TaskInfo[]> {
  const rows = (await db.run(sql`
    SELECT ${taskColumns(db)} FROM ${db.table('tasks')} t
    WHERE t.type = ${type} AND (${queue ?? null}::text IS NULL OR t.queue = ${queue ?? null})
    ORDER BY t.seq LIMIT ${MAX_TASKS_OF_TYPE}`)) as unknown as TaskRow[];
  return rows.map(toTaskInfo);
}

/**
 * pgasynq/testing's drain(): how many tasks in `queues` (every queue when
 * null) a server could still run now: pending, active, or scheduled or
 * retrying and already due. Waiting, aggregating, archived and completed
 * tasks, and those due later, are not work left.
 */
export async function countRunnableTasks(db: Db, queues: readonly string[] | null): Promise<number> {
  const [row] = await db.run(sql<{ n: number }>`
    SELECT pg_catalog.count(*)::int AS n FROM ${db.table('tasks')} t
    WHERE (${queues}::text[] IS NULL OR t.queue = ANY (${queues}::text[]))
      AND (t.state IN ('pending', 'active') OR (t.state IN ('scheduled', 'retry') AND t.run_at <= ${db.now()}))`);
  return row!.n;
}
