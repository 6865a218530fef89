/**
 * pgasynq/testing's enqueue assertions: "a task of type T whose payload
 * matches P was enqueued" (or was not), read from the database in any state,
 * so that a task that already ran, failed or waits still counts. They throw
 * node's AssertionError, which every test runner reports as a failed
 * assertion, with what was enqueued of that type beside what was expected.
 */
import { AssertionError } from 'node:assert';
import { isDeepStrictEqual } from 'node:util';
import { Inspector } from '../inspector.js';
import { tasksOfType } from '../inspector-internal.js';
import { InvalidOptionError } from '../model/errors.js';
import { TASK_STATES, type TaskInfo, type TaskState } from '../model/task.js';
import * as v from '../model/validate.js';
import { connectionOf, type TestConnection } from './waits.js';

export interface EnqueuedMatch {
  /** Only tasks of this queue. @defaultValue any queue */
  queue?: string;
  /**
   * A task matches when its payload holds every key of this object with an
   * equal value (nested objects the same way; arrays and other values must be
   * equal). A value that is not an object must equal the payload.
   * @defaultValue any payload
   */
  payload?: unknown;
  /** Only tasks in this state. @defaultValue any state */
  state?: TaskState;
  /** requireEnqueued(): exactly this many tasks must match. @defaultValue at least one */
  count?: number;
}

/**
 * Asserts that a task of `type` matching `match` was enqueued and resolves
 * with the matching tasks, oldest first. Throws node's AssertionError when
 * none does (or not exactly `count`).
 *
 * @example
 * const [task] = await requireEnqueued(testDb, 'email:welcome', { payload: { userId: 1 } });
 */
export async function requireEnqueued(db: TestConnection, type: string, match: EnqueuedMatch = {}): Promise<TaskInfo[]> {
  const m = checkMatch(match, true);
  const { all, matching } = await find(db, type, m);
  const ok = m.count === undefined ? matching.length > 0 : matching.length === m.count;
  if (!ok) {
    const wanted = m.count === undefined ? 'at least one task' : `${m.count} task${m.count === 1 ? '' : 's'}`;
    throw failure(`expected ${wanted} of type ${JSON.stringify(type)}${described(m)}, found ${matching.length}`, all, m, 'requireEnqueued');
  }
  return matching;
}

/** Asserts that no task of `type` matching `match` was enqueued. Throws node's AssertionError listing those that were. */
export async function requireNotEnqueued(db: TestConnection, type: string, match: Omit<EnqueuedMatch, 'count'> = {}): Promise<void> {
  const m = checkMatch(match, false);
  const { matching } = await find(db, type, m);
  if (matching.length > 0) {
    throw failure(`expected no task of type ${JSON.stringify(type)}${described(m)}, found ${matching.length}`, matching, m, 'requireNotEnqueued');
  }
}

/** True when `actual` holds everything `expected` has (see EnqueuedMatch.payload). */
export function payloadMatches(actual: unknown, expected: unknown): boolean {
  if (!isPlainObject(expected)) return isDeepStrictEqual(actual, expected);
  if (!isPlainObject(actual)) return false;
  return Object.entries(expected).every(([key, value]) => Object.hasOwn(actual, key) && payloadMatches(actual[key], value));
}

async function find(db: TestConnection, type: string, m: EnqueuedMatch): Promise<{ all: TaskInfo[]; matching: TaskInfo[] }> {
  const inspector = new Inspector({ ...connectionOf(db), logger: false });
  try {
    const all = await tasksOfType(inspector, type, m.queue);
    const matching = all.filter((t) => (m.state === undefined || t.state === m.state) && (!('payload' in m) || payloadMatches(t.payload, m.payload)));
    return { all, matching };
  } finally {
    await inspector.close();
  }
}

function checkMatch(match: unknown, withCount: boolean): EnqueuedMatch {
  const m = v.plainObject(match, 'match');
  v.knownKeys(m, withCount ? ['queue', 'payload', 'state', 'count'] : ['queue', 'payload', 'state'], 'match');
  if (m.queue !== undefined) v.queueName(m.queue, 'match.queue');
  if (m.state !== undefined && !(TASK_STATES as readonly unknown[]).includes(m.state)) {
    throw new InvalidOptionError('match.state', `must be one of ${TASK_STATES.join(', ')} (got ${v.describeValue(m.state)})`);
  }
  if (m.count !== undefined) v.integer(m.count, 'match.count', 0, 1_000);
  return m;
}

function described(m: EnqueuedMatch): string {
  return [
    m.queue === undefined ? '' : ` in queue ${JSON.stringify(m.queue)}`,
    m.state === undefined ? '' : ` in state ${m.state}`,
    'payload' in m ? ' with a matching payload' : '',
  ].join('');
}

/** What the message lists of the tasks found: the first few, as the test's reader needs them. */
const LISTED = 20;

function failure(message: string, found: TaskInfo[], m: EnqueuedMatch, operator: string): AssertionError {
  const seen = found.map((t) => ({ queue: t.queue, id: t.id, state: t.state, payload: t.payload }));
  const listed = seen.length === 0 ? 'none' : JSON.stringify(seen.slice(0, LISTED)) + (seen.length > LISTED ? ` and ${seen.length - LISTED} more` : '');
  return new AssertionError({ message: `${message}; of that type: ${listed}`, actual: seen, expected: m, operator });
}

function isPlainObject(x: unknown): x is Record<string, unknown> {
  return typeof x === 'object' && x !== null && !Array.isArray(x) && !(x instanceof Uint8Array);
}
