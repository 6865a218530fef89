/**
 * What the Inspector returns, apart from TaskInfo (src/model/task.ts). Field names
 * are asynq's, in camelCase; durations are ms, instants Dates.
 */

/** A snapshot of one queue (asynq's QueueInfo); also a row of the queue_stats view. */
export interface QueueInfo {
  queue: string;
  /** Tasks in every state, completed, aggregating and waiting included. */
  size: number;
  /** Groups with aggregating tasks. */
  groups: number;
  /** ms the oldest pending task has waited (by when it became pending); 0 when none waits. */
  latency: number;
  pending: number;
  active: number;
  scheduled: number;
  retry: number;
  archived: number;
  completed: number;
  aggregating: number;
  /** Tasks waiting for their dependencies. */
  waiting: number;
  /** Finished attempts today (UTC), successes and failures both, as in asynq. */
  processed: number;
  /** Failed attempts today (UTC). */
  failed: number;
  processedTotal: number;
  failedTotal: number;
  paused: boolean;
  /** The queue's limits (Inspector.setQueueLimits), each null when not set. */
  limits: QueueLimits;
  /** When the snapshot was taken (database clock). */
  timestamp: Date;
}

/**
 * A queue's flow-control limits, enforced by the claim across all servers.
 * Prefetched tasks count as active.
 */
export interface QueueLimits {
  /** The most active tasks of the queue, all servers together. */
  concurrency: number | null;
  /** The most active tasks per `concurrencyKey` (tasks without a key are not counted). */
  keyConcurrency: number | null;
  /** The most starts in any span of `interval` ms (a sliding window). */
  rateLimit: { limit: number; interval: number } | null;
}

/** One UTC day of a queue's counts. */
export interface DailyStats {
  queue: string;
  /** The day's UTC midnight. */
  date: Date;
  processed: number;
  failed: number;
}

/** Paging of the list methods. */
export interface ListOptions {
  /** 1-based. @defaultValue 1 */
  page?: number;
  /** 1–1000. @defaultValue 30 */
  pageSize?: number;
}

export interface GroupInfo {
  group: string;
  /** Aggregating tasks in the group. */
  size: number;
}

/** A task a server is running (asynq's WorkerInfo). */
export interface WorkerInfo {
  taskId: string;
  queue: string;
  type: string;
  payload: unknown;
  startedAt: Date;
  /** Until when the server holds the task; extended by every heartbeat. */
  leaseExpiresAt: Date;
  /** When the attempt times out: the earlier of start + timeout and the task's deadline. */
  deadline: Date | null;
}

/** A live server (asynq's ServerInfo). */
export interface ServerInfo {
  id: string;
  host: string;
  pid: number;
  concurrency: number;
  /** Queue names and their priority weights. */
  queues: Record<string, number>;
  strictPriority: boolean;
  status: string;
  startedAt: Date;
  /** The tasks it runs now: the active tasks whose lease it holds. */
  activeWorkers: WorkerInfo[];
}

/** A cron entry of a live scheduler. */
export interface SchedulerEntry {
  id: string;
  spec: string;
  task: { type: string; payload: unknown };
  /** The enqueue options the entry was registered with (the task's and register's), as JSON: instants are ISO strings. */
  options: Record<string, unknown>;
  next: Date | null;
  prev: Date | null;
}

/** One tick of a cron entry that enqueued a task. */
export interface SchedulerEnqueueEvent {
  taskId: string;
  enqueuedAt: Date;
  /** The scheduled instant of the tick. */
  tickAt: Date;
}
