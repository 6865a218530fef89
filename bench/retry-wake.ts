/**
 * How late a retry starts: 10 tasks that fail three times each with a
 * 200 ms retryDelay, the forwarder's poll at its default (5 s). Prints the
 * time from each failure to the next attempt's start (p50, max). Before a
 * failure woke the forwarders, retries waited for the poll.
 *
 *   DATABASE_URL=postgres://… node --import tsx bench/retry-wake.ts
 */
import { Client, Server, Task, migrate, type TaskContext } from '../src/index.js';

const connectionString = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const schema = 'bench_retry_wake';
const DELAY_MS = 200;
const TASKS = 10;
const FAILURES = 3;

await migrate({ connectionString, schema, logger: false });
const client = new Client({ connectionString, schema, logger: false });
const lastStart = new Map<string, number>();
const gaps: number[] = [];
let finished = 0;
const server = new Server({ connectionString, schema, logger: false, concurrency: 4, retryDelay: () => DELAY_MS });
await server.start((_task: Task, ctx: TaskContext) => {
  const now = performance.now();
  const before = lastStart.get(ctx.taskId);
  if (before !== undefined) gaps.push(now - before);
  lastStart.set(ctx.taskId, now);
  if (ctx.retryCount < FAILURES) throw new Error('fails on purpose');
  finished++;
});
try {
  for (let i = 0; i < TASKS; i++) await client.enqueue(new Task('retry-wake'), { maxRetry: FAILURES });
  while (finished < TASKS) await new Promise((r) => setTimeout(r, 50));
} finally {
  await server.shutdown();
  await client.close();
}
gaps.sort((a, b) => a - b);
const ms = (v: number | undefined) => `${Math.round(v ?? NaN)} ms`;
console.log(`${gaps.length} retries with retryDelay ${DELAY_MS} ms: failure → next start p50 ${ms(gaps[Math.floor(gaps.length / 2)])}, max ${ms(gaps.at(-1))}`);
