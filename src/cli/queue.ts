/**
 * `pgasynq queue ls | inspect Q | history Q [--days N] | pause Q | unpause Q | rm Q [--force]`:
 * each a single Inspector call (queues, getQueueInfo, history, pauseQueue,
 * unpauseQueue, deleteQueue). With --json, the call's result; `{"ok":true}`
 * for pause, unpause and rm, which return nothing.
 */
import { Option } from '@commander-js/extra-typings';
import { colours, intInRange, jsonNote, OK, withInspector } from './common.js';
import type { CliContext } from './context.js';
import { duration, errorRate, fields, table, when } from './format.js';
import type { CliProgram } from './root.js';
import { stateBars } from './stats.js';

export function registerQueue(program: CliProgram, ctx: CliContext): void {
  const queue = program.command('queue').description('list, inspect, pause, unpause and remove queues');

  queue
    .command('ls')
    .alias('list')
    .description('list the queues')
    .addHelpText('after', jsonNote('Inspector.queues(): an array of names, sorted'))
    .action(async () => {
      const names = await withInspector(ctx, (i) => i.queues());
      ctx.emit(names, () => (names.length === 0 ? 'no queues yet: a queue exists once a task was enqueued to it' : names));
    });

  queue
    .command('inspect')
    .description('one queue: size, groups, latency, paused, tasks by state, processed/failed')
    .argument('<queue>', 'queue name')
    .addHelpText('after', jsonNote('Inspector.getQueueInfo(queue)'))
    .action(async (name) => {
      const q = await withInspector(ctx, (i) => i.getQueueInfo(name));
      ctx.emit(q, () => {
        const s = colours(ctx);
        return [
          ...fields([
            ['queue', s.bold(q.queue)],
            ['paused', q.paused ? s.yellow('yes') : 'no'],
            ['size', String(q.size)],
            ['groups', String(q.groups)],
            ['latency', duration(q.latency)],
            ['processed', `${q.processed} today (UTC), ${q.processedTotal} in all`],
            ['failed', `${q.failed} today (UTC), ${q.failedTotal} in all`],
            ['error rate', `${errorRate(q.failed, q.processed)} today`],
            ['as of', when(q.timestamp)],
          ]),
          '',
          ...stateBars(q, s),
        ];
      });
    });

  queue
    .command('history')
    .description('processed and failed per UTC day, today first')
    .argument('<queue>', 'queue name')
    .addOption(new Option('-x, --days <n>', 'how many days').argParser(intInRange(1, 3650)).default(7))
    .addHelpText('after', jsonNote('Inspector.history(queue, days): [{ queue, date, processed, failed }, ...]'))
    .action(async (name, opts) => {
      const days = await withInspector(ctx, (i) => i.history(name, opts.days));
      ctx.emit(days, () =>
        table(
          ['date (UTC)', 'processed', 'failed', 'error rate'],
          days.map((d) => [d.date.toISOString().slice(0, 10), String(d.processed), String(d.failed), errorRate(d.failed, d.processed)]),
          { right: [1, 2, 3] },
        ),
      );
    });

  queue
    .command('pause')
    .description('stop servers from taking tasks of the queue (enqueueing goes on)')
    .argument('<queue>', 'queue name')
    .addHelpText('after', jsonNote('{"ok":true}. A queue already paused is an error (exit 1)'))
    .action(async (name) => {
      await withInspector(ctx, (i) => i.pauseQueue(name));
      ctx.emit(OK, () => `queue "${name}" paused`);
    });

  queue
    .command('unpause')
    .alias('resume')
    .description('let servers take tasks of the queue again')
    .argument('<queue>', 'queue name')
    .addHelpText('after', jsonNote('{"ok":true}. A queue that is not paused is an error (exit 1)'))
    .action(async (name) => {
      await withInspector(ctx, (i) => i.unpauseQueue(name));
      ctx.emit(OK, () => `queue "${name}" unpaused`);
    });

  queue
    .command('rm')
    .aliases(['remove', 'delete'])
    .description('remove a queue and its daily stats; it must be empty unless --force')
    .argument('<queue>', 'queue name')
    .option('-f, --force', 'also delete its tasks (refused while one is active)')
    .addHelpText('after', jsonNote('{"ok":true}. A non-empty queue without --force, or one with active tasks, is an error (exit 1)'))
    .action(async (name, opts) => {
      await withInspector(ctx, (i) => i.deleteQueue(name, opts.force === true));
      ctx.emit(OK, () => `queue "${name}" removed`);
    });
}
