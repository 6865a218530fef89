/**
 * `pgasynq task ls | inspect | cancel | delete | archive | run | deleteall | archiveall | runall`
 * (and `task logs | wait`, in task-follow.ts):
 * each a single Inspector call, but for two that take less than the call
 * needs: `task ls` without --state (a page of every state, with the queue's
 * counts) and `task inspect ID` without a queue (first the queues holding
 * that id). With --json: the call's result (`task ls` without --state: an
 * object of the pages keyed by state); `{"ok":true}` for delete, archive and
 * run (void); `{"count":N}` for cancel and the bulk actions (which resolve to
 * a count).
 *
 * The bulk actions take the states asynq's CLI takes, no others:
 *   deleteall   pending, scheduled, retry, archived, completed, aggregating
 *   archiveall  pending, scheduled, retry, aggregating
 *   runall      scheduled, retry, archived, aggregating
 * and waiting (which asynq does not have) for all three; aggregating needs
 * --group, as `task ls --state aggregating` does.
 */
import { Option } from '@commander-js/extra-typings';
import type { Inspector } from '../inspector.js';
import { actOnAll, listTasks, listTasksByState, queuesWithTask } from '../inspector-internal.js';
import { BULK_STATES, type TaskAction } from '../model/task-actions.js';
import type { TaskInfo, TaskState } from '../model/task.js';
import { colours, intInRange, jsonNote, OK, parseState, STATES, withInspector } from './common.js';
import { UsageError, type CliContext } from './context.js';
import { jsonText, relative, table, truncate } from './format.js';
import type { CliProgram } from './root.js';
import { registerTaskFollow } from './task-follow.js';
import { inspectJson, refs, taskView } from './task-view.js';

type Bulk = 'deleteall' | 'archiveall' | 'runall';

/** The Inspector's bulk action behind each command; the states each takes are the Inspector's (BULK_STATES). */
const ACTION: Record<Bulk, TaskAction> = { deleteall: 'delete', archiveall: 'archive', runall: 'run' };

const BULK_WORDS: Record<Bulk, { verb: string; done: (n: number, state: string, queue: string) => string }> = {
  deleteall: { verb: 'delete', done: (n, st, q) => `deleted ${n} ${st} task${n === 1 ? '' : 's'} from queue "${q}"` },
  archiveall: { verb: 'archive', done: (n, st, q) => `archived ${n} ${st} task${n === 1 ? '' : 's'} of queue "${q}"` },
  runall: { verb: 'run', done: (n, st, q) => `${n} ${st} task${n === 1 ? '' : 's'} of queue "${q}" ${n === 1 ? 'is' : 'are'} now pending` },
};

const retried = (t: TaskInfo) => `${t.retried}/${t.maxRetry}`;

/** The columns asynq's `task ls` shows for each state, plus a few of ours. */
function taskTable(state: TaskState, tasks: TaskInfo[], now: number): string[] {
  const base = (t: TaskInfo) => [t.id, t.type, jsonText(t.payload, 40)];
  const head = ['id', 'type', 'payload'];
  const err = (t: TaskInfo) => (t.lastError === null ? '-' : truncate(t.lastError, 50));
  switch (state) {
    case 'pending':
      // In the claim's order: higher priority first. The column only when a task on the page has one.
      if (tasks.some((t) => t.priority !== 0)) {
        return table(
          [...head, 'priority', 'retried'],
          tasks.map((t) => [...base(t), String(t.priority), retried(t)]),
          { right: [3] },
        );
      }
      return table(
        [...head, 'retried'],
        tasks.map((t) => [...base(t), retried(t)]),
      );
    case 'active':
      return table(
        [...head, 'retried', 'deadline', 'orphaned'],
        tasks.map((t) => [...base(t), retried(t), relative(t.deadline, now), t.isOrphaned ? 'yes' : 'no']),
      );
    case 'scheduled':
      return table(
        [...head, 'process in', 'retried'],
        tasks.map((t) => [...base(t), relative(t.nextProcessAt, now), retried(t)]),
      );
    case 'retry':
      return table(
        [...head, 'next retry', 'retried', 'last failed', 'last error'],
        tasks.map((t) => [...base(t), relative(t.nextProcessAt, now), retried(t), relative(t.lastFailedAt, now), err(t)]),
      );
    case 'archived':
      return table(
        [...head, 'retried', 'last failed', 'last error'],
        tasks.map((t) => [...base(t), retried(t), relative(t.lastFailedAt, now), err(t)]),
      );
    case 'completed':
      return table(
        [...head, 'completed', 'result'],
        tasks.map((t) => [...base(t), relative(t.completedAt, now), jsonText(t.result, 40)]),
      );
    case 'aggregating':
      return table(
        [...head, 'group'],
        tasks.map((t) => [...base(t), t.group ?? '-']),
      );
    case 'waiting':
      return table(
        [...head, 'waiting for', 'depends on'],
        tasks.map((t) => [...base(t), `${t.waitingFor} of ${t.dependsOn.length}`, truncate(refs(t), 50)]),
      );
  }
}

/**
 * `task ls` without --state: a heading with the state's count, then that
 * state's page as `task ls --state` shows it, for each state that has tasks
 * (in the order stats lists them); the empty states on one line at the end.
 */
function everyState(
  ctx: CliContext,
  queue: string,
  counts: Record<TaskState, number>,
  byState: { state: TaskState; tasks: TaskInfo[] }[],
  opts: { page: number; size: number; group?: string | undefined },
): string[] {
  const s = colours(ctx);
  const now = Date.now();
  const lines: string[] = [];
  const empty: string[] = [];
  for (const { state, tasks } of byState) {
    // At least what the page shows, should a task have arrived between the two reads.
    const count = Math.max(counts[state], tasks.length === 0 ? 0 : (opts.page - 1) * opts.size + tasks.length);
    const label = state === 'aggregating' && opts.group !== undefined ? `${state} (group "${opts.group}")` : state;
    if (count === 0) {
      empty.push(label);
      continue;
    }
    if (lines.length > 0) lines.push('');
    lines.push(s.bold(`${label}: ${count} task${count === 1 ? '' : 's'}`));
    const pages = Math.ceil(count / opts.size);
    if (tasks.length === 0) {
      lines.push(s.dim(`(nothing on page ${opts.page}: ${pages} page${pages === 1 ? '' : 's'} at --size ${opts.size})`));
      continue;
    }
    lines.push(...taskTable(state, tasks, now));
    if (opts.page < pages) lines.push(s.dim(`(page ${opts.page} of ${pages}: --page ${opts.page + 1} for more, or --state ${state} for this state alone)`));
  }
  if (lines.length === 0) return [`no tasks in queue "${queue}"`];
  if (empty.length > 0) lines.push('', s.dim(`no ${empty.join(', ')} tasks`));
  return lines;
}

const GROUP_HELP = 'group of the aggregating tasks (required with the state aggregating)';

function needGroup(state: TaskState, group: string | undefined): string {
  if (state !== 'aggregating') return '';
  if (group === undefined) throw new UsageError('the state aggregating needs --group <group>');
  return group;
}

export function registerTask(program: CliProgram, ctx: CliContext): void {
  const task = program.command('task').description('list, inspect, cancel, delete, archive and run tasks, one or all of a state');

  task
    .command('ls')
    .alias('list')
    .description('list the tasks of a queue, a page at a time: in one state, or in every state (grouped by state)')
    .requiredOption('-q, --queue <queue>', 'queue name')
    .addOption(new Option('-s, --state <state>', 'task state (default: every state, a page of each)').choices(STATES))
    .addOption(new Option('--page <n>', 'page number, from 1 (of each state)').argParser(intInRange(1, 1_000_000_000)).default(1))
    .addOption(new Option('--size <n>', 'tasks per page (of each state)').argParser(intInRange(1, 1000)).default(30))
    .option('-g, --group <group>', GROUP_HELP)
    .addHelpText(
      'after',
      jsonNote(
        'what Inspector.list<State>Tasks(queue, { page, pageSize }) returns (listAggregatingTasks(queue, group, ...) for aggregating): an array of TaskInfo. ' +
          'Without --state: an object keyed by state, in the order stats lists them, each holding that page of the state as an array of TaskInfo ' +
          '(aggregating: of every group, or of --group)',
      ),
    )
    .action(async (opts) => {
      const state = opts.state;
      const page = { page: opts.page, pageSize: opts.size };
      if (state === undefined) {
        const { counts, byState } = await withInspector(ctx, async (i) => {
          // The counts and the pages are separate reads: a task that moves in between may show in one only.
          const [info, byState, groups] = await Promise.all([
            i.getQueueInfo(opts.queue),
            listTasksByState(i, opts.queue, STATES, page, opts.group),
            opts.group === undefined ? undefined : i.groups(opts.queue),
          ]);
          const counts = Object.fromEntries(STATES.map((st) => [st, info[st]])) as Record<TaskState, number>;
          if (groups) counts.aggregating = groups.find((g) => g.group === opts.group)?.size ?? 0;
          return { counts, byState };
        });
        ctx.emit(Object.fromEntries(byState.map((s) => [s.state, s.tasks])), () => everyState(ctx, opts.queue, counts, byState, opts));
        return;
      }
      const group = needGroup(state, opts.group);
      const tasks = await withInspector(ctx, (i) => listTasks(i, opts.queue, state, page, group));
      ctx.emit(tasks, () => {
        const where = `${state === 'aggregating' ? `group "${group}" of ` : ''}queue "${opts.queue}"`;
        if (tasks.length === 0) return opts.page === 1 ? `no ${state} tasks in ${where}` : `no ${state} tasks on page ${opts.page} of ${where}`;
        const lines = taskTable(state, tasks, Date.now());
        if (tasks.length === opts.size) lines.push(colours(ctx).dim(`(page ${opts.page}; there may be more: --page ${opts.page + 1})`));
        return lines;
      });
    });

  task
    .command('inspect')
    .description('one task, every field; with the id alone, the task with that id in whichever queue holds it')
    .usage('[options] [queue] <id>')
    .argument('<queue-or-id>', 'queue name, or the task id when it is the only argument')
    .argument('[id]', 'task id')
    .addHelpText(
      'after',
      '\nTask ids are unique per queue: when several queues hold the id, name the queue (task inspect QUEUE ID).\n' +
        '\nIts progress is the last value its handler gave ctx.progress(): a percentage (40%) or a JSON object.\n' +
        'Then its attempts, one row per run, oldest first: the attempt number (a snoozed run and the run\n' +
        'after it share one), the server that ran it, when it started and ended ("running" while it runs),\n' +
        'how it ended (completed, failed, snoozed, canceled, timeout, lost, shutdown) and its error.\n' +
        jsonNote('Inspector.getTaskInfo(queue, id), a TaskInfo, with one key more: "attempts", what Inspector.listAttempts(queue, id) returns'),
    )
    .action(async (first, second) => {
      const [info, attempts] = await withInspector(ctx, async (i) => {
        let queue = first;
        let id = second;
        if (id === undefined) {
          id = first;
          const queues = await queuesWithTask(i, id);
          const [only, ...others] = queues;
          if (only === undefined) throw new Error(`cannot find task with id=${id} in any queue`);
          if (others.length > 0) {
            throw new Error(`${queues.length} queues hold a task with id=${id} (${queues.join(', ')}): say which, with: pgasynq task inspect QUEUE ${id}`);
          }
          queue = only;
        }
        // Two reads: a run that ends in between shows as running in the attempts.
        return Promise.all([i.getTaskInfo(queue, id), i.listAttempts(queue, id)]);
      });
      ctx.emit(inspectJson(info, attempts), () => taskView(info, attempts, colours(ctx)));
    });

  registerTaskFollow(task, ctx);

  task
    .command('cancel')
    .description('cancel the running (active) task with this id, in any queue; it goes to retry')
    .argument('<id>', 'task id')
    .addHelpText('after', jsonNote('{"count":N}: how many active tasks were marked (Inspector.cancelProcessing(id)); 0 is not an error'))
    .action(async (id) => {
      const count = await withInspector(ctx, (i) => i.cancelProcessing(id));
      ctx.emit({ count }, () => (count === 0 ? `task ${id} is not running: nothing to cancel` : `cancellation requested for task ${id}`));
    });

  const single = [
    ['delete', ['remove', 'rm'], 'delete a task in any state but active', (i: Inspector, q: string, id: string) => i.deleteTask(q, id), 'deleted'],
    [
      'archive',
      [],
      'archive a pending, scheduled, retry, completed or aggregating task',
      (i: Inspector, q: string, id: string) => i.archiveTask(q, id),
      'archived',
    ],
    [
      'run',
      [],
      'make a scheduled, retry, archived, completed or aggregating task pending now',
      (i: Inspector, q: string, id: string) => i.runTask(q, id),
      'now pending',
    ],
  ] as const;
  for (const [name, aliases, description, call, done] of single) {
    task
      .command(name)
      .aliases(aliases)
      .description(description)
      .argument('<queue>', 'queue name')
      .argument('<id>', 'task id')
      .addHelpText('after', jsonNote('{"ok":true}. A task whose state forbids it (e.g. an active one) is an error (exit 1)'))
      .action(async (queue, id) => {
        await withInspector(ctx, (i) => call(i, queue, id));
        ctx.emit(OK, () => `task ${id} in queue "${queue}": ${done}`);
      });
  }

  for (const bulk of ['deleteall', 'archiveall', 'runall'] as const) {
    const allowed = STATES.filter((s) => BULK_STATES[ACTION[bulk]].includes(s));
    task
      .command(bulk)
      .description(`${BULK_WORDS[bulk].verb} every task of a queue in one state (${allowed.join(', ')})`)
      .argument('<queue>', 'queue name')
      .argument('<state>', `task state: ${allowed.join(', ')}`)
      .option('-g, --group <group>', GROUP_HELP)
      .addHelpText('after', jsonNote('{"count":N}: how many tasks the Inspector call moved or deleted'))
      .action(async (queue, stateArg, opts) => {
        const state = parseState(stateArg);
        if (!allowed.includes(state)) {
          throw new UsageError(`${bulk} does not apply to ${state} tasks (asynq has no such bulk action); ${bulk} takes ${allowed.join(', ')}`);
        }
        const group = needGroup(state, opts.group);
        const count = await withInspector(ctx, (i) => actOnAll(i, ACTION[bulk], queue, state, group));
        ctx.emit({ count }, () => BULK_WORDS[bulk].done(count, state, queue) + (state === 'aggregating' ? ` (group "${group}")` : ''));
      });
  }
}
