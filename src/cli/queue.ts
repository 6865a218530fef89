/**
 * `pgasynq queue ls | inspect Q | history Q [--days N] | pause Q | unpause Q | rm Q [--force]
 * | limit Q [--concurrency N] [--key-concurrency N] [--rate N/DURATION] [--clear]
 * | create Q [--concurrency N] [--key-concurrency N] [--rate N/DURATION] [--paused]`:
 * each a single Inspector call (queues, getQueueInfo, history, pauseQueue,
 * unpauseQueue, deleteQueue, createQueue), except `limit`, which reads the
 * limits (createQueue, which makes a queue known) and writes them back
 * changed (setQueueLimits). With --json,
 * the call's result; `{"ok":true}` for pause, unpause and rm, which return
 * nothing; `{"ok":true,"limits":{...}}` for limit: the limits it set.
 */
import { InvalidArgumentError, Option } from '@commander-js/extra-typings';
import type { QueueLimits } from '../model/inspector-types.js';
import { formatDuration, parseDuration } from '../model/cron.js';
import { MAX_LIMIT } from '../model/validate.js';
import { colours, intInRange, jsonNote, OK, withInspector } from './common.js';
import { UsageError, type CliContext } from './context.js';
import { day, duration, errorRate, fields, table, when } from './format.js';
import type { CliProgram } from './root.js';
import { stateBars } from './stats.js';

const NO_LIMITS: QueueLimits = { concurrency: null, keyConcurrency: null, rateLimit: null };

/** "concurrency 5, per key 2, rate 100/1s", or "none". */
function limitsText(l: QueueLimits): string {
  const parts: string[] = [];
  if (l.concurrency !== null) parts.push(`concurrency ${l.concurrency}`);
  if (l.keyConcurrency !== null) parts.push(`per key ${l.keyConcurrency}`);
  if (l.rateLimit !== null) parts.push(`rate ${l.rateLimit.limit}/${formatDuration(l.rateLimit.interval)}`);
  return parts.length === 0 ? 'none' : parts.join(', ');
}

/**
 * What `none` parses to. Not null: commander turns an option parser's null
 * into ''.
 */
const NONE = 'none';

/** `--concurrency`, `--key-concurrency`: a count, or `none` to clear that limit; anything else is bad usage (exit 2). */
function countOrNone(value: string): number | typeof NONE {
  if (value === NONE) return NONE;
  const n = Number(value);
  if (!/^\d+$/.test(value) || !Number.isSafeInteger(n) || n < 1 || n > MAX_LIMIT) {
    throw new InvalidArgumentError(`must be an integer from 1 to ${MAX_LIMIT}, or none to clear it.`);
  }
  return n;
}

/**
 * `--rate N/DURATION`: N starts in any span of DURATION, a duration as cron's
 * `@every` takes it (h, m, s, ms: 1s, 500ms, 1m30s; a unit alone is one of it:
 * 100/s); or `none` to clear the rate limit.
 */
function rateOrNone(value: string): NonNullable<QueueLimits['rateLimit']> | typeof NONE {
  if (value === NONE) return NONE;
  const m = /^(\d+)\/(\S+)$/.exec(value);
  const per = m?.[2];
  const interval = per === undefined ? null : parseDuration(/^\d/.test(per) ? per : `1${per}`);
  if (m === null || interval === null) {
    throw new InvalidArgumentError('must be N/DURATION, e.g. 100/1s, 10/500ms or 1000/1m (units h, m, s, ms), or none to clear it.');
  }
  const limit = Number(m[1]);
  if (!Number.isSafeInteger(limit) || limit < 1 || limit > MAX_LIMIT) throw new InvalidArgumentError(`N must be an integer from 1 to ${MAX_LIMIT}.`);
  if (interval < 1 || interval > MAX_LIMIT) throw new InvalidArgumentError(`DURATION must be from 1ms to ${MAX_LIMIT}ms (about 24.8 days).`);
  return { limit, interval };
}

/** The limits a command's --concurrency, --key-concurrency and --rate give (none: null), and only those. */
function givenLimits(opts: {
  concurrency?: number | typeof NONE;
  keyConcurrency?: number | typeof NONE;
  rate?: NonNullable<QueueLimits['rateLimit']> | typeof NONE;
}): Partial<QueueLimits> {
  const value = <T>(v: T | typeof NONE) => (v === NONE ? null : v);
  return {
    ...(opts.concurrency === undefined ? {} : { concurrency: value(opts.concurrency) }),
    ...(opts.keyConcurrency === undefined ? {} : { keyConcurrency: value(opts.keyConcurrency) }),
    ...(opts.rate === undefined ? {} : { rateLimit: value(opts.rate) }),
  };
}

const CREATE_HELP = `
Idempotent: a queue that is known already keeps its tasks; the limits given
replace its limits (as queue limit --clear with them would), --paused pauses it,
and what is not given stays. A queue is also made known by its first enqueue, by
a server that serves it, and by queue limit and queue pause.
${jsonNote("Inspector.createQueue(queue, opts): the queue's info afterwards")}`;

const LIMIT_HELP = `
Sets the limits given and keeps the others as they are: it reads the queue's
limits first and writes them back with the given ones changed. none clears one
limit; --clear clears them all before the given ones are set, so --clear alone
removes every limit and --clear --concurrency 5 leaves only that one. The
limits hold for all servers together, from their next claim on; prefetched
tasks count as active. queue inspect shows them.

  --concurrency N       at most N tasks of the queue active at once
  --key-concurrency N   at most N active at once per concurrency key (the
                        enqueue option concurrencyKey; tasks without one are
                        not counted)
  --rate N/DURATION     at most N tasks started in any span of DURATION (a
                        sliding window): 100/1s, 10/500ms, 1000/1m, 5/1m30s

Examples:
  pgasynq queue limit emails --concurrency 10 --rate 100/1s
  pgasynq queue limit emails --rate none       # keeps concurrency 10
  pgasynq queue limit emails --clear           # no limits
${jsonNote('{"ok":true,"limits":{"concurrency":10,"keyConcurrency":null,"rateLimit":{"limit":100,"interval":1000}}}: the limits now set (interval in ms). An unknown queue is an error (exit 1)').trimEnd()}
Two runs at the same moment that change different limits of one queue may
lose one change (read, then write).
`;

export function registerQueue(program: CliProgram, ctx: CliContext): void {
  const queue = program.command('queue').description('list, inspect, pause, unpause, limit and remove queues');

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
    .description('one queue: size, groups, latency, paused, tasks by state, processed/failed, limits')
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
            ['limits', limitsText(q.limits)],
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
          days.map((d) => [day(d.date), String(d.processed), String(d.failed), errorRate(d.failed, d.processed)]),
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

  queue
    .command('limit')
    .description("set a queue's concurrency, per-key concurrency and rate limits; the ones not given stay")
    .argument('<queue>', 'queue name')
    .addOption(new Option('--concurrency <n>', 'most active tasks of the queue, all servers together; none: no limit').argParser(countOrNone))
    .addOption(new Option('--key-concurrency <n>', 'most active tasks per concurrency key; none: no limit').argParser(countOrNone))
    .addOption(new Option('--rate <n/duration>', 'most starts in any span of DURATION, e.g. 100/1s; none: no limit').argParser(rateOrNone))
    .option('--clear', 'clear every limit first (alone: remove them all)')
    .addHelpText('after', LIMIT_HELP)
    .action(async (name, opts) => {
      const given = givenLimits(opts);
      if (opts.clear !== true && Object.keys(given).length === 0) {
        throw new UsageError('queue limit needs --concurrency, --key-concurrency, --rate or --clear (queue inspect shows the limits)');
      }
      const limits = await withInspector(ctx, async (i) => {
        // createQueue: a queue not known yet is made known, without limits, as setQueueLimits would.
        const next: QueueLimits = { ...(opts.clear === true ? NO_LIMITS : (await i.createQueue(name)).limits), ...given };
        await i.setQueueLimits(name, next);
        return next;
      });
      ctx.emit({ ...OK, limits }, () => `queue "${name}" limits: ${limitsText(limits)}`);
    });

  queue
    .command('create')
    .description('make a queue known before its first task, with its limits and pause flag; a known queue keeps its tasks')
    .argument('<queue>', 'queue name')
    .addOption(new Option('--concurrency <n>', 'most active tasks of the queue, all servers together').argParser(countOrNone))
    .addOption(new Option('--key-concurrency <n>', 'most active tasks per concurrency key').argParser(countOrNone))
    .addOption(new Option('--rate <n/duration>', 'most starts in any span of DURATION, e.g. 100/1s').argParser(rateOrNone))
    .option('--paused', 'create it paused: servers take none of its tasks until `queue unpause`')
    .addHelpText('after', CREATE_HELP)
    .action(async (name, opts) => {
      const limits = givenLimits(opts);
      const info = await withInspector(ctx, (i) =>
        i.createQueue(name, { ...(Object.keys(limits).length === 0 ? {} : { limits }), ...(opts.paused === true ? { paused: true } : {}) }),
      );
      ctx.emit(info, () => `queue "${name}": ${info.size} tasks, limits: ${limitsText(info.limits)}${info.paused ? ', paused' : ''}`);
    });
}
