/**
 * F27 slow-db (latency injection), fast profile (plan §5.2). The run is
 * slow-db.ts's; the production profile is a separate, longer command:
 * f27-slow-db-production.ts.
 *
 * Injected: every connection of the three workers (pool and LISTEN) goes
 * through the harness's TCP proxy; for 20 s per phase, each chunk the
 * server sends them is delayed by d ∈ {0.1, 0.5, 1, 2, 5} s (client →
 * server is not), then the delay is lifted and the run settles before the
 * next d. A producer (direct) enqueues 2 `tx` tasks/s of 0.2–0.8 s
 * throughout (1/s of 0.2–0.8 s, which spend most of their lease inside
 * ctx.transaction, and 0.5/s of 2–5 s, which live on heartbeats); maxRetry
 * 20, so that the repeated losses of the slow phases end in completion
 * rather than in the archive.
 *
 * Must hold: whatever d does to the leases, it does so safely: I2 (the
 * plan's invariant for F27: dup effects 0) with I1, I3, I5 (nothing lost,
 * every effect under its own attempt's lease); I4's bound assumes one
 * statement latency of slack, so the time stuck is recorded per phase
 * against B_d = L + C + R + d + 2 s instead. And the curve the plan
 * expects: no task given up to the delay (an attempt aborted with
 * LeaseExpiredError whose ctx.transaction did not commit) and none rescued
 * at d = 0.1 s and 0.5 s (below L − margin − H = 1 s); tasks given up, and
 * rescued, at d = 2 s and 5 s (past it: this also shows the test can see a
 * loss).
 *
 * Figures: leases_lost per d (and of those, how many the worker gave up
 * inside ctx.transaction whose row lock still let the completion commit),
 * tasks rescued, effects, heartbeat gap; dup_effects.
 */
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { FAST, type Harness } from './harness.js';
import { runSlowDb, trustMs } from './slow-db.js';

const hold: { h?: Harness } = {};
after(() => hold.h?.teardown());

test('F27 slow-db (fast profile): server→client delay 0.1–5 s; leases lost once d passes L − margin − H, and always safely', { timeout: 290_000 }, async () => {
  const { phases, problems, c } = await runSlowDb('fast', hold);
  const by = Object.fromEntries(phases.map((p) => [p.d_s, p]));
  assert.deepEqual(problems, []);
  assert.equal(c.dupEffects, 0);
  // L − margin − H: the latency the plan expects a lease to survive.
  const plan = (trustMs(FAST.leaseDuration) - FAST.heartbeatInterval) / 1000;
  for (const p of phases) assert.ok(p.started > 0, `work ran during d = ${p.d_s} s`);
  // Below L − margin − H no task may be given up to the delay. (A lease the worker stopped trusting inside
  // ctx.transaction, whose row lock still let the completion commit, did not lose its task: the workers'
  // leases_lost counter counts those too, so it is recorded, not asserted.)
  for (const d of [0.1, 0.5]) {
    assert.equal(by[d]!.given_up, 0, `d = ${d} s, below L − margin − H = ${plan} s: no task given up to the delay (${JSON.stringify(by[d])})`);
    assert.equal(by[d]!.rescued, 0, `d = ${d} s: nothing rescued (${JSON.stringify(by[d])})`);
  }
  for (const d of [2, 5]) assert.ok(by[d]!.given_up > 0, `d = ${d} s, past L − margin − H = ${plan} s: tasks given up and rescued (${JSON.stringify(by[d])})`);
});
