/**
 * Broker shortcuts that only tests use: a claim with no cursor and a read of
 * one task row. The server claims through server/claimer.ts and the
 * Inspector reads through inspector-read.ts; these stand in for both where a
 * test wants the statement without the component around it.
 */
import { sql } from 'kysely';
import { claimFrom, type ClaimedRow } from '../src/broker/claim.js';
import type { Db } from '../src/broker/db.js';
import { taskColumns, toTaskInfo, type TaskRow } from '../src/broker/task-columns.js';
import type { TaskInfo } from '../src/model/task.js';

/** claimFrom() from the head of every queue, taking the queues strictly in order. */
export async function claim(db: Db, queues: readonly string[], limit: number, owner: string, leaseMs: number): Promise<ClaimedRow[]> {
  return (
    await claimFrom(
      db,
      queues,
      { bands: [], olderThan: null },
      queues.map((_, i) => (i === 0 ? limit : 0)),
      limit,
      owner,
      leaseMs,
    )
  ).rows;
}

/** One task as TaskInfo, or undefined. */
export async function selectTask(db: Db, queue: string, id: string): Promise<TaskInfo | undefined> {
  const rows = await db.run(sql<TaskRow>`SELECT ${taskColumns(db)} FROM ${db.table('tasks')} t WHERE t.queue = ${queue} AND t.id = ${id}`);
  return rows[0] && toTaskInfo(rows[0]);
}
