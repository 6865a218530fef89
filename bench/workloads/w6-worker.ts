/**
 * One worker process of W6. Protocol on stdio, one line each:
 *   → "ready"            once connected (after the adapter's setup)
 *   ← "go"               start the workers
 *   → "first <wall ms>"  when the first handler starts
 *   → "n <handled>"      every 100 ms
 *   ← "stop"             stop the workers and exit
 *   → "bye"
 */
import { createInterface } from 'node:readline';
import { load, type SystemName } from '../adapters/index.js';
import type { Workers } from '../adapters/types.js';
import { parseArgs, wallNow } from '../lib/common.js';

const args = parseArgs(process.argv.slice(2));
const adapter = await load(args.system as SystemName);
await adapter.setup({ fresh: false });
const say = (line: string) => process.stdout.write(`${line}\n`);
let handled = 0;
let workers: Workers | undefined;
let ticker: NodeJS.Timeout | undefined;
say('ready');
for await (const line of createInterface({ input: process.stdin })) {
  if (line === 'go') {
    workers = await adapter.startWorkers({
      concurrency: Number(args.concurrency ?? 10),
      handler: () => {
        if (handled++ === 0) say(`first ${wallNow()}`);
      },
    });
    ticker = setInterval(() => say(`n ${handled}`), 100);
  } else if (line === 'stop') {
    clearInterval(ticker);
    say(`n ${handled}`);
    await workers?.stop();
    await adapter.teardown();
    say('bye');
    process.exit(0);
  }
}
