/**
 * What the Inspector's test files share (not a test file itself): each file's
 * schema with a fast Server config, helpers that write tasks in a given state
 * and read their rows, a LISTEN on the schema's channels, and every method
 * that takes a queue.
 */
import pg from 'pg';
import { Task, type Inspector } from '../src/index.js';
import { setupDb } from './helpers.js';

/** An Inspector test file on schema `name` (setupDb's, emptied before each test), with writers and readers of its tasks. */
export function setupInspector(name: string) {
  const file = setupDb(name, {
    resetEach: true,
    // Fast durations, as in the server-*.test.ts files.
    server: { concurrency: 4, taskCheckInterval: 50, delayedTaskCheckInterval: 50, leaseDuration: 2000, heartbeatInterval: 200 },
  });
  const { db, client } = file;
  const row = async (queue: string, id: string) => (await db.query('SELECT * FROM {{schema}}.tasks WHERE queue = $1 AND id = $2', [queue, id]))[0];
  const put = (queue: string, id: string, extra: Record<string, unknown> = {}) => client.enqueue(new Task('job', { id }), { queue, taskId: id, ...extra });
  /** Rewrites a row's state with the columns that state needs (SQL `set`, $1 = queue, $2 = id). */
  const force = (queue: string, id: string, set: string) => db.query(`UPDATE {{schema}}.tasks SET ${set} WHERE queue = $1 AND id = $2`, [queue, id]);

  /** One task in each state in queue `q`, ids named after the state (two pending). */
  const everyState = async (q: string): Promise<void> => {
    await put(q, 'p1');
    await put(q, 'p2');
    await put(q, 'sch', { processIn: 3_600_000 });
    await put(q, 'ret');
    await force(q, 'ret', "state = 'retry', run_at = now() + interval '1 min', retried = 1, error_msg = 'boom', last_failed_at = now()");
    await put(q, 'arc');
    await force(q, 'arc', "state = 'archived', run_at = now(), error_msg = 'dead', last_failed_at = now()");
    await put(q, 'com', { retention: 3_600_000 });
    await force(q, 'com', "state = 'completed', completed_at = now(), run_at = now() + interval '1 hour'");
    await put(q, 'act');
    await force(q, 'act', ACTIVE);
    await put(q, 'agg1', { group: 'g1' });
    await put(q, 'agg2', { group: 'g2' });
  };

  /** LISTENs on a channel of the test schema and collects payloads. */
  const listen = async (channel: string): Promise<{ payloads: string[]; close: () => Promise<void> }> => {
    const c = new pg.Client({ connectionString: db.connectionString });
    await c.connect();
    const payloads: string[] = [];
    c.on('notification', (n) => n.channel === channel && payloads.push(n.payload ?? ''));
    await c.query(`LISTEN "${channel}"`);
    return { payloads, close: () => c.end() };
  };

  return { ...file, row, put, force, everyState, listen };
}

/** The columns of an active task, leased to a server named srv (a `set` for force()). */
export const ACTIVE =
  "state = 'active', run_at = NULL, lease_owner = 'srv', lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 min', started_at = now()";
/** The ids of a list of tasks, in order. */
export const ids = (tasks: { id: string }[]) => tasks.map((t) => t.id);

type QueueCall = [string, (i: Inspector, q: string) => Promise<unknown>];
/** The Inspector's methods that take nothing but the queue. */
type QueueOnly = Extract<{ [K in keyof Inspector]: Inspector[K] extends (q: string) => Promise<unknown> ? K : never }[keyof Inspector], string>;
/** Rows of QUEUE_METHODS for methods called with the queue alone. */
const only = (...names: QueueOnly[]): QueueCall[] => names.map((name) => [name, (i, q) => (i[name] as (q: string) => Promise<unknown>).call(i, q)]);

/** Every method that takes a queue, called on `q`. */
export const QUEUE_METHODS: QueueCall[] = [
  ...only('getQueueInfo'),
  ['history', (i, q) => i.history(q, 7)],
  ['getTaskInfo', (i, q) => i.getTaskInfo(q, 'x')],
  ...only('listPendingTasks', 'listActiveTasks', 'listScheduledTasks', 'listRetryTasks', 'listArchivedTasks', 'listCompletedTasks'),
  ['listAggregatingTasks', (i, q) => i.listAggregatingTasks(q, 'g')],
  ...only('listWaitingTasks'),
  ['deleteTask', (i, q) => i.deleteTask(q, 'x')],
  ['runTask', (i, q) => i.runTask(q, 'x')],
  ['archiveTask', (i, q) => i.archiveTask(q, 'x')],
  ['updateTaskPayload', (i, q) => i.updateTaskPayload(q, 'x', { a: 1 })],
  ...only('deleteAllPendingTasks', 'deleteAllScheduledTasks', 'deleteAllRetryTasks', 'deleteAllArchivedTasks', 'deleteAllCompletedTasks'),
  ['deleteAllAggregatingTasks', (i, q) => i.deleteAllAggregatingTasks(q, 'g')],
  ...only('deleteAllWaitingTasks', 'runAllScheduledTasks', 'runAllRetryTasks', 'runAllArchivedTasks'),
  ['runAllAggregatingTasks', (i, q) => i.runAllAggregatingTasks(q, 'g')],
  ...only('runAllWaitingTasks', 'archiveAllPendingTasks', 'archiveAllScheduledTasks', 'archiveAllRetryTasks'),
  ['archiveAllAggregatingTasks', (i, q) => i.archiveAllAggregatingTasks(q, 'g')],
  ...only('archiveAllWaitingTasks'),
  // Not pauseQueue, setQueueLimits or createQueue: they make an unknown queue known (queues-known.test.ts).
  ...only('unpauseQueue', 'deleteQueue'),
  ['deleteQueue force', (i, q) => i.deleteQueue(q, true)],
  ...only('groups'),
];
