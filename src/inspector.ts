/** Inspector: the admin API (asynq's Inspector), which the CLI and the dashboard are thin shells over. */
import { Db } from './broker/db.js';
import { CONNECTION_OPTION_KEYS, type ConnectionOptions } from './internal/connection.js';
import * as read from './broker/inspector-read.js';
import * as write from './broker/inspector-write.js';
import * as following from './inspector-following.js';
import { deleteAllInState, listInState, moveAllInState } from './inspector-states.js';
import type { AttemptInfo, TaskEvent, TaskLogLine } from './model/following.js';
import { ClientClosedError, ConfigError, FailedPreconditionError, QueueNotEmptyError, QueueNotFoundError, TaskNotFoundError } from './model/errors.js';
import { resolveLogger } from './internal/logger.js';
import { encodePayload, maxPayloadBytesOption } from './model/payload.js';
import type { TaskInfo, TaskState } from './model/task.js';
import { SINGLE_STATES } from './model/task-actions.js';
import * as v from './model/validate.js';
import type { DailyStats, GroupInfo, ListOptions, QueueInfo, QueueLimits, SchedulerEnqueueEvent, SchedulerEntry, ServerInfo } from './model/inspector-types.js';

const MAX_HISTORY_DAYS = 3650;
const INSPECTOR_OPTION_KEYS = [...CONNECTION_OPTION_KEYS, 'maxPayloadBytes'] as const satisfies readonly (keyof InspectorOptions)[];

/**
 * @internal The Inspector's private parts that the CLI's and the dashboard's
 * extra calls need (inspector-internal.ts): set by the class's static block,
 * which alone sees them.
 */
export let inspectorInternals: { db(inspector: Inspector): Db };

/** Inspector options: the connection, and the payload size cap. */
export interface InspectorOptions extends ConnectionOptions {
  /** Largest payload updateTaskPayload writes, as the Client's option. @defaultValue 1,048,576 (1 MiB) */
  maxPayloadBytes?: number;
}

/**
 * The admin API. Methods that take a queue reject with QueueNotFoundError
 * when it does not exist (but createQueue, setQueueLimits and pauseQueue,
 * which make it known); single-task methods with TaskNotFoundError when the
 * task does not; an action the task's state forbids (deleting, running or
 * archiving an active task, running a pending one, archiving an archived one,
 * editing the payload of a task that is not scheduled) with
 * FailedPreconditionError; a bad argument with a ValidationError naming it,
 * before anything is sent; any call after close() with ClientClosedError.
 * Moves made here (run, archive) neither count as processed nor failed.
 *
 * @example
 * await using inspector = new Inspector({ connectionString: process.env.DATABASE_URL });
 * const info = await inspector.getQueueInfo('default');
 * for (const t of await inspector.listRetryTasks('default', { page: 1, pageSize: 50 })) console.log(t.id, t.lastError);
 * await inspector.runAllArchivedTasks('default');
 */
export class Inspector {
  readonly #db: Db;
  readonly #maxPayloadBytes: number;

  static {
    inspectorInternals = { db: (inspector) => inspector.#open() };
  }

  constructor(opts: InspectorOptions = {}) {
    // As the Server and the Scheduler: a misspelt option is an error, never ignored.
    v.knownKeys(v.plainObject(opts, 'options', ConfigError), INSPECTOR_OPTION_KEYS, 'options', ConfigError);
    this.#maxPayloadBytes = maxPayloadBytesOption(opts.maxPayloadBytes, ConfigError);
    this.#db = new Db(opts, 'pgasynq:inspector', { logger: resolveLogger(opts) });
  }

  #open(): Db {
    if (this.#db.closed) throw new ClientClosedError('inspector');
    return this.#db;
  }

  /**
   * Every queue's name, sorted. A queue is known once a task was enqueued to
   * it, a server that serves it started, or createQueue, setQueueLimits or
   * pauseQueue named it.
   */
  async queues(): Promise<string[]> {
    return read.listQueues(this.#open());
  }

  /** Counts per state, latency, and today's and all-time processed/failed of one queue. */
  async getQueueInfo(queue: string): Promise<QueueInfo> {
    const q = v.queueName(queue);
    const info = await read.queueStats(this.#open(), q);
    if (!info) throw new QueueNotFoundError(q);
    return info;
  }

  /** The last `days` UTC days of processed/failed counts, today first; zeros for quiet days. */
  async history(queue: string, days: number): Promise<DailyStats[]> {
    const q = v.queueName(queue);
    const n = v.integer(days, 'days', 1, MAX_HISTORY_DAYS);
    const rows = await read.dailyStats(this.#open(), q, n);
    if (rows.length === 0) throw new QueueNotFoundError(q);
    return rows;
  }

  /** One task, in whatever state. Rejects with TaskNotFoundError when there is none with this id. */
  async getTaskInfo(queue: string, id: string): Promise<TaskInfo> {
    const q = v.queueName(queue);
    const taskId = v.taskId(id);
    const info = read.inQueue(q, await read.taskInfo(this.#open(), q, taskId));
    if (!info) throw new TaskNotFoundError(q, taskId);
    return info;
  }

  /**
   * Every run of a task, oldest first: the ended ones (the last 100) with how
   * each ended and its error, then the one running now (`running`).
   */
  listAttempts(queue: string, id: string): Promise<AttemptInfo[]> {
    return following.listAttempts(this.#open(), queue, id);
  }

  /** The lines the task's handler kept with ctx.log(), oldest first (the newest `tail` with one; at most 1,000 are kept). */
  getTaskLogs(queue: string, id: string, opts?: { tail?: number }): Promise<TaskLogLine[]> {
    return following.getTaskLogs(this.#open(), queue, id, opts);
  }

  /**
   * Events of every server (a task started, completed, failed, archived, or
   * reported progress) on `queue` or all queues, from now until `signal` aborts;
   * in commit order per task. An event is a notification: to decide, read the task.
   * @example for await (const e of inspector.watch({ queue: 'critical' })) console.log(e.kind, e.id);
   */
  watch(opts?: { queue?: string; signal?: AbortSignal }): AsyncIterable<TaskEvent> {
    return following.watch(this.#open(), opts);
  }

  /** Pending tasks in the order they will run. */
  listPendingTasks(queue: string, opts?: ListOptions): Promise<TaskInfo[]> {
    return listInState(this.#open(), queue, 'pending', opts);
  }
  /** Active tasks by start time; `isOrphaned` marks those whose lease expired. */
  listActiveTasks(queue: string, opts?: ListOptions): Promise<TaskInfo[]> {
    return listInState(this.#open(), queue, 'active', opts);
  }
  /** Scheduled tasks, soonest due first. */
  listScheduledTasks(queue: string, opts?: ListOptions): Promise<TaskInfo[]> {
    return listInState(this.#open(), queue, 'scheduled', opts);
  }
  /** Tasks waiting to be retried, soonest due first. */
  listRetryTasks(queue: string, opts?: ListOptions): Promise<TaskInfo[]> {
    return listInState(this.#open(), queue, 'retry', opts);
  }
  /** Archived tasks, oldest archived first. */
  listArchivedTasks(queue: string, opts?: ListOptions): Promise<TaskInfo[]> {
    return listInState(this.#open(), queue, 'archived', opts);
  }
  /** Completed tasks kept for their retention, the first to expire first (asynq's order). */
  listCompletedTasks(queue: string, opts?: ListOptions): Promise<TaskInfo[]> {
    return listInState(this.#open(), queue, 'completed', opts);
  }
  /** Aggregating tasks of one group, in enqueue order. */
  listAggregatingTasks(queue: string, group: string, opts?: ListOptions): Promise<TaskInfo[]> {
    return listInState(this.#open(), queue, 'aggregating', opts, group);
  }
  /** Tasks waiting for their dependencies, in enqueue order; `waitingFor` says for how many. */
  listWaitingTasks(queue: string, opts?: ListOptions): Promise<TaskInfo[]> {
    return listInState(this.#open(), queue, 'waiting', opts);
  }

  /** Throws the error a single-task action's result calls for. */
  #check(q: string, id: string, r: write.TaskActionResult, refusal: (state: TaskState) => string): void {
    if (!r.queueFound) throw new QueueNotFoundError(q);
    if (r.state === null) throw new TaskNotFoundError(q, id);
    if (!r.done) throw new FailedPreconditionError(refusal(r.state));
  }

  /**
   * Deletes a task in any state but active, and releases its unique lock if
   * it holds it. An active task is refused: cancel it with cancelProcessing.
   * Tasks that depend on it and had not seen it complete count it as failed:
   * those with onDependencyFailure 'archive' are archived, the others run.
   */
  async deleteTask(queue: string, id: string): Promise<void> {
    const q = v.queueName(queue);
    const taskId = v.taskId(id);
    const r = await write.actOnTask(this.#open(), q, taskId, 'delete', SINGLE_STATES.delete);
    this.#check(q, taskId, r, () => `cannot delete task in active state: id=${taskId}, queue=${q}; use cancelProcessing instead`);
  }

  /**
   * Makes a scheduled, retry, archived, completed, aggregating or waiting task
   * pending now, at the back of its queue (a waiting one without waiting for
   * its dependencies any longer). Refused for an active or a pending task.
   */
  async runTask(queue: string, id: string): Promise<void> {
    const q = v.queueName(queue);
    const taskId = v.taskId(id);
    const r = await write.actOnTask(this.#open(), q, taskId, 'pending', SINGLE_STATES.run);
    this.#check(q, taskId, r, (state) =>
      state === 'active' ? `task is already running: id=${taskId}, queue=${q}` : `task is already in pending state: id=${taskId}, queue=${q}`,
    );
  }

  /**
   * Archives a pending, scheduled, retry, completed, aggregating or waiting
   * task. Refused for an active task (cancel it first) or an archived one.
   * Its dependents count it as failed (see deleteTask).
   */
  async archiveTask(queue: string, id: string): Promise<void> {
    const q = v.queueName(queue);
    const taskId = v.taskId(id);
    const r = await write.actOnTask(this.#open(), q, taskId, 'archived', SINGLE_STATES.archive);
    this.#check(q, taskId, r, (state) =>
      state === 'active'
        ? `cannot archive task in active state: id=${taskId}, queue=${q}; use cancelProcessing instead`
        : `task is already archived: id=${taskId}, queue=${q}`,
    );
  }

  /** Replaces the payload of a scheduled task (any other state is refused). Its unique key is kept. */
  async updateTaskPayload(queue: string, id: string, payload: unknown): Promise<void> {
    const q = v.queueName(queue);
    const taskId = v.taskId(id);
    const encoded = encodePayload(payload, 'payload', this.#maxPayloadBytes);
    const r = await write.updatePayload(this.#open(), q, taskId, encoded.json, encoded.bytes);
    this.#check(q, taskId, r, (state) => `cannot update task that is not in scheduled state: id=${taskId}, queue=${q}, state=${state}`);
  }

  /**
   * Cancels the active task(s) with this id, in any queue: its handler's
   * signal aborts with TaskCanceledError and the task goes to retry (or the
   * archive when its retries are spent). Best effort, as in asynq: resolves
   * to how many active tasks were marked (0: none was running). The server
   * hears a NOTIFY at once; if it missed it, its next heartbeat sees the mark.
   */
  async cancelProcessing(id: string): Promise<number> {
    const taskId = v.taskId(id);
    return write.requestCancel(this.#open(), taskId);
  }

  /** Deletes every pending task of the queue; resolves to how many. Unique locks they hold are released. */
  deleteAllPendingTasks(queue: string): Promise<number> {
    return deleteAllInState(this.#open(), queue, 'pending');
  }
  /** Deletes every scheduled task of the queue; resolves to how many. Unique locks they hold are released. */
  deleteAllScheduledTasks(queue: string): Promise<number> {
    return deleteAllInState(this.#open(), queue, 'scheduled');
  }
  /** Deletes every task of the queue waiting for a retry; resolves to how many. */
  deleteAllRetryTasks(queue: string): Promise<number> {
    return deleteAllInState(this.#open(), queue, 'retry');
  }
  /** Deletes every archived task of the queue; resolves to how many. */
  deleteAllArchivedTasks(queue: string): Promise<number> {
    return deleteAllInState(this.#open(), queue, 'archived');
  }
  /** Deletes every completed task of the queue before its retention ends; resolves to how many. */
  deleteAllCompletedTasks(queue: string): Promise<number> {
    return deleteAllInState(this.#open(), queue, 'completed');
  }
  /** Deletes every aggregating task of one group of the queue; resolves to how many. */
  deleteAllAggregatingTasks(queue: string, group: string): Promise<number> {
    return deleteAllInState(this.#open(), queue, 'aggregating', group);
  }
  /** Deletes every waiting task of the queue; resolves to how many. Tasks that depend on them count them as failed. */
  deleteAllWaitingTasks(queue: string): Promise<number> {
    return deleteAllInState(this.#open(), queue, 'waiting');
  }
  /** Makes every scheduled task of the queue pending now; resolves to how many. */
  runAllScheduledTasks(queue: string): Promise<number> {
    return moveAllInState(this.#open(), queue, 'scheduled', 'pending');
  }
  /** Makes every retry task of the queue pending now, without waiting for its delay; resolves to how many. */
  runAllRetryTasks(queue: string): Promise<number> {
    return moveAllInState(this.#open(), queue, 'retry', 'pending');
  }
  /** Makes every archived task of the queue pending again, retry count unchanged; resolves to how many. */
  runAllArchivedTasks(queue: string): Promise<number> {
    return moveAllInState(this.#open(), queue, 'archived', 'pending');
  }
  /** Makes every task of the group pending, one by one, without aggregating them. */
  runAllAggregatingTasks(queue: string, group: string): Promise<number> {
    return moveAllInState(this.#open(), queue, 'aggregating', 'pending', group);
  }
  /** Makes every waiting task of the queue pending now, without waiting for its dependencies; resolves to how many. */
  runAllWaitingTasks(queue: string): Promise<number> {
    return moveAllInState(this.#open(), queue, 'waiting', 'pending');
  }
  /** Archives every pending task of the queue; resolves to how many. */
  archiveAllPendingTasks(queue: string): Promise<number> {
    return moveAllInState(this.#open(), queue, 'pending', 'archived');
  }
  /** Archives every scheduled task of the queue; resolves to how many. */
  archiveAllScheduledTasks(queue: string): Promise<number> {
    return moveAllInState(this.#open(), queue, 'scheduled', 'archived');
  }
  /** Archives every retry task of the queue; resolves to how many. */
  archiveAllRetryTasks(queue: string): Promise<number> {
    return moveAllInState(this.#open(), queue, 'retry', 'archived');
  }
  /** Archives every waiting task of the queue; resolves to how many. Tasks that depend on them count them as failed. */
  archiveAllWaitingTasks(queue: string): Promise<number> {
    return moveAllInState(this.#open(), queue, 'waiting', 'archived');
  }
  /** Archives every aggregating task of one group of the queue; resolves to how many. */
  archiveAllAggregatingTasks(queue: string, group: string): Promise<number> {
    return moveAllInState(this.#open(), queue, 'aggregating', 'archived', group);
  }

  /**
   * Stops servers from claiming the queue's tasks; running ones finish, and
   * enqueueing, scheduling and retries go on. Refused if already paused. A
   * queue not known yet is made known, paused: its first tasks wait.
   */
  async pauseQueue(queue: string): Promise<void> {
    const q = v.queueName(queue);
    const { wasPaused } = await write.setPaused(this.#open(), q, true, true);
    if (wasPaused) throw new FailedPreconditionError(`queue "${q}" is already paused`);
  }

  /**
   * Sets the queue's limits, replacing the ones it had: `concurrency` active
   * tasks at most across all servers, `keyConcurrency` per concurrencyKey,
   * `rateLimit.limit` starts in any `rateLimit.interval` ms. A limit null or
   * left out is cleared (`{}` clears all). The claim enforces them, so they
   * hold for every server at once, from its next claim on. A queue not known
   * yet is made known with them: they hold for its first task.
   */
  async setQueueLimits(queue: string, limits: Partial<QueueLimits>): Promise<void> {
    const q = v.queueName(queue);
    await write.setLimits(this.#open(), q, v.queueLimits(limits));
  }

  /**
   * Makes a queue known before its first task, or configures a known one
   * (idempotent: an existing queue keeps its tasks, and what `opts` leaves
   * out). `limits` replaces the queue's limits as setQueueLimits does;
   * `paused` sets its flag. Resolves to the queue's info afterwards.
   */
  async createQueue(queue: string, opts: { limits?: Partial<QueueLimits>; paused?: boolean } = {}): Promise<QueueInfo> {
    const q = v.queueName(queue);
    const o = v.plainObject(opts, 'options');
    v.knownKeys(o, ['limits', 'paused'], 'options');
    const config = {
      ...(o.limits === undefined ? {} : { limits: v.queueLimits(o.limits) }),
      ...(o.paused === undefined ? {} : { paused: v.boolean(o.paused, 'paused') }),
    };
    await write.createQueue(this.#open(), q, config);
    return this.getQueueInfo(q);
  }

  /** Lets servers claim the queue's tasks again, at once. Refused if not paused. */
  async unpauseQueue(queue: string): Promise<void> {
    const q = v.queueName(queue);
    const { wasPaused } = await write.setPaused(this.#open(), q, false, false);
    if (wasPaused === null) throw new QueueNotFoundError(q);
    if (!wasPaused) throw new FailedPreconditionError(`queue "${q}" is not paused`);
  }

  /**
   * Removes a queue with its daily stats. Without `force` the queue must hold
   * no task at all (QueueNotEmptyError); with `force` all its tasks are
   * deleted too, unless one is active (FailedPreconditionError: cancel or
   * wait for it).
   */
  async deleteQueue(queue: string, force = false): Promise<void> {
    const q = v.queueName(queue);
    const f = v.boolean(force, 'force');
    const r = await write.deleteQueue(this.#open(), q, f);
    if (!r.queueFound) throw new QueueNotFoundError(q);
    if (r.deleted) return;
    if (!f || !r.hasActive) throw new QueueNotEmptyError(q);
    throw new FailedPreconditionError(`cannot remove queue "${q}" with active tasks`);
  }

  /** The queue's groups of aggregating tasks, by name. */
  async groups(queue: string): Promise<GroupInfo[]> {
    const q = v.queueName(queue);
    return read.inQueue(q, await read.listGroups(this.#open(), q));
  }

  /** Live servers, oldest first, each with the tasks it is running. */
  async servers(): Promise<ServerInfo[]> {
    return read.listServers(this.#open());
  }

  /** Cron entries registered by live schedulers. */
  async schedulerEntries(): Promise<SchedulerEntry[]> {
    return read.listSchedulerEntries(this.#open());
  }

  /** The tasks an entry enqueued, newest first. The history outlives the scheduler. */
  async listSchedulerEnqueueEvents(entryId: string, opts?: ListOptions): Promise<SchedulerEnqueueEvent[]> {
    const id = v.taskId(entryId, 'entryId');
    const page = v.listPage(opts);
    return read.listSchedulerEvents(this.#open(), id, page.limit, page.offset);
  }

  /** Ends the pool if the inspector created it. */
  close(): Promise<void> {
    return this.#db.close();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
