/**
 * Enqueue: one call of the owner's enqueue_tasks() (migration 0009) for any
 * number of tasks, so enqueueMany is one round trip and all-or-nothing. The
 * function writes the unique locks, the queue registry, the rows, a
 * workflow's edges and one NOTIFY per (channel, queue); it runs as the owner,
 * so a producer or worker needs no privilege on the tables, and it checks
 * what it is given and plans the edges from the stored dependencies itself,
 * so a caller that is not the library cannot write more than an enqueue.
 * Given ids and unique keys go in in key order, not the caller's: two
 * enqueueMany calls holding the same ones in different orders would otherwise
 * deadlock on each other's uncommitted keys (fault test F17).
 */
import { sql } from 'kysely';
import { DuplicateTaskError, InvalidOptionError, TaskIdConflictError, TaskNotFoundError } from '../model/errors.js';
import type { TaskInfo, TaskRecord, TaskState } from '../model/task.js';
import type { Db, Transactional } from './db.js';
import { insertedInfo, toJsonRows } from './task-columns.js';

/**
 * Inserts the tasks, with their dependencies' edges, in one statement (in the
 * caller's transaction when there is one). The caller checked the call's
 * dependency graph (model/workflow.ts); the stored dependencies are the
 * database's to look up.
 */
export async function insertTasks(db: Db, records: TaskRecord[], tx?: Transactional): Promise<TaskInfo[]> {
  // Generated ids and no unique keys: nothing another enqueue could hold, so no lock order to keep.
  const keyed = records.length > 1 && records.some((r) => r.idGiven || r.uniqueKey !== null);
  const query = sql<Inserted>`SELECT * FROM ${db.table('enqueue_tasks')}(${toJsonRows(records)}::json, ${db.now()}, ${keyed}::boolean)`;
  let inserted: Inserted;
  for (let attempt = 1; ; attempt++) {
    try {
      inserted = (await db.run(query, tx, 'enqueue'))[0]!;
      break;
    } catch (err) {
      // A deadlock victim (with a migration's DDL, say) was undone whole: on its own
      // transaction the enqueue can simply run again. In the caller's it cannot.
      if (tx === undefined && attempt < 3 && (err as { code?: string }).code === '40P01') continue;
      throw translateConflict(err, records);
    }
  }
  if (inserted.refused !== null) throw refusal(inserted.refused);
  const enqueuedAt = inserted.enqueued_at_ms;
  const due = inserted.due_ms === '' ? [] : inserted.due_ms.split(',');
  let scheduled = 0;
  return records.map((r, n) => {
    const state = STATES[inserted.states[n]!]!;
    const runAt = state === 'pending' ? enqueuedAt : state === 'scheduled' ? Number(due[scheduled++]) : null;
    return insertedInfo(r, {
      state,
      runAtMs: runAt,
      enqueuedAtMs: enqueuedAt,
      waitingFor: inserted.waiting?.[n] ?? 0,
      archivedBecause: inserted.archived_because?.[n] ?? null,
    });
  });
}

/** What only the database knows of the tasks it just inserted: the rest is in the records. */
interface Inserted {
  enqueued_at_ms: number;
  /** One letter per task, in the records' order: p(ending), s(cheduled), a(ggregating), w(aiting), x (archived). */
  states: string;
  /** The due times (ms) of the scheduled tasks, comma-separated, in the records' order. */
  due_ms: string;
  /** With dependencies: each task's dependencies not finished, and the error of one archived at once. */
  waiting: (number | null)[] | null;
  archived_because: (string | null)[] | null;
  /** Nothing written: a dependency missing or grouped, as [why, queue, id]. */
  refused: [why: 'missing' | 'grouped', queue: string, id: string] | null;
}

/** The library's error for a dependency enqueue_tasks() refused. */
function refusal([why, queue, id]: NonNullable<Inserted['refused']>): Error {
  if (why === 'missing') return new TaskNotFoundError(queue, id);
  return new InvalidOptionError('dependsOn', `names ${queue}/${id}, which belongs to a group: grouped tasks are merged and cannot be waited for`);
}

const STATES: Record<string, TaskState> = { p: 'pending', s: 'scheduled', a: 'aggregating', w: 'waiting', x: 'archived' };

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
