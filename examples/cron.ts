/**
 * A cron example: a Scheduler enqueues a heartbeat task every second and a
 * report every minute; a server runs them. Stops after three heartbeats.
 *
 *   npx tsx examples/cron.ts
 */
import { Scheduler, Server, Task } from '../src/index.js';
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
