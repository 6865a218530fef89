/**
 * Enqueue: one statement for any number of tasks, so enqueueMany is one round
 * trip and all-or-nothing. The unique locks, the queue registry, the rows and
 * one NOTIFY per (channel, queue) are all written by that statement.
 * Given ids and unique keys go in in key order, not the caller's: two
 * enqueueMany calls holding the same ones in different orders would otherwise
 * deadlock on each other's uncommitted keys (fault test F17).
 */
import { sql } from 'kysely';
import { DuplicateTaskError, TaskIdConflictError } from '../model/errors.js';
import type { TaskInfo, TaskRecord, TaskState } from '../model/task.js';
import type { DependencyPlan, PlannedTask } from '../model/workflow.js';
import type { Db, Transactional } from './db.js';
import { taskColumns, toTaskInfo, type TaskRow } from './rows.js';

/**
 * The tasks as one JSON array: a single parameter that PostgreSQL parses
 * natively, instead of fifteen arrays that pg would escape element by element
 * in JavaScript. Short keys, and an option at its zero value (no deadline, no
 * group, …) left out: a bulk enqueue sends tens of thousands of these, and
 * the bytes are built, sent and parsed once each. Payloads were encoded once,
 * at `new Task`, and go in as they are.
 */
export function toJsonRows(records: TaskRecord[], plan?: DependencyPlan): string {
  const parts = new Array<string>(records.length);
  for (let n = 0; n < records.length; n++) {
    const r = records[n]!;
    const p = plan?.tasks[n];
    let row = `{"i":${JSON.stringify(r.id)},"q":${JSON.stringify(r.queue)},"t":${JSON.stringify(r.type)},"m":${r.maxRetry},"to":${r.timeoutMs}`;
    if (r.payload.json !== null) row += `,"p":${r.payload.json}`;
    if (r.payload.bytes) row += `,"b":"${r.payload.bytes.toString('hex')}"`;
    if (hasKeys(r.headers)) row += `,"h":${JSON.stringify(r.headers)}`;
    if (r.deadline) row += `,"d":"${r.deadline.toISOString()}"`;
    if (r.uniqueKey !== null) row += `,"u":${JSON.stringify(r.uniqueKey)},"ut":${r.uniqueTtlMs}`;
    if (r.group !== null) row += `,"g":${JSON.stringify(r.group)}`;
    if (r.retentionMs !== 0) row += `,"r":${r.retentionMs}`;
    if (r.processAt) row += `,"at":"${r.processAt.toISOString()}"`;
    if (r.processInMs !== null) row += `,"in":${r.processInMs}`;
    if (r.priority !== 0) row += `,"pr":${r.priority}`;
    if (r.concurrencyKey !== null) row += `,"k":${JSON.stringify(r.concurrencyKey)}`;
    if (p?.waitingFor != null) row += `,"w":${p.waitingFor}`;
    if (p?.archivedBecause != null) row += `,"x":${JSON.stringify(p.archivedBecause)}`;
    if (p?.hasDependents) row += `,"hd":true`;
    parts[n] = row + '}';
  }
  return `[${parts.join(',')}]`;
}

function hasKeys(o: object): boolean {
  for (const _ in o) return true;
  return false;
}

/**
 * The inputs in key order (see the header) or in the caller's order, each numbered in
 * the caller's order: nextval() in the select list of `numbered` runs after its sort,
 * so seq — and with it the pending order — is FIFO within the batch either way.
 * A pending task's position is its own seq.
 */
const insertRows = (db: Db, keyed: boolean, planned: boolean) => sql`
    -- A transaction id before any position is drawn: the claim cursor (server/cursor.ts)
    -- relies on every transaction that draws one having an id already.
    tx AS MATERIALIZED (SELECT pg_current_xact_id() AS xid),
    numbered AS (
      SELECT r.*, nextval(${db.qualified('task_seq')}) AS seq FROM (SELECT * FROM routed ORDER BY ord) r
      WHERE (SELECT xid FROM tx) IS NOT NULL
    ),
    inputs AS (
      INSERT INTO ${db.table('task_inputs')} (seq, queue, id, type, payload, payload_bytes, headers, max_retry, timeout,
                                              deadline, unique_key, retention)
      SELECT seq, queue, id, type, payload, payload_bytes, headers, max_retry, timeout_ms * interval '1 millisecond',
             deadline, unique_key, retention_ms * interval '1 millisecond'
      FROM numbered ORDER BY ${keyed ? sql`queue, id` : sql`seq`}
    ),
    states AS (
      INSERT INTO ${db.table('task_states')} (seq, queue, state, pending_seq, run_at, group_key, priority, concurrency_key${
        planned ? sql`, waiting_for, has_dependents, error_msg, last_failed_at` : sql``
      })
      SELECT seq, queue, state, CASE WHEN state = 'pending' THEN seq END, run_at, group_key, priority, concurrency_key${
        planned ? sql`, waiting_for, coalesce(has_dependents, false), archived_because, CASE WHEN state = 'archived' THEN ${db.now()} END` : sql``
      }
      FROM numbered ORDER BY seq
    )`;

/**
 * A workflow's edges, written by the statement that inserts its tasks: each
 * dependency is another task of the call (by its place in the call) or a
 * stored one (by seq, locked by lockDependencies), and a stored dependency
 * already completed hands its result over at once. The stored dependencies
 * learn that they have dependents, so that finishing them settles these edges.
 */
const insertEdges = (db: Db, plan: DependencyPlan) => sql`,
    edges_in AS (
      SELECT * FROM json_to_recordset(${JSON.stringify(
        plan.edges.map((e) => ({
          d: e.dependent + 1,
          j: 'index' in e.dependency ? e.dependency.index + 1 : null,
          s: 'seq' in e.dependency ? e.dependency.seq : null,
          q: e.ref.queue,
          i: e.ref.id,
          f: e.onFailure,
          o: e.outcome,
        })),
      )}::json) AS e(d bigint, j bigint, s bigint, q text, i text, f text, o text)
    ),
    edges AS (
      INSERT INTO ${db.table('task_dependencies')} (dependent_seq, dependency_seq, dependency_queue, dependency_id, on_failure, outcome, result, result_bytes)
      SELECT dependent.seq, coalesce(e.s, dependency.seq), e.q, e.i, e.f, e.o, done.result, done.result_bytes
      FROM edges_in e
      JOIN numbered dependent ON dependent.ord = e.d
      LEFT JOIN numbered dependency ON dependency.ord = e.j
      LEFT JOIN ${db.table('task_states')} done ON done.seq = e.s AND e.o = 'completed'
    ),
    marked AS (
      UPDATE ${db.table('task_states')} s SET has_dependents = true
      WHERE s.seq = ANY(${plan.stored}::bigint[]) AND NOT s.has_dependents
    )`;

/**
 * The `input` CTE: the records as rows (toJsonRows), one column per field,
 * `ord` their place in the call.
 */
const inputRows = (records: TaskRecord[], plan?: DependencyPlan) => sql`
    input AS (
      -- json, not jsonb: parsed once, as the rows are read, without building a jsonb document first.
      SELECT i.i AS id, i.q AS queue, i.t AS type, i.p AS payload, decode(i.b, 'hex') AS payload_bytes,
             coalesce(i.h, '{}') AS headers, i.m AS max_retry, i.to AS timeout_ms, i.d AS deadline, i.u AS unique_key,
             coalesce(i.ut, 0) AS unique_ttl_ms, i.g AS group_key, coalesce(i.r, 0) AS retention_ms,
             i.at AS process_at, i."in" AS process_in_ms, coalesce(i.pr, 0) AS priority, i.k AS concurrency_key, ${plan ? sql`i.w AS waiting_for, i.x AS archived_because, i.hd AS has_dependents, ` : sql``}i.ord
      FROM ROWS FROM (json_to_recordset(${toJsonRows(records, plan)}::json) AS (
        i text, q text, t text, p jsonb, b text, h jsonb, m int, "to" float8, d timestamptz, u text, ut float8,
        g text, r float8, at timestamptz, "in" float8, pr smallint, k text${plan ? sql`, w int, x text, hd bool` : sql``}
      )) WITH ORDINALITY AS i(i, q, t, p, b, h, m, "to", d, u, ut, g, r, at, "in", pr, k, ${plan ? sql`w, x, hd, ` : sql``}ord)
    )`;

/**
 * Inserts the tasks in one statement. With a dependency plan (dependencies.ts),
 * the tasks start as it says (waiting, archived) and the statement writes the
 * plan's edges too.
 */
export async function insertTasks(db: Db, records: TaskRecord[], tx?: Transactional, plan?: DependencyPlan): Promise<TaskInfo[]> {
  // Generated ids and no unique keys: nothing another enqueue could hold, so no lock order to keep.
  const keyed = records.length > 1 && records.some((r) => r.idGiven || r.uniqueKey !== null);
  const query = sql<Inserted>`
    WITH ${inputRows(records, plan)},
    routed AS (
      -- asynq's routing: due later → scheduled (group or not); else group → aggregating; else pending.
      -- A planned task whose dependency failed starts archived; one with dependencies to wait for,
      -- waiting (run_at keeps its due time: once released, it is scheduled if that is still ahead).
      SELECT r.*, CASE r.state WHEN 'pending' THEN ${db.now()} WHEN 'scheduled' THEN r.due WHEN 'waiting' THEN r.due
                               WHEN 'archived' THEN ${db.now()} END AS run_at
      FROM (
        SELECT i.*, CASE ${plan ? sql`WHEN i.archived_because IS NOT NULL THEN 'archived' WHEN i.waiting_for > 0 THEN 'waiting' ` : sql``}
                         WHEN i.due > ${db.now()} THEN 'scheduled' WHEN i.group_key IS NOT NULL THEN 'aggregating' ELSE 'pending' END AS state
        FROM (SELECT input.*, coalesce(process_at, ${db.now()} + process_in_ms * interval '1 millisecond', ${db.now()}) AS due FROM input) i
      ) r
    ),
    expired_locks AS (
      DELETE FROM ${db.table('unique_locks')} l USING routed r
      WHERE l.queue = r.queue AND l.key = r.unique_key AND l.expires_at <= ${db.now()}
      RETURNING 1
    ),
    locks AS (
      -- A live lock makes this insert fail with unique_locks_pkey: the whole statement,
      -- tasks included, is then undone. Reading expired_locks first makes its delete run first.
      INSERT INTO ${db.table('unique_locks')} (queue, key, task_id, expires_at)
      SELECT queue, unique_key, id, greatest(due, ${db.now()}) + unique_ttl_ms * interval '1 millisecond'
      FROM routed WHERE unique_key IS NOT NULL AND (SELECT count(*) FROM expired_locks) >= 0
      ORDER BY queue, unique_key
      RETURNING 1
    ),
    registered AS (
      INSERT INTO ${db.table('queues')} (name) SELECT DISTINCT queue FROM routed ON CONFLICT DO NOTHING
    ),
    ${insertRows(db, keyed, plan !== undefined)}${plan ? insertEdges(db, plan) : sql``},
    notified AS (
      SELECT pg_notify(CASE WHEN s.pending THEN ${db.channels.tasks} ELSE ${db.channels.delayed} END, s.queue)
      FROM (SELECT DISTINCT state = 'pending', queue FROM routed WHERE state IN ('pending', 'scheduled')) s(pending, queue)
    )
    -- One row, not one per task: a bulk enqueue spent longer parsing 50,000 result rows
    -- than the database took to write them. Each task's state is one letter, in the
    -- caller's order; the due times of the scheduled ones follow, in the same order.
    SELECT (extract(epoch FROM ${db.now()}) * 1000)::float8 AS enqueued_at_ms,
           string_agg(CASE state WHEN 'archived' THEN 'x' ELSE left(state, 1) END, '' ORDER BY ord) AS states,
           coalesce(string_agg((extract(epoch FROM run_at) * 1000)::float8::text, ',' ORDER BY ord)
                      FILTER (WHERE state = 'scheduled'), '') AS due_ms
    FROM routed WHERE (SELECT count(*) FROM notified) >= 0`;
  let inserted: Inserted;
  for (let attempt = 1; ; attempt++) {
    try {
      inserted = (await db.run(query, tx, plan ? undefined : keyed ? 'enqueue-keyed' : 'enqueue'))[0]!;
      break;
    } catch (err) {
      // A deadlock victim (with a migration's DDL, say) was undone whole: on its own
      // transaction the enqueue can simply run again. In the caller's it cannot.
      if (tx === undefined && attempt < 3 && (err as { code?: string }).code === '40P01') continue;
      throw translateConflict(err, records);
    }
  }
  const enqueuedAt = inserted.enqueued_at_ms;
  const due = inserted.due_ms === '' ? [] : inserted.due_ms.split(',');
  let scheduled = 0;
  return records.map((r, n) => {
    const state = STATES[inserted.states[n]!]!;
    const runAt = state === 'pending' ? enqueuedAt : state === 'scheduled' ? Number(due[scheduled++]) : null;
    return insertedInfo(r, state, runAt, enqueuedAt, plan?.tasks[n]);
  });
}

/** What only the database knows of the tasks it just inserted: the rest is in the records. */
interface Inserted {
  enqueued_at_ms: number;
  /** One letter per task, in the records' order: p(ending), s(cheduled), a(ggregating), w(aiting), x (archived). */
  states: string;
  /** The due times (ms) of the scheduled tasks, comma-separated, in the records' order. */
  due_ms: string;
}

const STATES: Record<string, TaskState> = { p: 'pending', s: 'scheduled', a: 'aggregating', w: 'waiting', x: 'archived' };

/**
 * The TaskInfo of a task just inserted, from its record and what the insert
 * returned: reading the whole row back cost more than the insert (bulk
 * enqueues spent most of their time parsing timestamps and payloads they had
 * just sent). The payload is decoded from the JSON that was sent, so it is a
 * copy, as from any read; jsonb may order its keys differently.
 */
function insertedInfo(r: TaskRecord, state: TaskState, runAtMs: number | null, enqueuedAtMs: number, planned?: PlannedTask): TaskInfo {
  return {
    id: r.id,
    queue: r.queue,
    type: r.type,
    payload: r.payload.bytes ? Buffer.from(r.payload.bytes) : r.payload.json === null ? null : JSON.parse(r.payload.json),
    state,
    maxRetry: r.maxRetry,
    retried: 0,
    lastError: planned?.archivedBecause ?? null,
    lastFailedAt: planned?.archivedBecause ? new Date(enqueuedAtMs) : null,
    timeout: r.timeoutMs,
    deadline: r.deadline,
    group: r.group,
    nextProcessAt: runAtMs === null ? null : new Date(runAtMs),
    isOrphaned: false,
    retention: r.retentionMs,
    completedAt: null,
    result: null,
    headers: { ...r.headers },
    enqueuedAt: new Date(enqueuedAtMs),
    startedAt: null,
    leaseOwner: null,
    leaseExpiresAt: null,
    dependsOn: r.dependsOn.map((d) => ({ ...d })),
    waitingFor: planned?.waitingFor ?? 0,
    priority: r.priority,
    concurrencyKey: r.concurrencyKey,
  };
}

/** Maps PostgreSQL's unique violations to the errors asynq users know. */
function translateConflict(err: unknown, records: TaskRecord[]): unknown {
  const e = err as { code?: string; constraint?: string; detail?: string };
  if (e.code !== '23505') return err;
  // detail: Key (queue, id)=(default, abc) already exists.
  const [queue = '', key = ''] = /=\((.*?), (.*)\) already exists/.exec(e.detail ?? '')?.slice(1) ?? [];
  if (e.constraint === 'task_inputs_queue_id_key') return new TaskIdConflictError(queue, key);
  if (e.constraint === 'unique_locks_pkey') {
    const first = records.find((r) => r.queue === queue && r.uniqueKey === key);
    return new DuplicateTaskError(queue || (first?.queue ?? ''), key);
  }
  return err;
}

/** One task as TaskInfo, or undefined. */
export async function selectTask(db: Db, queue: string, id: string): Promise<TaskInfo | undefined> {
  const rows = await db.run(sql<TaskRow>`SELECT ${taskColumns(db)} FROM ${db.table('tasks')} t WHERE t.queue = ${queue} AND t.id = ${id}`);
  return rows[0] && toTaskInfo(rows[0]);
}
