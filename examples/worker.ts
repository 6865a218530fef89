/**
 * A plain worker: a producer enqueues ten welcome emails into queue "default"
 * and ten thumbnails into queue "low" in one enqueueMany call; a server serves
 * both queues (weights 3 and 1) with a ServeMux, a middleware that counts
 * finished tasks, ctx.logger and ctx.writeResult, and the script exits once
 * all twenty are done.
 *
 *   npx tsx examples/worker.ts     # from the repository root
 *
 * Runs on an embedded PostgreSQL when DATABASE_URL is unset (see connect.ts).
 */
import { Client, Server, ServeMux, Task } from 'pgasynq';
import { connect } from './connect.js';

interface WelcomeEmail {
  userId: number;
  address: string;
}
interface Thumbnail {
  path: string;
  width: number;
}

const { conn, embedded } = await connect();
const client = new Client(conn);

const emails = Array.from({ length: 10 }, (_, i) => new Task<WelcomeEmail>('email:welcome', { userId: i, address: `user${i}@example.com` }));
const thumbs = Array.from({ length: 10 }, (_, i) => new Task<Thumbnail>('image:thumbnail', { path: `uploads/${i}.jpg`, width: 320 }, { queue: 'low' }));
await client.enqueueMany([...emails, ...thumbs]);

let done = 0;
let allDone!: () => void;
const finished = new Promise<void>((resolve) => (allDone = resolve));
const mux = new ServeMux()
  .use((next) => async (task, ctx) => {
    await next(task, ctx);
    if (++done === emails.length + thumbs.length) allDone();
  })
  .handle('email:welcome', async (task, ctx) => {
    const { address } = task.payload as WelcomeEmail;
    ctx.logger.info({ address }, 'sending welcome email');
    console.log(`email to ${address} (attempt ${ctx.attempt})`);
  })
  .handle('image:thumbnail', async (task, ctx) => {
    const { path, width } = task.payload as Thumbnail;
    await ctx.writeResult({ path: path.replace('.jpg', `.${width}.jpg`) });
    console.log(`thumbnail of ${path}`);
  });

const server = new Server({ ...conn, queues: { default: 3, low: 1 }, concurrency: 4 });
await server.start(mux);
await finished;
await server.shutdown();
await client.close();
await embedded?.close();
console.log(`done: ${done} tasks`);
