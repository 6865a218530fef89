/**
 * `pgasynq stats`: every queue at a glance, as `asynq stats` shows it: task
 * counts by state with a bar each, a row per queue (state counts, size,
 * latency, processed/failed today, paused), and today's totals.
 * `--json`: an array of Inspector.getQueueInfo() results, one per queue.
 */
import type { QueueInfo } from '../model/inspector-types.js';
import { isQueueNotFound } from '../model/errors.js';
import { colours, jsonNote, STATES, withInspector } from './common.js';
import type { CliContext } from './context.js';
import { bar, day, duration, errorRate, table, type Style } from './format.js';
import type { CliProgram } from './root.js';

/** Counts by state with a bar each, the bars scaled to the largest count. */
export function stateBars(counts: Record<(typeof STATES)[number], number>, s: Style): string[] {
  const max = Math.max(0, ...STATES.map((st) => counts[st]));
  const colour: Partial<Record<(typeof STATES)[number], (x: string) => string>> = {
    active: (x) => s.green(x),
    pending: (x) => s.cyan(x),
    retry: (x) => s.yellow(x),
    archived: (x) => s.red(x),
  };
  return table(
    ['state', 'tasks', ''],
    STATES.map((st) => [st, String(counts[st]), (colour[st] ?? s.dim)(bar(counts[st], max, 40))]),
    { right: [1] },
  );
}

function render(infos: QueueInfo[], s: Style): string[] {
  if (infos.length === 0) return ['no queues yet: a queue exists once a task was enqueued to it'];
  const totals = Object.fromEntries(STATES.map((st) => [st, infos.reduce((n, q) => n + q[st], 0)])) as Record<(typeof STATES)[number], number>;
  const processed = infos.reduce((n, q) => n + q.processed, 0);
  const failed = infos.reduce((n, q) => n + q.failed, 0);
  const today = day(infos[0]?.timestamp ?? new Date());
  const headers = ['queue', ...STATES, 'size', 'latency', 'processed', 'failed', 'paused'];
  const rows = infos.map((q) => [
    q.queue,
    ...STATES.map((st) => String(q[st])),
    String(q.size),
    duration(q.latency),
    String(q.processed),
    q.failed > 0 ? s.red(String(q.failed)) : '0',
    q.paused ? s.yellow('yes') : 'no',
  ]);
  const right = headers.map((_, i) => i).filter((i) => i > 0 && i < headers.length - 1);
  return [
    s.bold('Tasks by state (all queues)'),
    ...stateBars(totals, s),
    '',
    s.bold('Queues (processed and failed: today, UTC)'),
    ...table(headers, rows, { right }),
    '',
    s.bold(`Today (${today} UTC)`),
    ...table(['processed', 'failed', 'error rate'], [[String(processed), String(failed), errorRate(failed, processed)]], { right: [0, 1, 2] }),
  ];
}

export function registerStats(program: CliProgram, ctx: CliContext): void {
  program
    .command('stats')
    .description('all queues: tasks by state, size, latency, processed/failed today, paused')
    .addHelpText('after', jsonNote('an array with Inspector.getQueueInfo(queue) for every queue'))
    .action(async () => {
      const infos = await withInspector(ctx, async (inspector) => {
        const names = await inspector.queues();
        const all = await Promise.all(
          // A queue removed between the two calls is simply left out.
          names.map((q) => inspector.getQueueInfo(q).catch((err: unknown) => (isQueueNotFound(err) ? null : Promise.reject(err)))),
        );
        return all.filter((q): q is QueueInfo => q !== null);
      });
      ctx.emit(infos, () => render(infos, colours(ctx)));
    });
}
