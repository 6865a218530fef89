/**
 * Following one task from the terminal: `pgasynq task logs QUEUE ID [--tail N]
 * [--follow]` (Inspector.getTaskLogs) and `task wait QUEUE ID [--timeout D]`
 * (Client.waitFor). Registered on the `task` command by task.ts.
 *
 * `logs --follow` reads the log once a second, and prints the lines it had
 * not read yet, until the task has finished or SIGINT/SIGTERM. It learns that
 * the task finished from a Client.waitFor() running beside it, not from
 * Inspector.watch(): no event announces a log line (lines ride on the lease's
 * writes, a heartbeat's among them), so the log has to be polled anyway;
 * watch() would have every server of the queue send events of all its tasks
 * while it is registered, where waitFor() listens on the channel that
 * already announces finished tasks (and reads the state every 2 s behind
 * it). And waitFor() marks the task awaited, so that a task completed
 * without retention is kept (60 s) and the lines its last write carried can
 * still be read: the follow reads the log once more when the wait ends.
 */
import { Option, type Command } from '@commander-js/extra-typings';
import { QueueNotFoundError, TaskCanceledError, TaskFailedError, TaskNotFoundError } from '../model/errors.js';
import { MAX_LOG_LINES, type TaskLogLine } from '../model/following.js';
import { colours, durationArg, intInRange, jsonNote, withClient, withInspector } from './common.js';
import type { CliContext } from './context.js';
import type { CliProgram } from './root.js';
import { logText, taskView } from './task-view.js';

/** The `task` command, which these hang off. */
export type TaskCommand = Command<[], Record<never, never>, ReturnType<CliProgram['opts']>>;

/** How often `logs --follow` reads the log: not faster than once a second. */
const POLL_MS = 1000;

/** What ends a wait because the task has finished one way or another: the follow ends there too. */
const FINISHED = [TaskFailedError, TaskCanceledError, TaskNotFoundError, QueueNotFoundError];

const sameLine = (a: TaskLogLine, b: TaskLogLine) => a.attempt === b.attempt && a.at.getTime() === b.at.getTime() && a.message === b.message;

/**
 * The lines of `cur` that `seen`, an earlier read of the same log, did not
 * have. A log only grows at its end and loses lines at its start (past
 * MAX_LOG_LINES or MAX_LOG_BYTES), so the new lines follow the longest end
 * of `seen` that `cur` starts with. When none (more lines came than a log
 * keeps), every line of `cur` is new.
 */
export function newLines(seen: readonly TaskLogLine[], cur: readonly TaskLogLine[]): TaskLogLine[] {
  for (let k = Math.min(seen.length, cur.length); k > 0; k--) {
    const from = seen.length - k;
    let i = 0;
    while (i < k && sameLine(seen[from + i]!, cur[i]!)) i++;
    if (i === k) return cur.slice(k);
  }
  return [...cur];
}

/** Resolves after `ms`, or at once when `signal` aborts. */
function pause(ms: number, signal: AbortSignal): Promise<undefined> {
  return new Promise((resolve) => {
    const done = (): void => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve(undefined);
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}

/** `task logs --follow`: see the file's comment. An unknown task or queue rejects at the first read (exit 1). */
async function follow(ctx: CliContext, queue: string, id: string, tail: number | undefined): Promise<void> {
  const conn = ctx.connection();
  const [{ Inspector }, { Client }] = await Promise.all([import('../inspector.js'), import('../client.js')]);
  const inspector = new Inspector(conn);
  const client = new Client(conn);
  const stop = new AbortController();
  const onSignal = (): void => stop.abort();
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  // With --json, one JSON object per line (emit prints each value on a line of its own).
  const print = (lines: readonly TaskLogLine[]) => {
    for (const line of lines) ctx.emit(line, () => logText(line));
  };
  try {
    let seen = await inspector.getTaskLogs(queue, id);
    print(tail === undefined ? seen : seen.slice(-tail));
    let ended = false;
    // Resolves when the task has finished (or the follow was stopped) with undefined, or with the error that ended the wait otherwise.
    const end = client.waitFor(queue, id, { signal: stop.signal }).then(
      () => ((ended = true), undefined),
      (err: unknown) => ((ended = true), stop.signal.aborted || FINISHED.some((E) => err instanceof E) ? undefined : { err }),
    );
    while (!stop.signal.aborted) {
      const failure = await Promise.race([end, pause(POLL_MS, stop.signal)]);
      if (failure !== undefined) throw failure.err;
      if (stop.signal.aborted) break;
      // Whether the wait had ended before this read: only then does the read hold the lines the
      // task's last write carried. A wait that ends during the read takes one more.
      const last = ended;
      let cur: TaskLogLine[];
      try {
        cur = await inspector.getTaskLogs(queue, id);
      } catch (err) {
        // Deleted meanwhile (or its queue): it has finished.
        if (err instanceof TaskNotFoundError || err instanceof QueueNotFoundError) break;
        throw err;
      }
      print(newLines(seen, cur));
      seen = cur;
      if (last) break;
    }
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    stop.abort();
    await Promise.all([client.close().catch(() => {}), inspector.close().catch(() => {})]);
  }
}

const LOGS_HELP = `
Each line as: TIME  attempt N  MESSAGE (TIME in UTC, on the database's clock;
the attempt that logged it). A task keeps its last ${MAX_LOG_LINES} lines (64 KiB); a line
reaches the database with the handler's next write (ctx.progress(), the
lease's renewal, the end of the run). Control characters in a message are
shown as \\u escapes, one line each.

--follow prints the lines there are (the last N with --tail), then the new
ones, read once a second, until the task has finished: completed, archived
(failed or canceled) or deleted; or until Ctrl-C. Either way it exits 0. It
waits as Client.waitFor() does, which keeps a task completed without
retention for 60 s, so that its last lines are printed too.
${jsonNote('the lines as Inspector.getTaskLogs(queue, id, { tail }) returns them: one JSON array of {attempt, at, message}; with --follow, one such object per line of output, as each line is read')}`;

const WAIT_HELP = `
Exit codes: 0 when the task completed (it prints the task as task inspect
does), 1 when it failed (archived: its last error is printed), was canceled,
or there is no such task or queue, 3 when --timeout passed first. Ctrl-C stops
waiting; the task goes on. Waiting marks the task awaited: once completed it
is kept for at least 60 s (its retention if longer), so its result can be read.
${jsonNote('the TaskInfo Client.waitFor(queue, id, { timeout }) resolves with, once the task completed')}`;

/** Registers `task logs` and `task wait` on the `task` command. */
export function registerTaskFollow(task: TaskCommand, ctx: CliContext): void {
  task
    .command('logs')
    .description("a task's log lines (what its handler passed to ctx.log()), oldest first; --follow prints new ones until it finishes")
    .argument('<queue>', 'queue name')
    .argument('<id>', 'task id')
    .addOption(new Option('--tail <n>', `only the last N lines (a task keeps at most ${MAX_LOG_LINES})`).argParser(intInRange(1, MAX_LOG_LINES)))
    .option('-f, --follow', 'then print new lines as they come, until the task has finished (completed, archived, deleted) or Ctrl-C')
    .addHelpText('after', LOGS_HELP)
    .action(async (queue, id, opts) => {
      if (opts.follow) return follow(ctx, queue, id, opts.tail);
      const lines = await withInspector(ctx, (i) => i.getTaskLogs(queue, id, opts.tail === undefined ? {} : { tail: opts.tail }));
      ctx.emit(lines, () => (lines.length === 0 ? `no log lines for task ${id} in queue "${queue}"` : lines.map(logText)));
    });

  task
    .command('wait')
    .description('wait until a task finishes: exit 0 when it completed, 1 when it failed or was canceled, 3 after --timeout')
    .argument('<queue>', 'queue name')
    .argument('<id>', 'task id')
    .addOption(
      new Option('--timeout <duration>', 'give up after this long: 30s, 500ms, 2m, 1m30s (units h, m, s, ms; default: no limit)').argParser(durationArg),
    )
    .addHelpText('after', WAIT_HELP)
    .action(async (queue, id, opts) => {
      const info = await withClient(ctx, async (c) => {
        try {
          return await c.waitFor(queue, id, opts.timeout === undefined ? {} : { timeout: opts.timeout });
        } catch (err) {
          if (err instanceof TaskCanceledError) throw new Error(`task ${queue}/${id} was canceled`, { cause: err });
          throw err;
        }
      });
      if (ctx.globals.json) return ctx.emit(info, () => []);
      // As task inspect prints it; the task is kept 60 s after the wait, long enough to read its attempts.
      const attempts = await withInspector(ctx, (i) => i.listAttempts(queue, id)).catch((err: unknown) => {
        if (err instanceof TaskNotFoundError) return [];
        throw err;
      });
      ctx.emit(info, () => taskView(info, attempts, colours(ctx)));
    });
}
