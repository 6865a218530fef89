/**
 * Workflows: tasks that wait for other tasks. Settling a dependency when it
 * finishes is the database's own work (migration 0005's triggers, in the
 * transaction that completes, archives or deletes it); here are the enqueue
 * of tasks with dependencies and every read of the edges.
 */
import { sql } from 'kysely';
import { decodePayload } from '../model/payload.js';
import { taskName, type TaskInfo, type TaskRecord, type TaskRef, type TaskState } from '../model/task.js';
import { checkDependencyGraph } from '../model/workflow.js';
import type { DependencyPreview } from '../model/previews.js';
import type { Db, Transactional } from './db.js';
import { insertTasks } from './enqueue.js';

/**
 * Enqueues tasks, all or nothing, in one statement (insertTasks): with
 * dependencies, the call's graph is checked first (a cycle), and the database
 * locks the stored dependencies and plans the edges in that statement.
 */
export async function insertWithDependencies(db: Db, records: TaskRecord[], tx?: Transactional): Promise<TaskInfo[]> {
  if (records.some((r) => r.dependsOn.length > 0)) checkDependencyGraph(records);
  return insertTasks(db, records, tx);
}

/** What each completed dependency of a task wrote with writeResult, keyed `queue/id` (null when it wrote nothing). */
export async function dependencyResults(db: Db, seq: string): Promise<Map<string, unknown>> {
  const rows = await db.run(sql<{ queue: string; id: string; result: unknown; result_bytes: Buffer | null }>`
    SELECT dependency_queue AS queue, dependency_id AS id, result, result_bytes
    FROM ${db.table('task_dependencies')}
    WHERE dependent_seq = ${seq}::bigint AND outcome = 'completed'
    ORDER BY dependency_seq`);
  return new Map(rows.map((r) => [taskName(r), decodePayload(r.result, r.result_bytes)]));
}

/** The first `limit` tasks that depend on a task, with their states, in the order they were enqueued, and how many there are. */
export async function dependentsOf(db: Db, queue: string, id: string, limit: number): Promise<{ tasks: (TaskRef & { state: TaskState })[]; total: number }> {
  const rows = await db.run(sql<TaskRef & { state: TaskState; total: number }>`
    SELECT i.queue, i.id, s.state, pg_catalog.count(*) OVER ()::int AS total
    FROM ${db.table('task_inputs')} dep
    JOIN ${db.table('task_dependencies')} d ON d.dependency_seq = dep.seq
    JOIN ${db.table('task_inputs')} i ON i.seq = d.dependent_seq
    JOIN ${db.table('task_states')} s ON s.seq = d.dependent_seq
    WHERE dep.queue = ${queue} AND dep.id = ${id}
    ORDER BY d.dependent_seq
    LIMIT ${limit}`);
  return { tasks: rows.map(({ queue, id, state }) => ({ queue, id, state })), total: rows[0]?.total ?? 0 };
}

/**
 * The first `limit` dependencies of a task, in the order they were enqueued,
 * from its edges (which keep the dependency's name after its rows are gone),
 * with the dependency's state when it is still stored: joined by seq, so a
 * later task that reuses a deleted dependency's id is not taken for it.
 * Undefined when the task does not exist.
 */
export async function dependenciesOf(db: Db, queue: string, id: string, limit: number): Promise<DependencyPreview[] | undefined> {
  const rows = await db.run(sql<{ queue: string | null; id: string | null; outcome: DependencyPreview['outcome']; state: TaskState | null }>`
    SELECT d.queue, d.id, d.outcome, d.state
    FROM ${db.table('task_inputs')} i
    LEFT JOIN LATERAL (
      SELECT e.dependency_queue AS queue, e.dependency_id AS id, e.outcome, s.state, e.dependency_seq AS seq
      FROM ${db.table('task_dependencies')} e
      LEFT JOIN ${db.table('task_states')} s ON s.seq = e.dependency_seq
      WHERE e.dependent_seq = i.seq
      ORDER BY e.dependency_seq LIMIT ${limit}
    ) d ON true
    WHERE i.queue = ${queue} AND i.id = ${id}
    ORDER BY d.seq`);
  if (rows.length === 0) return undefined;
  return rows.filter((r): r is DependencyPreview => r.queue !== null && r.id !== null);
}
