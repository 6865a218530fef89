/**
 * POST /action: what the dashboard's buttons do, each through one Inspector
 * call (or one per task of a selection). The form says what with `do`:
 *
 *   pause | resume | delete-queue                    (with `queue`)
 *   <op>:one:<task id> | <op>:selected | <op>:all     (with `queue`, `state`, `group`; `id` per selected task)
 *
 * where <op> is run, archive, delete or cancel, and must be one the state
 * allows (pages.ts ALLOWED, asynqmon's set). Everything that deletes, moves
 * many tasks or stops work asks for confirmation first: app.js asks with
 * confirm() and adds `confirmed=1`; without it the server answers with a
 * confirmation page instead of acting. The caller (server.ts) has already
 * checked read-only mode, the Origin and the CSRF token.
 */
import { FailedPreconditionError, isQueueNotFound, isTaskNotFound, isValidationError, QueueNotEmptyError } from '../model/errors.js';
import type { Inspector } from '../inspector.js';
import { actOnAll, listTaskPreviews, MAX_PREVIEW_PAGE_SIZE } from '../inspector-internal.js';
import { BULK_STATES } from '../model/task-actions.js';
import type { TaskState } from '../model/task.js';
import { num } from './format.js';
import { ALLOWED, TAB_STATES, type TaskOp } from './pages.js';

/** The fields of an urlencoded form: every value of every name. */
export type FormFields = Record<string, string[]>;

export type Action =
  | { kind: 'queue'; op: 'pause' | 'resume' | 'delete-queue'; queue: string }
  | { kind: 'task'; op: TaskOp; scope: 'one' | 'selected' | 'all'; queue: string; state: TaskState; group: string | undefined; ids: string[] };

export interface ActionOutcome {
  ok: boolean;
  message: string;
}

/** A request the form cannot express (400). */
export class BadActionError extends Error {
  override readonly name = 'BadActionError';
}

/** At most this many tasks are acted on one by one in one request. */
export const MAX_SELECTED = 1000;
/** Cancel all: at most this many active tasks are listed and cancelled in one request. */
const MAX_CANCEL_ALL = 10_000;

const first = (f: FormFields, k: string): string | undefined => f[k]?.[0];

/** Reads the action out of a form; a malformed one is a BadActionError. */
export function parseAction(f: FormFields): Action {
  const what = first(f, 'do') ?? '';
  const queue = first(f, 'queue');
  if (queue === undefined || queue === '') throw new BadActionError('no queue given');
  if (what === 'pause' || what === 'resume' || what === 'delete-queue') return { kind: 'queue', op: what, queue };
  const m = /^(run|archive|delete|cancel):(one|selected|all)(?::(.+))?$/s.exec(what);
  if (!m) throw new BadActionError(`unknown action ${JSON.stringify(what.slice(0, 50))}`);
  const op = m[1] as TaskOp;
  const scope = m[2] as 'one' | 'selected' | 'all';
  const state = first(f, 'state') as TaskState | undefined;
  if (state === undefined || !TAB_STATES.includes(state)) throw new BadActionError('no valid task state given');
  if (!ALLOWED[state].includes(op)) throw new BadActionError(`${op} is not an action for ${state} tasks`);
  const group = first(f, 'group') || undefined;
  if (state === 'aggregating' && scope === 'all' && group === undefined) throw new BadActionError('no group given');
  let ids: string[] = [];
  if (scope === 'one') {
    if (m[3] === undefined || m[3] === '') throw new BadActionError('no task id given');
    ids = [m[3]];
  } else if (scope === 'selected') {
    ids = [...new Set(f.id ?? [])];
    if (ids.length > MAX_SELECTED) throw new BadActionError(`at most ${MAX_SELECTED} tasks may be selected at once`);
  }
  return { kind: 'task', op, scope, queue, state, group, ids };
}

/** The question to ask before the action, or undefined when it needs none (run one or a selection, resume). */
export function confirmationFor(a: Action): string | undefined {
  if (a.kind === 'queue') {
    if (a.op === 'pause') return `Pause queue ${a.queue}? Servers stop taking its tasks until you resume it.`;
    if (a.op === 'delete-queue') return `Delete the empty queue ${a.queue}?`;
    return undefined;
  }
  if (a.op === 'run' && a.scope !== 'all') return undefined;
  const verb = { run: 'Run', archive: 'Archive', delete: 'Delete for good', cancel: 'Cancel' }[a.op];
  const what =
    a.scope === 'one'
      ? `task ${a.ids[0] ?? ''}`
      : a.scope === 'selected'
        ? `${a.ids.length} selected task(s)`
        : `all ${a.state} tasks of ${a.state === 'aggregating' ? `group ${a.group ?? ''} in ` : ''}queue ${a.queue}`;
  return `${verb} ${what}?`;
}

/** A refusal the user should read (not a server fault). */
function refusal(err: unknown): string | undefined {
  if (err instanceof FailedPreconditionError || err instanceof QueueNotEmptyError || isQueueNotFound(err) || isTaskNotFound(err) || isValidationError(err)) {
    return (err as Error).message;
  }
  return undefined;
}

const PAST: Record<TaskOp, string> = { run: 'Ran', archive: 'Archived', delete: 'Deleted', cancel: 'Asked to cancel' };

async function one(inspector: Inspector, op: TaskOp, queue: string, id: string): Promise<boolean> {
  switch (op) {
    case 'run':
      await inspector.runTask(queue, id);
      return true;
    case 'archive':
      await inspector.archiveTask(queue, id);
      return true;
    case 'delete':
      await inspector.deleteTask(queue, id);
      return true;
    case 'cancel':
      return (await inspector.cancelProcessing(id)) > 0;
  }
}

async function all(inspector: Inspector, op: TaskOp, queue: string, state: TaskState, group: string | undefined): Promise<number> {
  if (op === 'cancel') {
    // asynqmon's cancel_all: list the active tasks, then cancel each (a cancelled task stays active until its server hears).
    // Ids only: previews with nothing of the payloads (hide), not whole rows.
    const ids: string[] = [];
    for (let page = 1; ids.length < MAX_CANCEL_ALL; page++) {
      const tasks = await listTaskPreviews(inspector, queue, 'active', { page, pageSize: MAX_PREVIEW_PAGE_SIZE, hide: true });
      ids.push(...tasks.map((t) => t.id));
      if (tasks.length < MAX_PREVIEW_PAGE_SIZE) break;
    }
    let n = 0;
    for (const id of ids) n += (await inspector.cancelProcessing(id)) > 0 ? 1 : 0;
    return n;
  }
  if (!BULK_STATES[op].includes(state)) throw new BadActionError(`${op} all is not an action for ${state} tasks`);
  return actOnAll(inspector, op, queue, state, group ?? '');
}

/** Runs the action; refusals (a state that forbids it, a task gone) are outcomes, database faults are thrown. */
export async function runAction(inspector: Inspector, a: Action): Promise<ActionOutcome> {
  try {
    if (a.kind === 'queue') {
      if (a.op === 'pause') await inspector.pauseQueue(a.queue);
      else if (a.op === 'resume') await inspector.unpauseQueue(a.queue);
      else await inspector.deleteQueue(a.queue, false);
      return {
        ok: true,
        message: a.op === 'pause' ? `Paused queue ${a.queue}.` : a.op === 'resume' ? `Resumed queue ${a.queue}.` : `Deleted queue ${a.queue}.`,
      };
    }
    if (a.scope === 'all') {
      const n = await all(inspector, a.op, a.queue, a.state, a.group);
      return {
        ok: true,
        message: `${PAST[a.op]} ${num(n)} ${a.state} task(s) of ${a.state === 'aggregating' ? `group ${a.group ?? ''} in ` : ''}queue ${a.queue}.`,
      };
    }
    if (a.ids.length === 0) return { ok: false, message: 'No task selected.' };
    let done = 0;
    const refused: string[] = [];
    for (const id of a.ids) {
      try {
        if (await one(inspector, a.op, a.queue, id)) done++;
        else refused.push(`task ${id} is not running`);
      } catch (err) {
        const why = refusal(err);
        if (why === undefined) throw err;
        refused.push(why);
      }
    }
    const head = a.scope === 'one' && done === 1 ? `${PAST[a.op]} task ${a.ids[0] ?? ''}.` : `${PAST[a.op]} ${num(done)} task(s).`;
    if (refused.length === 0) return { ok: true, message: head };
    const more = refused.length > 3 ? ` (and ${refused.length - 3} more)` : '';
    return { ok: done > 0, message: `${done > 0 ? `${head} ` : ''}Refused: ${refused.slice(0, 3).join('; ')}${more}.` };
  } catch (err) {
    const why = refusal(err);
    if (why === undefined) throw err;
    return { ok: false, message: why };
  }
}
