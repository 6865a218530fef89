/**
 * A Scheduler in its own process, for F19 (cron-multi-scheduler) and the soak
 * test S1: several copies run the same entries, and each tick must become
 * exactly one task (I8). Prints one JSON line {"event":"ready",...} once the
 * scheduler runs, and a JSON line {"event":"log",...} for each warning or
 * error the library logs. Shuts down on SIGTERM and exits 0; a SIGKILL is the
 * fault under test.
 *
 * env:
 *   DATABASE_URL, SCHEMA, NAME
 *   ENTRIES       JSON {label: interval}: an `@every <interval>` entry of task type `cron:<interval>`
 *                 per label; the ready line's `entries` maps each label to its entry id
 *   HEARTBEAT_MS  the Scheduler's heartbeatInterval (unset: the library's default)
 *   RETENTION     when set, each entry's tasks are enqueued with this retention (ms) and maxRetry 5
 *   HOST_CLOCK=1  the ready line also carries hostNow, the host clock this process sees (faketime may skew it)
 */
import { Scheduler, Task, type Logger } from '../../../src/index.js';
import { env, say } from './kit.js';

const name = env('NAME', 'cron');
const emit = (e: Record<string, unknown>) => say({ name, pid: process.pid, ...e });
const logAt =
  (level: string) =>
  (obj: object, msg?: string): void => {
    const err = (obj as { err?: { message?: string; code?: string } }).err;
    emit({ event: 'log', level, msg, err: err && { message: err.message, code: err.code } });
  };
const noop = (): void => {};
const logger: Logger = { debug: noop, info: noop, warn: logAt('warn'), error: logAt('error'), child: () => logger };

const heartbeatMs = env('HEARTBEAT_MS');
const retention = env('RETENTION');
const scheduler = new Scheduler({
  connectionString: process.env.DATABASE_URL,
  schema: process.env.SCHEMA,
  ...(heartbeatMs === '' ? {} : { heartbeatInterval: Number(heartbeatMs) }),
  logger,
});
const opts = retention === '' ? undefined : { retention: Number(retention), maxRetry: 5 };
const entries = Object.fromEntries(
  Object.entries(JSON.parse(env('ENTRIES')) as Record<string, string>).map(([label, every]) => [
    label,
    scheduler.register(`@every ${every}`, new Task(`cron:${every}`), opts),
  ]),
);
const running = scheduler.run().then(
  () => process.exit(0),
  (err: unknown) => {
    emit({ event: 'log', level: 'fatal', msg: String(err) });
    process.exit(1);
  },
);
while (scheduler.status === 'new') await new Promise((r) => setTimeout(r, 10));
emit({ event: 'ready', entries, ...(env('HOST_CLOCK') === '1' ? { hostNow: new Date().toISOString() } : {}) });
await running;
