/**
 * A cron example: a Scheduler (in time zone Europe/Berlin) enqueues a
 * heartbeat task every second ('@every 1s') and a report at second 0 of every
 * minute (a six-field cron expression, with enqueue options); a server runs
 * them. The script stops the scheduler and the server and exits after three
 * heartbeats.
 *
 *   npx tsx examples/cron.ts       # from the repository root
 *
 * Runs on an embedded PostgreSQL when DATABASE_URL is unset (see connect.ts).
 */
import { Scheduler, Server, Task } from 'pgasynq';
import { connect } from './connect.js';

const { conn, embedded } = await connect();

const scheduler = new Scheduler({ ...conn, location: 'Europe/Berlin' });
scheduler.register('@every 1s', new Task('health:ping', { service: 'checkout' }));
scheduler.register('0 * * * * *', new Task('report:minutely'), { queue: 'default', retention: 60_000 });

let pings = 0;
let stopAll!: () => void;
const threePings = new Promise<void>((resolve) => (stopAll = resolve));
const server = new Server({ ...conn, concurrency: 2 });
await server.start(async (task) => {
  console.log(`${new Date().toISOString()} ${task.type}`);
  if (task.type === 'health:ping' && ++pings === 3) stopAll();
});
await scheduler.start();
await threePings;
await scheduler.shutdown();
await server.shutdown();
await embedded?.close();
console.log(`done: ${pings} pings`);
