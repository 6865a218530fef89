/**
 * `pgasynq cron ls | history ENTRY_ID [--page N --size N]`: the cron entries
 * of the live schedulers (Inspector.schedulerEntries) and the tasks an entry
 * enqueued, newest first (Inspector.listSchedulerEnqueueEvents). With --json,
 * those arrays.
 */
import { Option } from '@commander-js/extra-typings';
import { intInRange, jsonNote, withInspector } from './common.js';
import type { CliContext } from './context.js';
import { instant, jsonText, relative, table } from './format.js';
import type { CliProgram } from './root.js';

export function registerCron(program: CliProgram, ctx: CliContext): void {
  const cron = program.command('cron').description('cron entries of the running schedulers and what they enqueued');

  cron
    .command('ls')
    .alias('list')
    .description('list the cron entries of the live schedulers')
    .addHelpText('after', jsonNote('Inspector.schedulerEntries(): [{ id, spec, task, options, next, prev }, ...]'))
    .action(async () => {
      const entries = await withInspector(ctx, (i) => i.schedulerEntries());
      ctx.emit(entries, () => {
        if (entries.length === 0) return 'no cron entries: no scheduler is running';
        const now = Date.now();
        return table(
          ['entry id', 'spec', 'type', 'payload', 'options', 'next', 'prev'],
          entries.map((e) => [
            e.id,
            e.spec,
            e.task.type,
            jsonText(e.task.payload, 40),
            Object.keys(e.options).length === 0 ? '-' : jsonText(e.options, 50),
            relative(e.next, now),
            relative(e.prev, now),
          ]),
        );
      });
    });

  cron
    .command('history')
    .description('the tasks a cron entry enqueued, newest first')
    .argument('<entry-id>', 'entry id, as `cron ls` shows it')
    .addOption(new Option('--page <n>', 'page number, from 1').argParser(intInRange(1, 1_000_000_000)).default(1))
    .addOption(new Option('--size <n>', 'events per page').argParser(intInRange(1, 1000)).default(30))
    .addHelpText('after', jsonNote('Inspector.listSchedulerEnqueueEvents(entryId, { page, pageSize }): [{ taskId, enqueuedAt, tickAt }, ...]'))
    .action(async (entryId, opts) => {
      const events = await withInspector(ctx, (i) => i.listSchedulerEnqueueEvents(entryId, { page: opts.page, pageSize: opts.size }));
      ctx.emit(events, () => {
        if (events.length === 0) return opts.page === 1 ? `no tasks enqueued by entry ${entryId}` : `no tasks on page ${opts.page} for entry ${entryId}`;
        const now = Date.now();
        return table(
          ['task id', 'tick', 'enqueued at', 'enqueued'],
          events.map((e) => [e.taskId, instant(e.tickAt), instant(e.enqueuedAt), relative(e.enqueuedAt, now)]),
        );
      });
    });
}
