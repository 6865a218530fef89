/**
 * W2's second setup fills the backlog from a process of its own, as a
 * producer would: nothing the filling left in the measuring process (pools,
 * prepared statements, a warm cache of the rows just written) helps the drain.
 * Usage: node --import tsx bench/fill.ts '<json>' with { system, n, payload }.
 * Exits 0 once every task is enqueued.
 */
import { load, type SystemName } from './adapters/index.js';
import { enqueueInChunks } from './workloads/w2-drain.js';

const spec = JSON.parse(process.argv[2] ?? '{}') as { system: SystemName; n: number; payload: number };
const adapter = await load(spec.system);
await adapter.setup();
await enqueueInChunks(adapter, spec.n, 10_000, spec.payload);
await adapter.teardown();
process.exit(0);
