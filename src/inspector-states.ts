/**
 * The Inspector's operations on a queue's tasks in one state: a page of them,
 * deleting them all, moving them all. Each validates its arguments, then runs
 * the broker's statement. The Inspector's list and bulk methods are these with
 * the state fixed; the CLI and the dashboard (inspector-internal.ts), which
 * take the state as a word, call them with the Inspector's database.
 */
import type { Db } from './broker/db.js';
import * as read from './broker/inspector-read.js';
import * as write from './broker/inspector-write.js';
import type { TaskInfo, TaskState } from './model/task.js';
import * as v from './model/validate.js';

/** A page of the queue's tasks in `state` (`group`: the aggregating tasks of that group). */
export async function listInState(db: Db, queue: string, state: TaskState, opts: unknown, group?: unknown): Promise<TaskInfo[]> {
  const q = v.queueName(queue);
  const g = state === 'aggregating' ? v.groupName(group) : undefined;
  const page = v.listPage(opts);
  return read.inQueue(q, await read.listTasks(db, q, state, { ...page, group: g }));
}

/** Deletes every task of the queue in `state`; resolves to how many. */
export async function deleteAllInState(db: Db, queue: string, state: TaskState, group?: unknown): Promise<number> {
  const q = v.queueName(queue);
  const g = state === 'aggregating' ? v.groupName(group) : null;
  return read.inQueue(q, await write.actOnState(db, q, state, 'delete', g));
}

/** Moves every task of the queue in `from` to `to`; resolves to how many. */
export async function moveAllInState(db: Db, queue: string, from: TaskState, to: 'pending' | 'archived', group?: unknown): Promise<number> {
  const q = v.queueName(queue);
  const g = from === 'aggregating' ? v.groupName(group) : null;
  return read.inQueue(q, await write.actOnState(db, q, from, to, g));
}
