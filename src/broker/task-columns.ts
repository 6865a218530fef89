/**
 * A task's fields, declared once. FIELDS gives, for every field of TaskInfo,
 * the select-list item that reads it from a `tasks` row aliased `t` (a column,
 * or an expression on the database clock), how the row's value becomes the
 * field, and its value in a task just inserted (from the enqueue's record and
 * what the insert returned). SENT gives what an enqueue sends of a task: its
 * key in the one JSON text that enqueue_tasks() and replace_tasks() read. The
 * select lists, toTaskInfo(), insertedInfo() and toJsonRows() are derived from
 * the two, and the compiler holds FIELDS to TaskInfo: a field of TaskInfo
 * without its entry here does not build.
 *
 * Adding a field of a task takes its type (model/task-info.ts; an enqueue
 * option's in model/task.ts, with its rule), its validation where a writer sets
 * it, its entries here, its migration and its documentation: progress (0013)
 * took model/task-info.ts, model/following.ts, this file, the migration and
 * the README.
 */
import { sql, type RawBuilder } from 'kysely';
import { decodePayload } from '../model/payload.js';
import type { TaskInfo, TaskRecord, TaskState } from '../model/task.js';
import type { Db } from './db.js';

/** A row read with taskColumns() or taskFacts(): its values by their select-list names. */
export type TaskRow = Record<string, unknown>;

/** What only the database knows of a task it just inserted; the rest is in its record. */
export interface InsertedFacts {
  state: TaskState;
  /** When it is due: the enqueue's time when pending, its due time when scheduled, else null. */
  runAtMs: number | null;
  enqueuedAtMs: number;
  /** Its dependencies not finished yet. */
  waitingFor: number;
  /** The error of a task archived at once (a dependency had failed). */
  archivedBecause: string | null;
}

interface Field<V> {
  /** The select-list items, from a row aliased `t`. */
  select: (db: Db) => RawBuilder<unknown>;
  /** The field's value from the row. */
  read: (row: TaskRow) => V;
  /** What a task carries rather than what it is (payload, result, headers, last error): not in taskFacts(). */
  content?: true;
  /** Its value in a task just inserted. */
  inserted: (r: TaskRecord, facts: InsertedFacts) => V;
}

/** A field that is a column of the view, read as it is. */
function column<V>(name: string, inserted: Field<V>['inserted']): Field<V> {
  return { select: () => sql.ref(`t.${name}`), read: (row) => row[name] as V, inserted };
}

/** A field computed in the statement, under `alias`. */
function computed<V>(alias: string, expression: (db: Db) => RawBuilder<unknown>, inserted: Field<V>['inserted'], read?: (value: unknown) => V): Field<V> {
  return {
    select: (db) => sql`${expression(db)} AS ${sql.id(alias)}`,
    read: read === undefined ? (row) => row[alias] as V : (row) => read(row[alias]),
    inserted,
  };
}

/** A value stored as jsonb or, when bytes, in its bytea twin `<name>_bytes`. */
function encoded(name: string, inserted: Field<unknown>['inserted']): Field<unknown> {
  return {
    select: () => sql`${sql.ref(`t.${name}`)}, ${sql.ref(`t.${name}_bytes`)}`,
    read: (row) => decodePayload(row[name], row[`${name}_bytes`] as Buffer | null),
    content: true,
    inserted,
  };
}

const ms = (interval: string) => () => sql`(extract(epoch FROM ${sql.ref(`t.${interval}`)}) * 1000)::float8`;

/** In TaskInfo's order, which is the order of a task's JSON (the CLI's `--json`). */
const FIELDS: { [K in keyof TaskInfo]-?: Field<TaskInfo[K]> } = {
  id: column('id', (r) => r.id),
  queue: column('queue', (r) => r.queue),
  type: column('type', (r) => r.type),
  // Decoded from the JSON that was sent: a copy, as from any read (jsonb may order its keys differently).
  payload: encoded('payload', (r) => (r.payload.bytes ? Buffer.from(r.payload.bytes) : r.payload.json === null ? null : JSON.parse(r.payload.json))),
  state: column('state', (_, f) => f.state),
  maxRetry: column('max_retry', (r) => r.maxRetry),
  retried: column('retried', () => 0),
  lastError: { ...column<string | null>('error_msg', (_, f) => f.archivedBecause), content: true },
  lastFailedAt: column('last_failed_at', (_, f) => (f.archivedBecause === null ? null : new Date(f.enqueuedAtMs))),
  timeout: computed('timeout_ms', ms('timeout'), (r) => r.timeoutMs),
  deadline: column('deadline', (r) => r.deadline),
  group: column('group_key', (r) => r.group),
  nextProcessAt: computed(
    'next_process_at',
    (db) => sql`CASE t.state WHEN 'pending' THEN ${db.now()} WHEN 'scheduled' THEN t.run_at WHEN 'retry' THEN t.run_at END`,
    (_, f) => (f.runAtMs === null ? null : new Date(f.runAtMs)),
  ),
  isOrphaned: computed(
    'is_orphaned',
    (db) => sql`(t.state = 'active' AND t.lease_expires_at < ${db.now()})`,
    () => false,
  ),
  retention: computed('retention_ms', ms('retention'), (r) => r.retentionMs),
  completedAt: column('completed_at', () => null),
  result: encoded('result', () => null),
  headers: { ...column<Record<string, string>>('headers', (r) => ({ ...r.headers })), content: true },
  enqueuedAt: column('enqueued_at', (_, f) => new Date(f.enqueuedAtMs)),
  startedAt: column('started_at', () => null),
  leaseOwner: column('lease_owner', () => null),
  leaseExpiresAt: column('lease_expires_at', () => null),
  dependsOn: computed(
    'depends_on',
    (db) => sql`CASE WHEN t.waiting_for IS NOT NULL THEN
      (SELECT pg_catalog.json_agg(pg_catalog.json_build_array(d.dependency_queue, d.dependency_id) ORDER BY d.dependency_seq)
       FROM ${db.table('task_dependencies')} d WHERE d.dependent_seq = t.seq) END`,
    (r) => r.dependsOn.map((d) => ({ ...d })),
    (pairs) => ((pairs as [string, string][] | null) ?? []).map(([queue, id]) => ({ queue, id })),
  ),
  waitingFor: computed(
    'waiting_for',
    () => sql`t.waiting_for`,
    (_, f) => f.waitingFor,
    (n) => (n as number | null) ?? 0,
  ),
  priority: column('priority', (r) => r.priority),
  concurrencyKey: column('concurrency_key', (r) => r.concurrencyKey),
  progress: column('progress', () => null),
};

const ENTRIES = Object.entries(FIELDS) as [keyof TaskInfo, Field<unknown>][];
const FACTS = ENTRIES.filter(([, f]) => f.content !== true);

/** Every field of a task, from a row aliased `t`: what each read of the Inspector returns. */
export const taskColumns = (db: Db): RawBuilder<unknown> => sql.join(ENTRIES.map(([, f]) => f.select(db)));

/** Every field but the payload, headers, last error and result: what a task is, not what it carries. */
export const taskFacts = (db: Db): RawBuilder<unknown> => sql.join(FACTS.map(([, f]) => f.select(db)));

/** A task's TaskInfo from a row read with taskColumns(). */
export const toTaskInfo = compileObject<[row: TaskRow], TaskInfo>(ENTRIES.map(([name, f]) => [name, f.read]));

/**
 * The TaskInfo of a task just inserted, from its record and what the insert
 * returned: reading the whole row back cost more than the insert (bulk
 * enqueues spent most of their time parsing timestamps and payloads they had
 * just sent).
 */
export const insertedInfo = compileObject<[r: TaskRecord, facts: InsertedFacts], TaskInfo>(ENTRIES.map(([name, f]) => [name, f.inserted]));

/**
 * Compiles `(a, b) => ({ k1: f1(a, b), … })` from the fields' functions: one
 * object literal, so every object has the same shape, and each function
 * called from a call site of its own, where V8 inlines it. Filling an object
 * field by field in a loop over FIELDS, as a plain reading of the
 * declaration would, took 4.5× as long (45 ms per 10,000 inserted tasks
 * against 10 for the literal written by hand, bench/quick-enqueue.ts).
 */
function compileObject<A extends unknown[], T>(fields: [name: string, value: (...args: A) => unknown][]): (...args: A) => T {
  const body = fields.map(([name], n) => `${JSON.stringify(name)}: f${n}(a, b)`).join(', ');
  // eslint-disable-next-line @typescript-eslint/no-implied-eval -- the text is built from FIELDS' names alone, at load
  const make = new Function(...fields.map((_, n) => `f${n}`), `return (a, b) => ({ ${body} });`) as (...fs: unknown[]) => (...args: A) => T;
  return make(...fields.map(([, value]) => value));
}

const json = (value: unknown) => JSON.stringify(value);
const instant = (d: Date) => `"${d.toISOString()}"`;

/**
 * What an enqueue sends of a task, by key: short keys, and an option at its
 * zero value (no deadline, no group, …) left out (undefined), since a bulk
 * enqueue sends tens of thousands of these, and the bytes are built, sent and
 * parsed once each. Payloads were encoded once, at `new Task`, and go in as
 * they are. `dp`: the dependencies, as [queue, id] pairs; `of`: 'run' when a
 * failed one does not archive the task; `aw`: enqueued awaited (migration 0019).
 */
const SENT: readonly (readonly [key: string, value: (r: TaskRecord) => string | undefined])[] = [
  ['i', (r) => json(r.id)],
  ['q', (r) => json(r.queue)],
  ['t', (r) => json(r.type)],
  ['m', (r) => String(r.maxRetry)],
  ['to', (r) => String(r.timeoutMs)],
  ['p', (r) => r.payload.json ?? undefined],
  ['b', (r) => (r.payload.bytes ? `"${r.payload.bytes.toString('hex')}"` : undefined)],
  ['h', (r) => (hasKeys(r.headers) ? json(r.headers) : undefined)],
  ['d', (r) => (r.deadline ? instant(r.deadline) : undefined)],
  ['u', (r) => (r.uniqueKey === null ? undefined : json(r.uniqueKey))],
  ['ut', (r) => (r.uniqueKey === null ? undefined : String(r.uniqueTtlMs))],
  ['g', (r) => (r.group === null ? undefined : json(r.group))],
  ['r', (r) => (r.retentionMs === 0 ? undefined : String(r.retentionMs))],
  ['at', (r) => (r.processAt ? instant(r.processAt) : undefined)],
  ['in', (r) => (r.processInMs === null ? undefined : String(r.processInMs))],
  ['pr', (r) => (r.priority === 0 ? undefined : String(r.priority))],
  ['k', (r) => (r.concurrencyKey === null ? undefined : json(r.concurrencyKey))],
  ['dp', (r) => (r.dependsOn.length === 0 ? undefined : json(r.dependsOn.map((d) => [d.queue, d.id])))],
  ['of', (r) => (r.dependsOn.length > 0 && r.onDependencyFailure === 'run' ? '"run"' : undefined)],
  ['aw', (r) => (r.awaited ? 'true' : undefined)],
];

/**
 * One task as a JSON object, compiled from SENT as compileObject() does (a
 * loop over SENT took 1.4× as long): each value's function at a call site of
 * its own, a key written only when its value is not left out.
 */
const toJsonRow: (r: TaskRecord) => string = (() => {
  const lines = SENT.map(
    ([key], n) => `v = s${n}(r); if (v !== undefined) row += (row === '' ? '{' : ',') + ${JSON.stringify(JSON.stringify(key) + ':')} + v;`,
  );
  // eslint-disable-next-line @typescript-eslint/no-implied-eval -- the text is built from SENT's keys alone, at load
  const make = new Function(...SENT.map((_, n) => `s${n}`), `return (r) => { let row = '', v; ${lines.join(' ')} return row + '}'; };`) as (
    ...fs: unknown[]
  ) => (r: TaskRecord) => string;
  return make(...SENT.map(([, value]) => value));
})();

/** The tasks as one JSON array: a single parameter that PostgreSQL parses natively. */
export function toJsonRows(records: TaskRecord[]): string {
  const rows = new Array<string>(records.length);
  for (let n = 0; n < records.length; n++) rows[n] = toJsonRow(records[n]!);
  return `[${rows.join(',')}]`;
}

function hasKeys(o: object): boolean {
  for (const _ in o) return true;
  return false;
}
