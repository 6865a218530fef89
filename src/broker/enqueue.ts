/**
 * Enqueue: one statement for any number of tasks, so enqueueMany is one round
 * trip and all-or-nothing. The unique locks, the queue registry, the rows and
 * one NOTIFY per (channel, queue) are all written by that statement.
 * Given ids and unique keys go in in key order, not the caller's: two
 * enqueueMany calls holding the same ones in different orders would otherwise
 * deadlock on each other's uncommitted keys (fault test F17).
 */
import { sql } from 'kysely';
import { DuplicateTaskError, TaskIdConflictError } from '../errors.js';
import type { TaskInfo, TaskRecord, TaskState } from '../task.js';
import type { Db, Transactional } from './db.js';
import { taskColumns, toTaskInfo, type TaskRow } from './rows.js';

/**
 * The tasks as one JSON array: a single parameter that PostgreSQL parses
 * natively, instead of fifteen arrays that pg would escape element by element
 * in JavaScript. Payloads were encoded once, at `new Task`, and go in as they are.
 */
function toJsonRows(records: TaskRecord[]): string {
  const parts = records.map(
    (r) =>
      `{"id":${JSON.stringify(r.id)},"queue":${JSON.stringify(r.queue)},"type":${JSON.stringify(r.type)},` +
      `"payload":${r.payload.json ?? 'null'},"payload_hex":${r.payload.bytes ? `"${r.payload.bytes.toString('hex')}"` : 'null'},` +
      `"headers":${JSON.stringify(r.headers)},"max_retry":${r.maxRetry},"timeout_ms":${r.timeoutMs},` +
      `"deadline":${r.deadline ? `"${r.deadline.toISOString()}"` : 'null'},"unique_key":${r.uniqueKey === null ? 'null' : JSON.stringify(r.uniqueKey)},` +
      `"unique_ttl_ms":${r.uniqueTtlMs},"group_key":${r.group === null ? 'null' : JSON.stringify(r.group)},"retention_ms":${r.retentionMs},` +
      `"process_at":${r.processAt ? `"${r.processAt.toISOString()}"` : 'null'},"process_in_ms":${r.processInMs ?? 'null'}}`,
  );
  return `[${parts.join(',')}]`;
}

/**
 * The inputs in key order (see the header) or in the caller's order, each numbered in
 * the caller's order: nextval() in the select list of `numbered` runs after its sort,
 * so seq — and with it the pending order — is FIFO within the batch either way.
 * A pending task's position is its own seq.
 */
const insertRows = (db: Db, keyed: boolean) => sql`
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
      INSERT INTO ${db.table('task_states')} (seq, queue, state, pending_seq, run_at, group_key)
      SELECT seq, queue, state, CASE WHEN state = 'pending' THEN seq END, run_at, group_key FROM numbered ORDER BY seq
    )`;

export async function insertTasks(db: Db, records: TaskRecord[], tx?: Transactional): Promise<TaskInfo[]> {
  // Generated ids and no unique keys: nothing another enqueue could hold, so no lock order to keep.
  const keyed = records.length > 1 && records.some((r) => r.idGiven || r.uniqueKey !== null);
  const query = sql<Inserted>`
    WITH input AS (
      SELECT i.id, i.queue, i.type, i.payload, decode(i.payload_hex, 'hex') AS payload_bytes, i.headers, i.max_retry,
             i.timeout_ms, i.deadline, i.unique_key, i.unique_ttl_ms, i.group_key, i.retention_ms, i.process_at,
             i.process_in_ms, i.ord
      FROM ROWS FROM (jsonb_to_recordset(${toJsonRows(records)}::jsonb) AS (
        id text, queue text, type text, payload jsonb, payload_hex text, headers jsonb, max_retry int,
        timeout_ms float8, deadline timestamptz, unique_key text, unique_ttl_ms float8, group_key text,
        retention_ms float8, process_at timestamptz, process_in_ms float8
      )) WITH ORDINALITY AS i(id, queue, type, payload, payload_hex, headers, max_retry, timeout_ms, deadline,
                              unique_key, unique_ttl_ms, group_key, retention_ms, process_at, process_in_ms, ord)
    ),
    routed AS (
      -- asynq's routing: due later → scheduled (group or not); else group → aggregating; else pending.
      SELECT r.*, CASE r.state WHEN 'pending' THEN now() WHEN 'scheduled' THEN r.due END AS run_at
      FROM (
        SELECT i.*, CASE WHEN i.due > now() THEN 'scheduled' WHEN i.group_key IS NOT NULL THEN 'aggregating' ELSE 'pending' END AS state
        FROM (SELECT input.*, coalesce(process_at, now() + process_in_ms * interval '1 millisecond', now()) AS due FROM input) i
      ) r
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
      ORDER BY queue, unique_key
      RETURNING 1
    ),
    registered AS (
      INSERT INTO ${db.table('queues')} (name) SELECT DISTINCT queue FROM routed ON CONFLICT DO NOTHING
    ),
    ${insertRows(db, keyed)},
    notified AS (
      SELECT pg_notify(CASE WHEN s.pending THEN ${db.channels.tasks} ELSE ${db.channels.delayed} END, s.queue)
      FROM (SELECT DISTINCT state = 'pending', queue FROM routed WHERE state <> 'aggregating') s(pending, queue)
    )
    SELECT queue, id, state, (extract(epoch FROM run_at) * 1000)::float8 AS run_at_ms,
           (extract(epoch FROM now()) * 1000)::float8 AS enqueued_at_ms
    FROM routed WHERE (SELECT count(*) FROM notified) >= 0`;
  let rows: Inserted[];
  for (let attempt = 1; ; attempt++) {
    try {
      rows = await db.run(query, tx, keyed ? 'enqueue-keyed' : 'enqueue');
      break;
    } catch (err) {
      // A deadlock victim (with a migration's DDL, say) was undone whole: on its own
      // transaction the enqueue can simply run again. In the caller's it cannot.
      if (tx === undefined && attempt < 3 && (err as { code?: string }).code === '40P01') continue;
      throw translateConflict(err, records);
    }
  }
  const byKey = new Map(rows.map((r) => [`${r.queue}\0${r.id}`, r]));
  return records.map((r) => insertedInfo(r, byKey.get(`${r.queue}\0${r.id}`)!));
}

/** What only the database knows of a task it just inserted: the rest is the record. */
interface Inserted {
  queue: string;
  id: string;
  state: TaskState;
  run_at_ms: number | null;
  enqueued_at_ms: number;
}

/**
 * The TaskInfo of a task just inserted, from its record and what the insert
 * returned: reading the whole row back cost more than the insert (bulk
 * enqueues spent most of their time parsing timestamps and payloads they had
 * just sent). The payload is decoded from the JSON that was sent, so it is a
 * copy, as from any read; jsonb may order its keys differently.
 */
function insertedInfo(r: TaskRecord, row: Inserted): TaskInfo {
  return {
    id: r.id,
    queue: r.queue,
    type: r.type,
    payload: r.payload.bytes ? Buffer.from(r.payload.bytes) : r.payload.json === null ? null : JSON.parse(r.payload.json),
    state: row.state,
    maxRetry: r.maxRetry,
    retried: 0,
    lastError: null,
    lastFailedAt: null,
    timeout: r.timeoutMs,
    deadline: r.deadline,
    group: r.group,
    nextProcessAt: row.state === 'aggregating' || row.run_at_ms === null ? null : new Date(row.run_at_ms),
    isOrphaned: false,
    retention: r.retentionMs,
    completedAt: null,
    result: null,
    headers: { ...r.headers },
    enqueuedAt: new Date(row.enqueued_at_ms),
    startedAt: null,
    leaseOwner: null,
    leaseExpiresAt: null,
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
  const rows = await db.run(sql<TaskRow>`SELECT ${taskColumns} FROM ${db.table('tasks')} t WHERE t.queue = ${queue} AND t.id = ${id}`);
  return rows[0] && toTaskInfo(rows[0]);
}
