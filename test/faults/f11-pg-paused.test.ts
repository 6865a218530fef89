/**
 * F11 postgres-paused (plan §5.2): the whole server (the postmaster and
 * every backend) is frozen with SIGSTOP under load, then resumed with
 * SIGCONT, in three phases of one run: (a) 0.5·L, (b) 2·L, (c) 2·B. The
 * workers keep running; every statement they send waits in the frozen server.
 *
 * What must hold:
 *   - no spurious rescue, in any phase: a task is only ever rescued after the
 *     worker that held it had told its handler to stop (its ctx.signal aborted,
 *     this host's clock, which is also the database's);
 *   - nothing runs twice at once: no execution of a task starts before the
 *     previous execution of that task was told to stop or had ended;
 *   - (a) the database takes no lease: no heartbeat finds its row gone
 *     (a 1.5 s freeze is shorter than the lease). The worker may still give a
 *     lease up on its own: it stops trusting a lease L − margin = 2 s after
 *     the last extension it sent, and a freeze longer than L − margin − H = 1 s
 *     can straddle that (as in F04). Each such task is then rescued, which is
 *     safe; every rescue must follow a lease the worker gave up;
 *   - (b, c) every worker aborts the handlers it holds at its local deadline,
 *     while the server is frozen; the recoverer rescues them after the resume,
 *     within B of it (I4 counted from the resume: no heartbeat can land while
 *     the server is frozen). Claims that were in flight land after the resume,
 *     past the worker's trust deadline (counted from when each claim was
 *     sent): those leases are given up too, and every task active just after
 *     the resume must also have left its lease within B;
 *   - I1–I5 over the whole run, the transactional effect exactly once.
 *
 * Each worker says when each handler call began, was aborted (and why) and
 * returned (REPORT_EXEC); rescues are read from the rows the recoverer marks
 * (error 'task lease expired', last_failed_at). The worker and the server
 * share this host's clock, so the two can be compared.
 */
import assert from 'node:assert/strict';
import { BOUND_S, FAST, ORACLE_BOUND_S, sleep, waitFor } from './harness.js';
import { faultTest, report } from './kit.js';

const MAX_RETRY = 3;
const L = FAST.leaseDuration;
const PHASES = [
  { variant: 'a', label: '0.5·L', pauseMs: 0.5 * L },
  { variant: 'b', label: '2·L', pauseMs: 2 * L },
  { variant: 'c', label: '2·B', pauseMs: 2 * BOUND_S * 1000 },
] as const;

interface PhaseResult {
  variant: string;
  pause_s: number;
  held: number;
  running_at_pause: number;
  aborted_in_freeze: number;
  rescued: number;
  rescued_by_recoverers: number;
  rescued_not_held: number;
  rescued_never_run: number;
  /** Each rescued task: held at the freeze?, and its executions (ms from the freeze: start, told to stop / returned). */
  rescue_detail: string[];
  spurious_rescues: number;
  leases_lost: number;
  db_lost_leases: number;
  recovery_s: number;
  /** From the resume until every task active just after it had also left that lease. */
  settled_s: number;
  /** Handlers started after the freeze began and told to stop (lease expired) within 500 ms: claims that landed past their trust deadline. */
  aborted_on_arrival: number;
  first_claim_after_resume_s: number;
}

/** One handler call, from the worker's own lines (this host's clock): when it began, and when it was told to stop or returned. */
interface Execution {
  taskId: string;
  attempt: string;
  start: number;
  abortedAt: number | undefined;
  reason: string | undefined;
  finishedAt: number | undefined;
  /** Told to stop, or returned: whichever came first (Infinity while neither). */
  stop: number;
}

function executions(events: Record<string, any>[]): Execution[] {
  const byAttempt = new Map<string, Execution>();
  for (const e of events) {
    if (e.event === 'started')
      byAttempt.set(e.attempt, {
        taskId: e.taskId,
        attempt: e.attempt,
        start: e.at,
        abortedAt: undefined,
        reason: undefined,
        finishedAt: undefined,
        stop: Infinity,
      });
  }
  for (const e of events) {
    const x = byAttempt.get(e.attempt);
    if (x === undefined) continue;
    if (e.event === 'aborted' && x.abortedAt === undefined) {
      x.abortedAt = e.at;
      x.reason = e.reason;
    }
    if (e.event === 'finished') x.finishedAt = e.at;
  }
  for (const x of byAttempt.values()) x.stop = Math.min(x.abortedAt ?? Infinity, x.finishedAt ?? Infinity);
  return [...byAttempt.values()];
}

faultTest(
  'F11 postgres-paused: the server frozen 0.5·L, 2·L and 2·B under load; no spurious rescue, nothing runs twice at once',
  { schema: 'f11', timeout: 240_000 },
  async (h) => {
    const workers = await Promise.all(['w1', 'w2'].map((n) => h.spawnWorker(n, { concurrency: 4, env: { REPORT_EXEC: '1' } })));
    h.startSampler();
    // 0.5–1.5 s tasks at 5/s: about 5 running on the 8 slots when a freeze begins.
    const producer = await h.spawnProducer({ count: 10_000, rate: 5, msMin: 500, msMax: 1500, maxRetry: MAX_RETRY });
    await waitFor(async () => Object.keys(await h.openStarts()).length === 2, 30_000, 'both workers running tasks', 50);

    const metric = (key: 'leasesLost' | 'fencedWrites' | 'recovered') => h.metricSum(key);
    const execs = () => executions(workers.flatMap((w) => w.events));
    const results: PhaseResult[] = [];
    for (const phase of PHASES) {
      await sleep(1500);
      await waitFor(async () => Object.values(await h.openStarts()).reduce((a, b) => a + b, 0) >= 3, 20_000, 'tasks running', 50);
      await sleep(700); // the workers' metrics lines are at most 500 ms old
      const before = { leasesLost: metric('leasesLost'), fenced: metric('fencedWrites'), recovered: metric('recovered') };
      // What the freeze catches: each active task (running, prefetched or completing) and its lease.
      const held = await h.query<{ id: string; lease_token: string }>("SELECT id, lease_token FROM {{schema}}.tasks WHERE state = 'active'");
      const phaseStart = Date.now();
      h.cluster.pause();
      const pausedAt = Date.now();
      await sleep(phase.pauseMs);
      h.cluster.resume();
      const resumedAt = Date.now();
      const t0 = performance.now();

      await waitFor(
        async () => (await h.query("SELECT 1 FROM {{schema}}.h_exec WHERE phase = 'start' AND at > $1 LIMIT 1", [new Date(resumedAt)])).length > 0,
        30_000,
        `a task started after resume ${phase.variant}`,
        50,
      );
      const firstClaim = Math.round((performance.now() - t0) / 100) / 10;
      // The claims sent before or during the freeze have landed by now: what they took is active too. A claim
      // that lands past the worker's trust deadline (counted from when it was sent) is given up at once, and
      // the recoverer takes it back after L + C: the phase ends once those are back as well.
      await sleep(300);
      const activeAfter = await h.query<{ id: string; lease_token: string }>("SELECT id, lease_token FROM {{schema}}.tasks WHERE state = 'active'");
      const movedOn = (rows: { id: string; lease_token: string }[]) => async () =>
        (
          await h.one<{ n: number }>(
            `SELECT count(*)::int AS n FROM {{schema}}.tasks t JOIN unnest($1::text[], $2::uuid[]) AS h(id, token) ON t.id = h.id
           WHERE t.state = 'active' AND t.lease_token = h.token`,
            [rows.map((r) => r.id), rows.map((r) => r.lease_token)],
          )
        ).n === 0;
      // Recovered: every task the freeze caught has left `active` under the lease it had then.
      await waitFor(movedOn(held), 30_000, `the tasks caught by freeze ${phase.variant} to move on`, 100);
      const recovery = Math.round((performance.now() - t0) / 100) / 10;
      await waitFor(movedOn(activeAfter), 30_000, `the tasks active after resume ${phase.variant} to move on`, 100);
      const settled = Math.round((performance.now() - t0) / 100) / 10;
      await waitFor(
        async () =>
          (await h.one<{ n: number }>("SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE id = ANY($1) AND state <> 'completed'", [held.map((r) => r.id)]))
            .n === 0,
        30_000,
        `the tasks caught by freeze ${phase.variant} to complete`,
        100,
      );
      await sleep(700);
      const phaseEnd = Date.now();

      // Rescues in this phase: the recoverer's mark, at the database's time of the rescue.
      const rescues = await h.query<{ id: string; at: Date }>(
        "SELECT id, last_failed_at AS at FROM {{schema}}.tasks WHERE error_msg = 'task lease expired' AND last_failed_at BETWEEN $1 AND $2",
        [new Date(phaseStart), new Date(phaseEnd)],
      );
      const all = execs();
      // Spurious: rescued while an execution of that task was running and had not been told to stop.
      const spurious = rescues.filter((r) => all.some((x) => x.taskId === r.id && x.start < r.at.getTime() && x.stop > r.at.getTime()));
      // The executions the freeze caught, and which of them were told to stop (lease expired) while the server was frozen.
      const caught = all.filter((x) => x.start < pausedAt && (x.finishedAt ?? Infinity) > pausedAt && (x.abortedAt ?? Infinity) > pausedAt);
      const inFreeze = caught.filter((x) => x.reason === 'LeaseExpiredError' && x.abortedAt! <= resumedAt);
      results.push({
        variant: phase.variant,
        pause_s: phase.pauseMs / 1000,
        held: held.length,
        running_at_pause: caught.length,
        aborted_in_freeze: inFreeze.length,
        rescued: rescues.length,
        rescued_by_recoverers: metric('recovered') - before.recovered,
        rescued_not_held: rescues.filter((r) => !held.some((x) => x.id === r.id)).length,
        rescued_never_run: rescues.filter((r) => !all.some((x) => x.taskId === r.id && x.start < r.at.getTime())).length,
        rescue_detail: rescues.slice(0, 8).map((r) => {
          const rel = (t: number | undefined) => (t === undefined ? '-' : String(t - pausedAt));
          const xs = all.filter((x) => x.taskId === r.id).map((x) => `[${rel(x.start)} ${rel(x.abortedAt)}:${x.reason ?? ''} ${rel(x.finishedAt)}]`);
          return `${r.id.slice(0, 8)} held=${held.some((x) => x.id === r.id)} rescued=${rel(r.at.getTime())} ${xs.join(' ')}`;
        }),
        spurious_rescues: spurious.length,
        leases_lost: metric('leasesLost') - before.leasesLost,
        db_lost_leases: metric('fencedWrites') - before.fenced,
        recovery_s: recovery,
        settled_s: settled,
        aborted_on_arrival: all.filter(
          (x) => x.start >= pausedAt && x.start <= resumedAt + 2000 && x.reason === 'LeaseExpiredError' && x.abortedAt! - x.start < 500,
        ).length,
        first_claim_after_resume_s: firstClaim,
      });
    }
    h.signal(producer, 'SIGTERM');
    await h.settle(120_000);

    // Nothing runs twice at once: per task, no execution begins while another one runs and has not been told to stop.
    let overlaps = 0;
    const overlapSamples: string[] = [];
    const all = execs();
    for (const x of all)
      for (const y of all)
        if (x !== y && x.taskId === y.taskId && y.start >= x.start && y.start < x.stop) {
          overlaps++;
          if (overlapSamples.length < 3) overlapSamples.push(`${x.taskId}: ${x.attempt} [${x.start}, ${x.stop}] / ${y.attempt} began ${y.start}`);
        }
    const unfinished = all.filter((x) => x.finishedAt === undefined).length;
    // The tasks that ran most often, and how each of their executions ended (for the figures).
    const runs = new Map<string, Execution[]>();
    for (const x of all) runs.set(x.taskId, [...(runs.get(x.taskId) ?? []), x]);
    const mostRun = [...runs.values()]
      .filter((xs) => xs.length > 2)
      .slice(0, 3)
      .map((xs) => xs.map((x) => `${new Date(x.start).toISOString().slice(14, 23)} ${x.reason ?? 'returned'}`).join(', '));

    // The samples during a freeze see leases run out that no heartbeat could extend: the bound counts the freeze.
    const stuckBound = ORACLE_BOUND_S + Math.max(...PHASES.map((p) => p.pauseMs)) / 1000;
    const c = await h.check({ maxRetry: MAX_RETRY, stuckBoundS: stuckBound });
    const by = <K extends keyof PhaseResult>(k: K) => results.map((r) => r[k]);
    report(h, c, 'F11 postgres-paused', {
      recovery_s: by('recovery_s'),
      leases_lost: by('leases_lost').reduce((a, b) => a + b, 0),
      pauses_s: by('pause_s'),
      spurious_rescues: by('spurious_rescues'),
      leases_lost_per_variant: by('leases_lost'),
      db_lost_leases: by('db_lost_leases'),
      held_at_pause: by('held'),
      running_at_pause: by('running_at_pause'),
      aborted_in_freeze: by('aborted_in_freeze'),
      executions: all.length,
      executions_unfinished: unfinished,
      rescued: by('rescued'),
      rescued_not_held: by('rescued_not_held'),
      rescued_never_run: by('rescued_never_run'),
      ran_over_twice: mostRun,
      first_claim_after_resume_s: by('first_claim_after_resume_s'),
      settled_s: by('settled_s'),
      aborted_on_arrival: by('aborted_on_arrival'),
      overlaps,
      overlap_samples: overlapSamples,
      stuck_bound_s: stuckBound,
      phases: results,
      notes:
        `postmaster + backends SIGSTOP for ${PHASES.map((p) => `${p.label} = ${p.pauseMs / 1000} s`).join(', ')}; 2 workers x 4, 0.5-1.5 s tasks at 5/s; ` +
        `per variant a/b/c: held ${by('held').join('/')}, handlers running ${by('running_at_pause').join('/')}, aborted in the freeze ${by('aborted_in_freeze').join('/')}, leases given up ${by('leases_lost').join('/')}, ` +
        `rescued ${by('rescued').join('/')}, spurious ${by('spurious_rescues').join('/')}; recovery_s = resume to every caught task off its old lease; overlaps ${overlaps}`,
    });
    assert.equal(overlaps, 0, `no two executions of one task ran at once: ${overlapSamples.join('; ')}`);
    assert.equal(unfinished, 0, 'every handler call returned');
    for (const r of results) {
      assert.equal(
        r.spurious_rescues,
        0,
        `${r.variant}: no task rescued while its handler still ran (ms from the freeze: [start abort:reason returned]): ${r.rescue_detail.join('; ')}`,
      );
      assert.ok(r.running_at_pause >= 2, `${r.variant}: the freeze caught running handlers (${r.running_at_pause})`);
      assert.ok(r.recovery_s <= ORACLE_BOUND_S, `${r.variant}: the caught tasks moved on ${r.recovery_s} s after the resume (bound ${ORACLE_BOUND_S} s)`);
      assert.ok(r.settled_s <= ORACLE_BOUND_S, `${r.variant}: every task active after the resume moved on within ${r.settled_s} s (bound ${ORACLE_BOUND_S} s)`);
      assert.ok(r.rescued <= r.leases_lost, `${r.variant}: every rescue (${r.rescued}) follows a lease its worker gave up (${r.leases_lost})`);
    }
    const [a, b, cc] = results as [PhaseResult, PhaseResult, PhaseResult];
    assert.equal(a.db_lost_leases, 0, '(a) no heartbeat found its lease taken: the database kept every lease through 0.5·L');
    for (const r of [b, cc]) {
      assert.equal(
        r.aborted_in_freeze,
        r.running_at_pause,
        `${r.variant}: every handler the freeze caught was told to stop (lease expired) while the server was frozen`,
      );
      assert.ok(r.rescued >= 1, `${r.variant}: the recoverer rescued the abandoned tasks after the resume`);
    }
  },
);
