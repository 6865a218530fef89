/**
 * F27 slow-db on the PRODUCTION profile (plan §5.2): a command, not part of
 * `npm run test:faults` (it takes about 10 minutes):
 *
 *   node --import tsx test/faults/f27-slow-db-production.ts
 *
 * Injected: as f27-slow-db.test.ts (slow-db.ts): every connection of three
 * workers through the harness's TCP proxy, server → client delay d ∈ {0.1,
 * 0.5, 1, 2, 5} s for 60 s per phase, then lifted until the run settles;
 * profile lease L = 30 s, heartbeat H = 5 s, recover cutoff 30 s, recover
 * interval 60 s, poll P = 5 s (trust window L − margin = 25 s). Tasks: 0.5/s
 * of 0.2–0.8 s (mostly inside ctx.transaction) and 0.1/s of 30–50 s (on
 * heartbeats, past L).
 *
 * Must hold: I2 with I1, I3, I5; and the plan's "no lease lost for d ≤ 5 s":
 * no task given up to the delay in any phase (given_up 0: an attempt aborted
 * with LeaseExpiredError whose ctx.transaction did not commit), and nothing
 * rescued in any phase (rescued 0: no lease ran out in the database either).
 * The workers' leases_lost counter is recorded beside it: it also counts
 * leases the worker stopped trusting inside ctx.transaction whose completion
 * still committed.
 *
 * Prints the figures (also appended to results/reliability-results.jsonl and
 * written to results/logs/f27_production/figures.jsonl) and a last line
 * `F27 production: PASS` or `F27 production: FAIL …`; exits 1 on failure.
 */
import type { Harness } from './harness.js';
import { runSlowDb } from './slow-db.js';

const hold: { h?: Harness } = {};
const t0 = performance.now();
let failures: string[] = [];
try {
  const { phases, problems, fig } = await runSlowDb('production', hold);
  console.log(JSON.stringify(fig, null, 1));
  failures = [...problems];
  for (const p of phases) {
    if (p.started === 0) failures.push(`no work ran during d = ${p.d_s} s`);
    if (p.given_up !== 0) failures.push(`d = ${p.d_s} s: ${p.given_up} tasks given up to the delay (${JSON.stringify(p)})`);
    if (p.rescued !== 0) failures.push(`d = ${p.d_s} s: ${p.rescued} tasks rescued (${JSON.stringify(p)})`);
  }
} catch (err) {
  failures.push(String((err as Error)?.stack ?? err));
} finally {
  await hold.h?.teardown();
}
console.log(`wall time ${Math.round((performance.now() - t0) / 1000)} s`);
console.log(failures.length === 0 ? 'F27 production: PASS' : `F27 production: FAIL\n${failures.join('\n')}`);
process.exit(failures.length === 0 ? 0 : 1);
