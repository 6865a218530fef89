/**
 * What the dashboard's reads return (inspector-internal.ts), beside the
 * Inspector's public results (inspector-types.ts): tasks, servers and
 * dependencies as previews whose large values PostgreSQL cuts short, and the
 * sizes it cuts them to. Not part of the public API.
 */
import type { ServerInfo, WorkerInfo } from './inspector-types.js';
import type { TaskInfo, TaskRef, TaskState } from './task.js';

/** Characters of a payload or result a preview carries: one more than a list shows, so it knows to add "…". */
export const PREVIEW_CHARS = 201;
/** Characters of a last error a preview carries (a list shows 120, and up to this many on hover). */
export const ERROR_PREVIEW_CHARS = 500;
/** Dependencies a waiting task's preview names (the list shows them and "…" for the rest). */
export const DEPENDS_PREVIEW = 5;

/**
 * A task as a list of the dashboard shows it: no headers, and the payload,
 * result and last error cut short by PostgreSQL, so a page of tasks over
 * megabyte payloads stays a few kilobytes wherever it goes (pool, process,
 * browser). Not part of the public API: the Inspector's lists return TaskInfo.
 */
export interface TaskPreview {
  id: string;
  queue: string;
  type: string;
  state: TaskState;
  maxRetry: number;
  retried: number;
  /** The payload's first PREVIEW_CHARS characters as JSON text, or `<n bytes> 0a1b…`; '' without one; null when hidden. */
  payload: string | null;
  /** As `payload`, for the result. */
  result: string | null;
  /** The last error's first ERROR_PREVIEW_CHARS characters; null without one, or when hidden. */
  lastError: string | null;
  lastFailedAt: Date | null;
  group: string | null;
  nextProcessAt: Date | null;
  isOrphaned: boolean;
  retention: number;
  completedAt: Date | null;
  /** Dependencies not yet settled; 0 for a task that is not waiting. */
  waitingFor: number;
  /**
   * A waiting task's first DEPENDS_PREVIEW dependencies, the unfinished ones
   * first (what it still waits for), each in the order they were enqueued,
   * with how each settled one ended (null: not yet); [] in any other state.
   */
  dependsOn: (TaskRef & { outcome: 'completed' | 'failed' | null })[];
  /** How many dependencies a waiting task has in all; 0 in any other state. */
  dependsTotal: number;
}

/** Characters (of JSON or text) or bytes of a payload, result, headers or last error a task page carries at most. */
export const PAGE_VALUE_CHARS = 65_536;

/**
 * A value as the task page shows it, cut in PostgreSQL: a task's payload or
 * result can be tens of megabytes, and a page must stay a bounded read.
 */
export interface ValueExcerpt {
  /** `json`: JSON text; `bytes`: a binary value; `text`: a last error. */
  kind: 'json' | 'bytes' | 'text';
  /** The first PAGE_VALUE_CHARS characters of the text, or bytes of the binary value. */
  head: string | Buffer;
  /** The whole value's size in bytes (of its text as UTF-8, for JSON and text). */
  bytes: number;
  truncated: boolean;
}

/**
 * One task for the dashboard's task page: TaskInfo's facts with its payload,
 * result, headers and last error as excerpts (null: it has none; 'hidden':
 * not read, the page runs with hidePayloads). Not part of the public API:
 * Inspector.getTaskInfo returns the whole task.
 */
export type TaskPageInfo = Omit<TaskInfo, 'payload' | 'result' | 'headers' | 'lastError'> & {
  payload: ValueExcerpt | 'hidden' | null;
  result: ValueExcerpt | 'hidden' | null;
  headers: ValueExcerpt | 'hidden';
  lastError: ValueExcerpt | 'hidden' | null;
};

/** One dependency of a task as its page shows it: whom it waits for, how that one ended, and whether it is still stored. */
export interface DependencyPreview extends TaskRef {
  /** How the dependency was settled; null while it is unfinished. */
  outcome: 'completed' | 'failed' | null;
  /** The dependency's state now; null when its rows are gone (deleted, or completed without retention). */
  state: TaskState | null;
}

/** ServerInfo whose workers carry a payload of type P. */
export type ServerWith<P> = Omit<ServerInfo, 'activeWorkers'> & { activeWorkers: (Omit<WorkerInfo, 'payload'> & { payload: P })[] };

/** A live server as the dashboard shows it: each worker's payload a preview (broker/rows.ts previewOf), null when hidden. */
export type ServerPreview = ServerWith<string | null>;
