/**
 * One measurement in a process of its own (run.ts starts one per system,
 * workload case and repetition): no pool, timer or JIT state carries over from
 * one system to the next, and a peer that hangs on shutdown cannot stall the
 * suite. Usage: node --import tsx bench/measure.ts '<json>' where json is
 * { workload: 'W1'…'W8' or 'WAL', system, params }. Prints `RESULT <json>` on stdout.
 */
import { load, type SystemName } from './adapters/index.js';

const spec = JSON.parse(process.argv[2] ?? '{}') as { workload: string; system: SystemName; params: Record<string, number> };
const modules: Record<string, () => Promise<{ measure: (a: never, p: never) => Promise<Record<string, number>> }>> = {
  W1: () => import('./workloads/w1-enqueue.js'),
  W2: () => import('./workloads/w2-drain.js'),
  W3: () => import('./workloads/w3-latency.js'),
  W4: () => import('./workloads/w4-scheduled.js'),
  W5: () => import('./workloads/w5-claim-cost.js'),
  W6: () => import('./workloads/w6-processes.js'),
  W7: () => import('./workloads/w7-bloat.js'),
  W8: () => import('./workloads/w8-snapshot.js'),
  WAL: () => import('./workloads/wal.js'),
  RT: () => import('./workloads/rt-wait.js'),
};
const mod = modules[spec.workload];
if (!mod) throw new Error(`unknown workload ${spec.workload}`);
const adapter = await load(spec.system);
const { measure } = await mod();
const result = await measure(adapter as never, spec.params as never);
process.stdout.write(`RESULT ${JSON.stringify({ label: adapter.label, ...result })}\n`);
// Some peers leave timers or sockets behind after close(); the figure is taken.
process.exit(0);
