/**
 * The soak test's Scheduler process: S1's cron schedules (@every 1s, 10s,
 * 1m, 5m), each task kept RETENTION ms once completed. Several copies run the
 * same entries; each tick must become exactly one task (I8).
 *
 * env: DATABASE_URL, SCHEMA, NAME, RETENTION (60000).
 * stdout: {"event":"ready","entries"}, {"event":"log",...} for each warning or error.
 * SIGTERM: shutdown, exit 0.
 */
import { Scheduler, Task, type Logger } from '../../../src/index.js';

const name = process.env.NAME ?? 'cron';
const retention = Number(process.env.RETENTION ?? '60000');
const emit = (e: Record<string, unknown>) => process.stdout.write(`${JSON.stringify({ name, pid: process.pid, ...e })}\n`);
const logAt =
  (level: string) =>
  (obj: object, msg?: string): void => {
    const err = (obj as { err?: { message?: string; code?: string } }).err;
    emit({ event: 'log', level, msg, err: err && { message: err.message, code: err.code } });
  };
const noop = (): void => {};
const logger: Logger = { debug: noop, info: noop, warn: logAt('warn'), error: logAt('error'), child: () => logger };

const scheduler = new Scheduler({ connectionString: process.env.DATABASE_URL, schema: process.env.SCHEMA, logger });
const opts = { retention, maxRetry: 5 };
const entries = {
  '1s': scheduler.register('@every 1s', new Task('cron:1s'), opts),
  '10s': scheduler.register('@every 10s', new Task('cron:10s'), opts),
  '1m': scheduler.register('@every 1m', new Task('cron:1m'), opts),
  '5m': scheduler.register('@every 5m', new Task('cron:5m'), opts),
};
const running = scheduler.run().then(
  () => process.exit(0),
  (err: unknown) => {
    emit({ event: 'log', level: 'fatal', msg: String(err) });
    process.exit(1);
  },
);
while (scheduler.status === 'new') await new Promise((r) => setTimeout(r, 10));
emit({ event: 'ready', entries });
await running;
