/**
 * A Scheduler in its own process for F19 (cron-multi-scheduler): the same
 * entries in every copy, `@every 1s` and `@every 2s`. env: DATABASE_URL,
 * SCHEMA, NAME. Prints one JSON line {"event":"ready",...} once the scheduler
 * runs (with the host clock it sees, which faketime may skew), and a JSON line
 * {"event":"log",...} for each warning or error the library logs. Shuts down
 * on SIGTERM and exits 0; a SIGKILL is the fault under test.
 */
import { Scheduler, Task, type Logger } from '../../../src/index.js';

const name = process.env.NAME ?? 'cron';
const emit = (e: Record<string, unknown>) => process.stdout.write(`${JSON.stringify({ name, pid: process.pid, ...e })}\n`);
const logAt =
  (level: string) =>
  (obj: object, msg?: string): void => {
    const err = (obj as { err?: { message?: string; code?: string } }).err;
    emit({ event: 'log', level, msg, err: err && { message: err.message, code: err.code } });
  };
const noop = (): void => {};
const logger: Logger = { debug: noop, info: noop, warn: logAt('warn'), error: logAt('error'), child: () => logger };

const scheduler = new Scheduler({
  connectionString: process.env.DATABASE_URL,
  schema: process.env.SCHEMA,
  heartbeatInterval: 1000,
  logger,
});
const entries = {
  every1s: scheduler.register('@every 1s', new Task('cron:1s')),
  every2s: scheduler.register('@every 2s', new Task('cron:2s')),
};
const running = scheduler.run().then(
  () => process.exit(0),
  (err: unknown) => {
    emit({ event: 'log', level: 'fatal', msg: String(err) });
    process.exit(1);
  },
);
while (scheduler.status === 'new') await new Promise((r) => setTimeout(r, 10));
emit({ event: 'ready', entries, hostNow: new Date().toISOString() });
await running;
