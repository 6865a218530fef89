/**
 * A fan-out/fan-in workflow: word count over a document. One enqueueMany call
 * puts in a `count:part` task per paragraph and one `count:combine` task whose
 * dependsOn names every part. The parts run in parallel and each stores its
 * counts with ctx.writeResult; combine waits (state `waiting`) until the
 * transaction that completes the last part releases it, then reads every
 * part's counts with ctx.dependencyResults(), merges them and prints the top
 * words. The script exits once combine has run.
 *
 *   npx tsx examples/fan-in.ts     # from the repository root
 *
 * Runs on an embedded PostgreSQL when DATABASE_URL is unset (see connect.ts).
 *
 * (If a part failed for good, combine would be archived with it: that is
 * onDependencyFailure's default, 'archive'; with 'run' it would run on the
 * results of the parts that did complete.)
 */
import { Client, Server, ServeMux, Task } from 'pgasynq';
import { connect } from './connect.js';

const DOCUMENT = `
A queue holds tasks until a worker is free. The worker takes a task from the queue,
runs it, and marks the task done.

When a task fails the queue keeps it and the worker tries the task again later,
until it succeeds or runs out of retries.

Some tasks must wait for other tasks. A task that waits is released by the
transaction that completes the last task it waits for.

So a big job can be split into parts that run at once, and one last task
combines what the parts wrote.
`;

interface Part {
  part: number;
  text: string;
}
/** What a part writes with writeResult, and what combine reads back. */
interface PartCounts {
  part: number;
  words: number;
  counts: Record<string, number>;
}

const { conn, embedded } = await connect();
const client = new Client(conn);

// Fan out: a task per paragraph. Ids are ours (fresh per run, so runs sharing
// a database do not collide) because combine names the parts by id.
const queue = 'wordcount';
const run = Math.random().toString(36).slice(2, 8);
const paragraphs = DOCUMENT.trim().split(/\n\s*\n/);
const parts = paragraphs.map((text, i) => new Task<Part>('count:part', { part: i + 1, text }, { queue, taskId: `wc-${run}-part-${i + 1}` }));
// Fan in: combine depends on every part (bare ids: tasks of its own queue).
const combine = new Task('count:combine', null, {
  queue,
  taskId: `wc-${run}-combine`,
  dependsOn: parts.map((p) => p.options.taskId!),
});
const infos = await client.enqueueMany([...parts, combine]);
const combineInfo = infos.at(-1)!;
console.log(
  `enqueued ${parts.length} count:part tasks (${infos[0]!.state}) and count:combine (${combineInfo.state} for ${combineInfo.waitingFor} of ${combineInfo.dependsOn.length})`,
);

let combined!: () => void;
const finished = new Promise<void>((resolve) => (combined = resolve));
const mux = new ServeMux()
  .handle<Part>('count:part', async (task, ctx) => {
    const counts: Record<string, number> = {};
    const words = task.payload.text.toLowerCase().match(/[a-z']+/g) ?? [];
    for (const w of words) counts[w] = (counts[w] ?? 0) + 1;
    await ctx.writeResult({ part: task.payload.part, words: words.length, counts } satisfies PartCounts);
    console.log(`part ${task.payload.part}: ${words.length} words`);
  })
  .handle('count:combine', async (_task, ctx) => {
    if (ctx.taskId !== combine.options.taskId) return; // a leftover of an earlier, interrupted run
    const results = await ctx.dependencyResults(); // Map "wordcount/wc-…-part-N" → PartCounts
    const total = new Map<string, number>();
    let words = 0;
    for (const r of results.values()) {
      const part = r as PartCounts;
      words += part.words;
      for (const [w, n] of Object.entries(part.counts)) total.set(w, (total.get(w) ?? 0) + n);
    }
    const top = [...total].sort(([a, x], [b, y]) => y - x || a.localeCompare(b)).slice(0, 5);
    console.log(`combine: merged ${results.size} parts, ${words} words, ${total.size} distinct`);
    console.log(`top words: ${top.map(([w, n]) => `${w} ×${n}`).join(', ')}`);
    combined();
  });

const server = new Server({ ...conn, queues: { [queue]: 1 }, concurrency: 4 });
await server.start(mux);
await finished;
await server.shutdown();
await client.close();
await embedded?.close();
console.log('done: combine ran after every part');
