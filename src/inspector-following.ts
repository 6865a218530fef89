/**
 * The Inspector's reads of what a task did (its attempts, its log lines) and
 * its watch of the servers' events. Each validates its arguments, then runs
 * the broker's statement; the CLI and the dashboard call them through the
 * Inspector's methods.
 */
import type { Db } from './broker/db.js';
import { taskAttempts, taskLogs, unwatchTasks, watchTasks } from './broker/following.js';
import { inQueue, type InQueue } from './broker/inspector-read.js';
import { createNotifier } from './broker/notifier.js';
import type { ClockTimer } from './internal/clock.js';
import { InvalidOptionError, TaskNotFoundError } from './model/errors.js';
import { MAX_LOG_LINES, type AttemptInfo, type TaskEvent, type TaskLogLine } from './model/following.js';
import * as v from './model/validate.js';

/** A task's record of its own, or TaskNotFoundError / QueueNotFoundError. */
async function ofTask<T>(queue: string, id: string, read: (q: string, taskId: string) => Promise<InQueue<T | undefined>>): Promise<T> {
  const q = v.queueName(queue);
  const taskId = v.taskId(id);
  const value = inQueue(q, await read(q, taskId));
  if (value === undefined) throw new TaskNotFoundError(q, taskId);
  return value;
}

export async function listAttempts(db: Db, queue: string, id: string): Promise<AttemptInfo[]> {
  return ofTask(queue, id, (q, taskId) => taskAttempts(db, q, taskId));
}

export async function getTaskLogs(db: Db, queue: string, id: string, opts: unknown): Promise<TaskLogLine[]> {
  const o = v.plainObject(opts ?? {}, 'options');
  v.knownKeys(o, ['tail'], 'options');
  const tail = o.tail === undefined ? undefined : v.integer(o.tail, 'tail', 1, MAX_LOG_LINES);
  return ofTask(queue, id, (q, taskId) => taskLogs(db, q, taskId, tail));
}

/** How long a watcher's registration lasts without renewal; renewed every third of it. */
const WATCH_TTL_MS = 30_000;
/** Events held for a consumer that reads slower than they come; the oldest are dropped past it. */
const MAX_BUFFERED_EVENTS = 10_000;
const KINDS: readonly TaskEvent['kind'][] = ['started', 'completed', 'failed', 'archived', 'progress'];

/**
 * The events a notification carries (a JSON array of them: the servers send a
 * claim's or a completion batch's events together), leaving out whatever is
 * not one. Anyone who can connect may notify the channel: the shape is
 * checked, and an event remains only what the notification says.
 */
export function parseEvents(payload: string): TaskEvent[] {
  let list: unknown;
  try {
    list = JSON.parse(payload);
  } catch {
    return [];
  }
  if (!Array.isArray(list)) return [];
  return list.map(toEvent).filter((e) => e !== undefined);
}

/** An event's fields in the order of its array form (0016); schemas before it send objects. */
const EVENT_FIELDS = ['kind', 'queue', 'id', 'type', 'attempt', 'at', 'error', 'progress'] as const;

function toEvent(e: unknown): TaskEvent | undefined {
  if (typeof e !== 'object' || e === null) return undefined;
  const fields: readonly unknown[] = Array.isArray(e) ? (e as unknown[]) : EVENT_FIELDS.map((name) => (e as Record<string, unknown>)[name]);
  const [kind, queue, id, type, attempt, at, error, progress] = fields;
  if (!KINDS.includes(kind as TaskEvent['kind']) || typeof queue !== 'string' || typeof id !== 'string' || typeof type !== 'string') return undefined;
  const when = typeof at === 'string' ? new Date(at) : undefined;
  if (typeof attempt !== 'number' || when === undefined || Number.isNaN(when.getTime())) return undefined;
  const event: TaskEvent = { kind: kind as TaskEvent['kind'], queue, id, type, attempt, at: when };
  if (typeof error === 'string') event.error = error;
  if (typeof progress === 'number' || (typeof progress === 'object' && progress !== null && !Array.isArray(progress))) {
    event.progress = progress as TaskEvent['progress'];
  }
  return event;
}

/**
 * The servers' events for `opts.queue` (every queue without one) from now
 * on, until `opts.signal` aborts or the loop breaks. Listening starts before
 * the watcher is registered, so no event of the registration's time is
 * missed; the servers send events only while a registration covers the
 * queue, and it lapses WATCH_TTL_MS after the watcher stops renewing it.
 */
export async function* watch(db: Db, opts: unknown): AsyncGenerator<TaskEvent, void, undefined> {
  const o = v.plainObject(opts ?? {}, 'options');
  v.knownKeys(o, ['queue', 'signal'], 'options');
  const queue = o.queue === undefined ? null : v.queueName(o.queue);
  const signal = o.signal;
  if (signal !== undefined && !(signal instanceof AbortSignal))
    throw new InvalidOptionError('signal', `must be an AbortSignal (got ${v.describeValue(signal)})`);
  if (signal?.aborted) return;
  const logger = db.logger.child({ component: 'watch' });
  const events: TaskEvent[] = [];
  let wake: (() => void) | undefined;
  let dropped = 0;
  const notifier = createNotifier(db, logger);
  notifier.on(db.channels.events, (payload) => {
    for (const event of parseEvents(payload)) {
      if (queue !== null && event.queue !== queue) continue;
      if (events.push(event) > MAX_BUFFERED_EVENTS) {
        events.shift();
        if (dropped++ === 0) logger.warn({ max: MAX_BUFFERED_EVENTS }, 'watch: events come faster than they are read; the oldest are dropped');
      }
    }
    wake?.();
  });
  const onAbort = (): void => wake?.();
  signal?.addEventListener('abort', onAbort);
  let watcher: string | undefined;
  let renewal: ClockTimer | undefined;
  let stopped = false;
  const renew = (): void => {
    if (stopped) return;
    renewal = db.clock.setTimeout(
      () => {
        watchTasks(db, watcher ?? null, queue, WATCH_TTL_MS)
          .then((id) => (watcher = id))
          .catch((err: unknown) => logger.warn({ err }, 'watch: renewing the registration failed; retrying'))
          .finally(renew);
      },
      WATCH_TTL_MS / 3,
      true,
    );
  };
  try {
    await notifier.start();
    watcher = await watchTasks(db, null, queue, WATCH_TTL_MS);
    renew();
    while (!signal?.aborted) {
      const event = events.shift();
      if (event !== undefined) {
        yield event;
        continue;
      }
      await new Promise<void>((resolve) => (wake = resolve));
      wake = undefined;
    }
  } finally {
    stopped = true;
    signal?.removeEventListener('abort', onAbort);
    renewal?.cancel();
    if (watcher !== undefined) await unwatchTasks(db, watcher).catch((err: unknown) => logger.debug({ err }, 'watch: unregistering failed; it lapses'));
    await notifier.stop();
  }
}
