/**
 * The states each of asynq's Inspector actions takes a task from
 * (inspect.go): one task at a time (deleteTask, runTask, archiveTask), and
 * every task of one state of a queue at once (deleteAll…, runAll…,
 * archiveAll…). The Inspector, the CLI and the dashboard all read them here.
 */
import type { TaskState } from './task.js';

/** An Inspector action on tasks. */
export type TaskAction = 'delete' | 'archive' | 'run';

/** The states one task may be in for each single-task action. */
export const SINGLE_STATES: Readonly<Record<TaskAction, readonly TaskState[]>> = {
  delete: ['pending', 'scheduled', 'retry', 'archived', 'completed', 'aggregating', 'waiting'],
  archive: ['pending', 'scheduled', 'retry', 'completed', 'aggregating', 'waiting'],
  run: ['scheduled', 'retry', 'archived', 'completed', 'aggregating', 'waiting'],
};

/** The states each bulk action applies to: the Inspector's deleteAll…, archiveAll… and runAll… methods. */
export const BULK_STATES: Readonly<Record<TaskAction, readonly TaskState[]>> = {
  delete: ['pending', 'scheduled', 'retry', 'archived', 'completed', 'aggregating', 'waiting'],
  archive: ['pending', 'scheduled', 'retry', 'aggregating', 'waiting'],
  run: ['scheduled', 'retry', 'archived', 'aggregating', 'waiting'],
};
