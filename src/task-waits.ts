/**
 * Client.waitFor()'s waits. One LISTEN on the schema's done channel serves
 * every wait of a client: started by the first, stopped when the last ends.
 * A notification is only a hint (anyone may send one, and one may be lost):
 * whatever wakes the waits (a notification, the poll every POLL_MS behind it,
 * a reconnect), they read where their tasks stand from the database, all in
 * one call of await_tasks(), which also marks each task awaited so that its
 * completion keeps it long enough to be read and announces it.
 */
import type { Db } from './broker/db.js';
import { awaitTasks, type AwaitedTask } from './broker/following.js';
import { createNotifier, type Notifier } from './broker/notifier.js';
import type { ClockTimer } from './internal/clock.js';
import type { Logger } from './internal/logger.js';
import { ClientClosedError, QueueNotFoundError, TaskCanceledError, TaskFailedError, TaskNotFoundError, WaitTimeoutError } from './model/errors.js';
import type { TaskInfo } from './model/task.js';

/** How often the waits read their tasks' state when no notification came: not faster than once a second, as the API promises. */
const POLL_MS = 2_000;
/**
 * How long the listener stays after the last wait ended, for the next one: a
 * new LISTEN connection per wait cost 10 ms of each enqueueAndWait (RT).
 */
const LINGER_MS = 30_000;

interface Wait {
  queue: string;
  id: string;
  /** False while its task is being enqueued (enqueueAndWait): not read until it is in. */
  enqueued: boolean;
  /** A check passed it over while it was being enqueued: check again once it is in. */
  passedOver: boolean;
  /** Settles the wait when the task has finished (or is gone); false while it has not. */
  settle(state: AwaitedTask): boolean;
  /** Ends the wait with `err`. */
  fail(err: unknown): void;
}

export class TaskWaits {
  readonly #db: Db;
  readonly #logger: Logger;
  readonly #waits = new Set<Wait>();
  #notifier: { started: Promise<void>; notifier: Notifier } | undefined;
  #poll: ClockTimer | undefined;
  /** Stops the listener LINGER_MS after the last wait ended, unless a wait starts first. */
  #linger: ClockTimer | undefined;
  /** The check that is running, and whether another was asked for meanwhile. */
  #checking: Promise<void> | undefined;
  #again = false;

  constructor(db: Db, logger: Logger) {
    this.#db = db;
    this.#logger = logger;
  }

  /**
   * Resolves with the task's TaskInfo once it completed; rejects as
   * Client.waitFor documents. With `enqueue` (enqueueAndWait), the wait starts
   * listening first, then enqueues the task (marked awaited) and reads nothing
   * until the task is in: a completion can only follow the enqueue, so the done
   * channel, heard from before it, tells of it, and no first read is needed.
   */
  wait(queue: string, id: string, timeoutMs: number | undefined, signal: AbortSignal | undefined, enqueue?: () => Promise<unknown>): Promise<TaskInfo> {
    signal?.throwIfAborted();
    let first = true;
    return new Promise<TaskInfo>((resolve, reject) => {
      let timer: ClockTimer | undefined;
      const fail = (err: unknown): void => {
        end();
        reject(err);
      };
      const end = (): void => {
        this.#waits.delete(wait);
        timer?.cancel();
        signal?.removeEventListener('abort', onAbort);
        if (this.#waits.size === 0) {
          this.#linger?.cancel();
          this.#linger = this.#db.clock.setTimeout(() => void this.#quiet(), LINGER_MS, true);
        }
      };
      const onAbort = (): void => fail(signal!.reason);
      const wait: Wait = {
        queue,
        id,
        enqueued: enqueue === undefined,
        passedOver: false,
        fail,
        settle: (s) => {
          const queueGone = first && !s.queueFound;
          first = false;
          if (s.state !== null && s.state !== 'completed' && s.state !== 'archived') return false;
          const task = s.finished;
          // await_tasks() saw it finish after the statement's snapshot was taken, which read the row
          // before: read it again at once.
          if (s.state !== null && task?.state !== s.state) {
            this.#again = true;
            return false;
          }
          if (!this.#waits.has(wait)) return true;
          end();
          if (queueGone) reject(new QueueNotFoundError(queue));
          else if (task === undefined) reject(new TaskNotFoundError(queue, id));
          else if (task.state === 'completed') resolve(task);
          else if (s.lastOutcome === 'canceled') reject(new TaskCanceledError());
          else reject(new TaskFailedError(task));
          return true;
        },
      };
      // In the set before listening starts, so that no other wait's end stops the listener meanwhile.
      this.#waits.add(wait);
      signal?.addEventListener('abort', onAbort, { once: true });
      if (timeoutMs !== undefined) timer = this.#db.clock.setTimeout(() => fail(new WaitTimeoutError(queue, id, timeoutMs)), timeoutMs);
      // Listening before the first look (or the enqueue): a task that finishes right after it is heard of.
      const listening = this.#listen();
      (enqueue === undefined ? listening.then(() => this.#check()) : listening.then(enqueue).then(() => this.#enqueued(wait))).catch(fail);
    });
  }

  /** Reads every wait's task once (now, or right after the running check) and settles the finished ones. */
  #check(): Promise<void> {
    if (this.#checking) {
      this.#again = true;
      return this.#checking;
    }
    this.#checking = (async () => {
      try {
        do {
          this.#again = false;
          const waits: Wait[] = [];
          for (const w of this.#waits) {
            if (w.enqueued) waits.push(w);
            else w.passedOver = true;
          }
          const states = await awaitTasks(this.#db, waits);
          waits.forEach((w, i) => w.settle(states[i]!));
        } while (this.#again && this.#waits.size > 0);
      } finally {
        this.#checking = undefined;
        this.#schedulePoll();
      }
    })();
    return this.#checking;
  }

  /** The wait's task is in: read it now if a wake passed it over meanwhile, else at the next wake. */
  #enqueued(wait: Wait): Promise<void> | undefined {
    wait.enqueued = true;
    if (wait.passedOver) return this.#check();
    if (this.#poll === undefined) this.#schedulePoll();
    return undefined;
  }

  #schedulePoll(): void {
    this.#poll?.cancel();
    this.#poll = this.#waits.size === 0 ? undefined : this.#db.clock.setTimeout(() => this.#wake(), POLL_MS, true);
  }

  /** A notification, the poll or a reconnect: check, logging (not throwing) a failure; the poll tries again. */
  #wake(): void {
    if (this.#waits.size === 0) return;
    this.#check().catch((err: unknown) => this.#logger.warn({ err }, 'waiting for tasks: reading their state failed; retrying'));
  }

  async #listen(): Promise<void> {
    this.#linger?.cancel();
    this.#linger = undefined;
    if (this.#notifier === undefined) {
      const notifier = createNotifier(this.#db, this.#logger.child({ component: 'wait-notifier' }));
      notifier.on(this.#db.channels.done, () => this.#wake());
      notifier.onConnected(() => this.#wake());
      this.#notifier = { notifier, started: notifier.start() };
    }
    await this.#notifier.started;
  }

  /** No wait left for LINGER_MS (or the client closes): stop listening (the next wait starts again). */
  async #quiet(): Promise<void> {
    if (this.#waits.size > 0) return;
    this.#linger?.cancel();
    this.#linger = undefined;
    this.#poll?.cancel();
    this.#poll = undefined;
    const n = this.#notifier;
    this.#notifier = undefined;
    await n?.started.catch(() => {});
    await n?.notifier.stop();
  }

  /** Stops listening; the waits still running reject with ClientClosedError. */
  async close(): Promise<void> {
    for (const w of [...this.#waits]) w.fail(new ClientClosedError());
    await this.#quiet();
  }
}
