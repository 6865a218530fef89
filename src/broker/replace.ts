/**
 * Enqueue with `replace`: a task whose id is taken by a task that has not
 * started (pending, scheduled, retry or waiting) is replaced in place: its
 * type, payload, headers and options, and its due time. Debounce: however
 * many times it is enqueued, it runs once, as last enqueued. An id taken by
 * an active or finished task is a TaskIdConflictError, as without replace.
 *
 * In one transaction (the caller's, or one of its own): replace_tasks()
 * (migration 0006, SECURITY DEFINER: a producer needs no UPDATE privilege)
 * locks the tasks already there and replaces them, or none of them if one
 * has started; then the others are inserted as any enqueue inserts them.
 */
import { sql } from 'kysely';
import { TaskIdConflictError } from '../model/errors.js';
import { taskName, type TaskInfo, type TaskRecord } from '../model/task.js';
import type { Db, Transactional } from './db.js';
import { durableTransaction } from './transaction.js';
import { insertWithDependencies } from './dependencies.js';
import { taskColumns, toJsonRows, toTaskInfo, type TaskRow } from './task-columns.js';

export async function insertOrReplace(db: Db, records: TaskRecord[], tx?: Transactional): Promise<TaskInfo[]> {
  const run = async (trx: Transactional): Promise<TaskInfo[]> => {
    const named = records.filter((r) => r.replace);
    const found = await db.run(
      sql<{ ord: string; replaced: boolean }>`
      SELECT ord, replaced FROM ${db.table('replace_tasks')}(${toJsonRows(named)}::json, ${db.now()}, ${db.schema})`,
      trx,
    );
    // As without replace: the id is taken by a task that started or finished (and nothing was replaced).
    const conflict = found.find((f) => !f.replaced);
    if (conflict) {
      const r = named[Number(conflict.ord) - 1]!;
      throw new TaskIdConflictError(r.queue, r.id);
    }
    const replaced = named.filter((_, n) => found.some((f) => Number(f.ord) === n + 1));
    const names = new Set(replaced.map(taskName));
    const inserted = records.filter((r) => !names.has(taskName(r)));
    const infos = [...(inserted.length === 0 ? [] : await insertWithDependencies(db, inserted, trx)), ...(await selectTasks(db, trx, replaced))];
    const byName = new Map(infos.map((i) => [taskName(i), i]));
    return records.map((r) => byName.get(taskName(r))!);
  };
  return tx === undefined ? durableTransaction(db, run) : run(tx);
}

/** The replaced tasks as they now are, read in the transaction that replaced them. */
async function selectTasks(db: Db, trx: Transactional, records: TaskRecord[]): Promise<TaskInfo[]> {
  if (records.length === 0) return [];
  const rows = await db.run(
    sql<TaskRow>`
    SELECT ${taskColumns(db)}
    FROM ROWS FROM (pg_catalog.unnest(${records.map((r) => r.queue)}::text[]), pg_catalog.unnest(${records.map((r) => r.id)}::text[])) AS r(queue, id)
    JOIN ${db.table('tasks')} t ON t.queue = r.queue AND t.id = r.id`,
    trx,
  );
  return rows.map(toTaskInfo);
}
