/**
 * W6 — W2 with `procs` worker processes on one database, each with
 * `concurrency` slots. The processes start and connect first; all are told to
 * go at once; the clock runs from the first handler start in any process
 * (wall clock) until the system's tables say nothing is left.
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { Adapter } from '../adapters/types.js';
import { log, now, sleep, wallNow } from '../lib/common.js';
import { enqueueInChunks } from './w2-drain.js';

export interface W6Params {
  n: number;
  procs: number;
  concurrency: number;
  capMs: number;
}

interface Proc {
  child: ChildProcessWithoutNullStreams;
  handled: number;
  first: number;
  lines: (line: string) => Promise<void>;
}

function spawnWorker(system: string, concurrency: number): Proc {
  const script = fileURLToPath(new URL('./w6-worker.ts', import.meta.url));
  const child = spawn(process.execPath, ['--import', 'tsx', script, '--system', system, '--concurrency', String(concurrency)], {
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  child.stderr.on('data', (d: Buffer) => process.stderr.write(d));
  const waiting = new Map<string, () => void>();
  const proc: Proc = {
    child,
    handled: 0,
    first: 0,
    lines: (word) => new Promise<void>((resolve) => waiting.set(word, resolve)),
  };
  createInterface({ input: child.stdout }).on('line', (line) => {
    const [word, value] = line.split(' ');
    if (word === 'n') proc.handled = Number(value);
    else if (word === 'first') proc.first = Number(value);
    waiting.get(word!)?.();
  });
  return proc;
}

export async function measure(a: Adapter, p: W6Params): Promise<Record<string, number>> {
  await a.setup({ fresh: true });
  await enqueueInChunks(a, p.n);
  const procs = Array.from({ length: p.procs }, () => spawnWorker(a.name, p.concurrency));
  const exited = procs.map((pr) => new Promise<void>((resolve) => pr.child.on('exit', () => resolve())));
  try {
    await Promise.race([
      Promise.all(procs.map((pr) => pr.lines('ready'))),
      sleep(60_000).then(() => {
        throw new Error('worker processes did not get ready in 60 s');
      }),
    ]);
    for (const pr of procs) pr.child.stdin.write('go\n');
    const started = now();
    const sum = () => procs.reduce((s, pr) => s + pr.handled, 0);
    const firstAt = () => Math.min(...procs.filter((pr) => pr.first > 0).map((pr) => pr.first));
    while (sum() < p.n && now() - started < p.capMs + 10_000) await sleep(20);
    let left = p.n;
    for (;;) {
      left = await a.remaining();
      if (left === 0 || now() - started > p.capMs + 10_000) break;
      await sleep(2);
    }
    const end = wallNow();
    const seconds = (end - firstAt()) / 1000;
    for (const pr of procs) pr.child.stdin.write('stop\n');
    await Promise.race([Promise.all(exited), sleep(20_000)]);
    await a.teardown();
    const perProc = procs.map((pr) => pr.handled);
    return {
      perSec: (p.n - left) / seconds,
      seconds,
      capped: left > 0 ? 1 : 0,
      minShare: Math.min(...perProc) / Math.max(1, p.n),
      maxShare: Math.max(...perProc) / Math.max(1, p.n),
    };
  } finally {
    for (const pr of procs)
      if (pr.child.exitCode === null) {
        log('killing a W6 worker that did not exit');
        pr.child.kill('SIGKILL');
      }
  }
}
