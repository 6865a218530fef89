/**
 * @internal What the CLI and the dashboard take from an Inspector besides its
 * public methods: lists and bulk actions by state (the CLI and the dashboard
 * take the state as a word), and the dashboard's previews and estimates,
 * read in PostgreSQL. Not exported by the package.
 */
import { dependenciesOf, dependentsOf } from './broker/dependencies.js';
import * as read from './broker/inspector-read.js';
import { inspectorInternals as internals, type Inspector } from './inspector.js';
import { deleteAllInState, listInState, moveAllInState } from './inspector-states.js';
import { FailedPreconditionError, TaskNotFoundError } from './model/errors.js';
import type { ListOptions } from './model/inspector-types.js';
import type { DependencyPreview, ServerPreview, TaskPageInfo, TaskPreview } from './model/previews.js';
import { BULK_STATES, type TaskAction } from './model/task-actions.js';
import type { TaskInfo, TaskRef, TaskState } from './model/task.js';
import * as v from './model/validate.js';

/**
 * @internal A page of the queue's tasks in `state`: the Inspector's list
 * method for that state (`group` for aggregating tasks), for the CLI and the
 * dashboard, which take the state as a word.
 */
export function listTasks(inspector: Inspector, queue: string, state: TaskState, opts?: ListOptions, group?: string): Promise<TaskInfo[]> {
  return listInState(internals.db(inspector), queue, state, opts, group);
}

/**
 * @internal `pgasynq task ls` without a state: the same page of the queue's
 * tasks in each of `states`, in that order, each as the Inspector's list
 * method for that state returns it; aggregating tasks of every group, or of
 * `group` when given. Rejects as the lists do (QueueNotFoundError,
 * ValidationError).
 */
export async function listTasksByState(
  inspector: Inspector,
  queue: string,
  states: readonly TaskState[],
  opts?: ListOptions,
  group?: string,
): Promise<{ state: TaskState; tasks: TaskInfo[] }[]> {
  const q = v.queueName(queue);
  const page = v.listPage(opts);
  const g = group === undefined ? undefined : v.groupName(group);
  const db = internals.db(inspector);
  return Promise.all(
    states.map(async (state) => ({
      state,
      tasks: read.inQueue(q, await read.listTasks(db, q, state, { ...page, group: state === 'aggregating' ? g : undefined })),
    })),
  );
}

/**
 * @internal `pgasynq task inspect ID`: the queues that hold a task with this
 * id, by name ([] when none does; ids are unique per queue only).
 * ValidationError on a bad id.
 */
export async function queuesWithTask(inspector: Inspector, id: string): Promise<string[]> {
  return read.queuesWithTask(internals.db(inspector), v.taskId(id));
}

/**
 * @internal The Inspector's bulk method for `action` and `state` (for
 * aggregating tasks, of one `group`); resolves to how many tasks it moved or
 * deleted. A pair asynq has no method for is a FailedPreconditionError.
 */
export function actOnAll(inspector: Inspector, action: TaskAction, queue: string, state: TaskState, group?: string): Promise<number> {
  if (!BULK_STATES[action].includes(state)) {
    return Promise.reject(new FailedPreconditionError(`cannot ${action} all ${state} tasks (${action} all applies to ${BULK_STATES[action].join(', ')})`));
  }
  if (action === 'delete') return deleteAllInState(internals.db(inspector), queue, state, group);
  return moveAllInState(internals.db(inspector), queue, state, action === 'run' ? 'pending' : 'archived', group);
}

// ------------------------------------------------------------------ the dashboard's reads

/** Largest page of previews the dashboard may ask for (its biggest page size). */
export const MAX_PREVIEW_PAGE_SIZE = 500;

/**
 * @internal The dashboard's task lists, not part of the public API (the
 * Inspector's lists return whole TaskInfo): a page of a queue's tasks in
 * `state` as previews cut short in PostgreSQL (model/previews.ts
 * TaskPreview), at most MAX_PREVIEW_PAGE_SIZE of them. `hide`: no payload,
 * result or last error at all.
 * Rejects as the Inspector's lists do (QueueNotFoundError, ValidationError).
 */
export async function listTaskPreviews(
  inspector: Inspector,
  queue: string,
  state: TaskState,
  opts: { page: number; pageSize: number; group?: string | undefined; hide: boolean },
): Promise<TaskPreview[]> {
  const q = v.queueName(queue);
  const g = state === 'aggregating' ? v.groupName(opts.group) : undefined;
  const page = v.integer(opts.page, 'page', 1, v.MAX_PAGE);
  const size = v.integer(opts.pageSize, 'pageSize', 1, MAX_PREVIEW_PAGE_SIZE);
  return read.inQueue(
    q,
    await read.listTaskPreviews(internals.db(inspector), q, state, { limit: size, offset: (page - 1) * size, group: g }, v.boolean(opts.hide, 'hide')),
  );
}

/**
 * @internal The dashboard's task page, not part of the public API (getTaskInfo
 * returns the whole task): one task with its payload, result, headers and last
 * error cut short in PostgreSQL (model/previews.ts TaskPageInfo); `hide`: none
 * of them read. Rejects as getTaskInfo does.
 */
export async function taskPageInfo(inspector: Inspector, queue: string, id: string, hide: boolean): Promise<TaskPageInfo> {
  const q = v.queueName(queue);
  const taskId = v.taskId(id);
  const info = read.inQueue(q, await read.taskPageInfo(internals.db(inspector), q, taskId, v.boolean(hide, 'hide')));
  if (!info) throw new TaskNotFoundError(q, taskId);
  return info;
}

/** @internal The dashboard's servers: servers() with payload previews (null when `hide`), not part of the public API. */
export async function listServerPreviews(inspector: Inspector, hide: boolean): Promise<ServerPreview[]> {
  return read.listServerPreviews(internals.db(inspector), v.boolean(hide, 'hide'));
}

/**
 * @internal /metrics' estimates of a queue, not part of the public API:
 * broker queueFootprint (mean task size per state over a sample, orphaned
 * active tasks), measured in PostgreSQL.
 */
export async function queueFootprint(
  inspector: Inspector,
  queue: string,
  states: readonly TaskState[],
  sample: number,
): Promise<{ meanBytes: Map<TaskState, number>; orphaned: number }> {
  return read.queueFootprint(internals.db(inspector), v.queueName(queue), states, v.integer(sample, 'sample', 1, 1000));
}

/** Most dependencies a task page may ask for at once (a task may have up to MAX_DEPENDENCIES). */
export const MAX_DEPENDENCY_PAGE = 1000;

/**
 * @internal The dashboard's task page, not part of the public API: the first
 * `limit` dependencies of a task with how each was settled and whether it is
 * still stored (TaskInfo.dependsOn has only their names). Rejects with
 * TaskNotFoundError when the task does not exist, ValidationError on a bad name.
 */
export async function listTaskDependencies(inspector: Inspector, queue: string, id: string, limit: number): Promise<DependencyPreview[]> {
  const q = v.queueName(queue);
  const taskId = v.taskId(id);
  const r = await dependenciesOf(internals.db(inspector), q, taskId, v.integer(limit, 'limit', 1, MAX_DEPENDENCY_PAGE));
  if (r === undefined) throw new TaskNotFoundError(q, taskId);
  return r;
}

/**
 * @internal The dashboard's task page, not part of the public API: the tasks
 * that depend on a task, with their states, in the order they were enqueued
 * ([] when none does, or when the task does not exist). ValidationError on a
 * bad name.
 */
export async function listTaskDependents(
  inspector: Inspector,
  queue: string,
  id: string,
  limit: number,
): Promise<{ tasks: (TaskRef & { state: TaskState })[]; total: number }> {
  return dependentsOf(internals.db(inspector), v.queueName(queue), v.taskId(id), v.integer(limit, 'limit', 1, MAX_DEPENDENCY_PAGE));
}

/**
 * @internal pgasynq/testing's requireEnqueued(): the tasks of `type` in any
 * state, in `queue` or every queue, oldest first (at most
 * read.MAX_TASKS_OF_TYPE). ValidationError on a bad type or queue name.
 */
export function tasksOfType(inspector: Inspector, type: string, queue?: string): Promise<TaskInfo[]> {
  return read.listTasksOfType(internals.db(inspector), v.taskType(type), queue === undefined ? undefined : v.queueName(queue));
}

/**
 * @internal pgasynq/testing's drain(): the tasks in `queues` (every queue
 * when null) that a server could run now (read.countRunnableTasks).
 */
export function runnableTasks(inspector: Inspector, queues: readonly string[] | null): Promise<number> {
  return read.countRunnableTasks(internals.db(inspector), queues);
}
