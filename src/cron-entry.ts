/**
 * A cron registration, checked and turned into its entry: the schedule, the
 * task and its options, and the entry id every scheduler derives alike from
 * them (so the same registration on many hosts is one entry). Shared by
 * Scheduler and PeriodicTaskManager.
 */
import { createHash } from 'node:crypto';
import type { EntryRow } from './broker/scheduler.js';
import { parseSchedule, type Schedule } from './model/cron.js';
import { InvalidOptionError, InvalidTaskTypeError } from './model/errors.js';
import { Task, toRecord, validateOptions, type EnqueueOptions } from './model/task.js';

/** @internal One registered entry. Only the loop writes `cursor` and `nextDue`. */
export interface Entry {
  readonly id: string;
  readonly schedule: Schedule;
  readonly task: Task;
  readonly overrides: EnqueueOptions;
  readonly row: Omit<EntryRow, 'nextRunAt'>;
  /** The last tick this scheduler handled (or saw handled); null until loaded from the history. */
  cursor: Date | null;
  /** The first tick after `cursor` (null: none, or not loaded). */
  nextDue: Date | null;
}

/** Sorted-key JSON: the same value gives the same text whatever the key order. */
function canonical(value: unknown): string {
  return JSON.stringify(value, (_k, v: unknown) => {
    if (v === null || typeof v !== 'object' || Array.isArray(v)) return v;
    return Object.fromEntries(Object.entries(v as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
  });
}

/**
 * Validates a registration and derives its entry: a bad spec, zone, task or
 * option throws a ValidationError naming it.
 * @internal shared by Scheduler and PeriodicTaskManager
 */
export function prepareEntry(location: string, cronspec: unknown, task: unknown, opts: unknown): Entry {
  const schedule = parseSchedule(cronspec, location);
  if (!(task instanceof Task)) throw new InvalidTaskTypeError('task', 'must be a Task (new Task(type, payload, options))');
  const overrides = validateOptions(opts);
  // Option combinations (processAt with processIn, a past deadline); and no dependencies: every
  // tick would wait for the same tasks, which completed long ago or never will again.
  if (toRecord(task, overrides).dependsOn.length > 0) throw new InvalidOptionError('dependsOn', 'cannot be set on a periodic task');
  const merged: EnqueueOptions = { ...task.options, ...overrides, headers: { ...task.headers, ...overrides.headers } };
  if (Object.keys(merged.headers ?? {}).length === 0) delete merged.headers;
  const payload =
    task.encoded.bytes !== null
      ? { bytes: task.encoded.bytes.toString('base64') }
      : { json: task.encoded.json === null ? null : (JSON.parse(task.encoded.json) as unknown) };
  const spec = schedule.spec.trim().replace(/\s+/g, ' ');
  // v1: bump if the derivation changes (ids then change once, for every scheduler at once).
  const id = createHash('sha256')
    .update(canonical(['pgasynq.entry.v1', spec, schedule.zone, task.type, payload, merged]))
    .digest('hex')
    .slice(0, 32);
  return {
    id,
    schedule,
    task,
    overrides,
    row: { id, spec: schedule.spec, taskType: task.type, payload: task.encoded, options: JSON.stringify(merged), location: schedule.zone },
    cursor: null,
    nextDue: null,
  };
}
