/**
 * F32 workflows-under-faults: fan-in graphs (GROUPS groups of FANIN
 * dependencies, one dependent each) and chains (each link depends on the one
 * before), enqueued while 4 worker processes run them. Workers are killed -9
 * while they hold the last dependencies of a waiting dependent (respawned 2 s
 * later), and PostgreSQL is crashed (`pg_ctl -m immediate stop`, down
 * 3 s, start) while a dependent waits only for dependencies that are
 * running: completions, and the releases they carry, are cut mid-flight.
 *
 * Half the fan-in dependencies complete through ctx.transaction (`tx`, an
 * h_effects row in the completion's own transaction), half through the
 * batched completion (`plain`); dependents and chain links are `tx`. Two
 * triggers of the test's own log, in the transaction that makes the change:
 * every completion (wf_done: the task, its transaction id, the time) and every
 * way out of `waiting` (wf_rel: the dependent, the new state, the transaction
 * id). A release lost with a crashed transaction is lost with its log row; a
 * release that commits twice shows as two rows.
 *
 * Checked after the drain, for every dependent: released exactly once (one
 * wf_rel row, to pending), in the transaction that completed one of its
 * dependencies; every execution of it (h_exec start) began after every one
 * of its dependencies had completed (wf_done, inside their completing
 * transactions); its effect committed once; nothing left waiting; every
 * dependency completed once, every edge settled as completed; and I1–I5 of
 * the harness (nothing lost, effects once, attempts bounded, nothing stuck).
 *
 * An execution start here is the dependent's h_exec 'start' row, committed
 * with synchronous_commit = on as the handler's first act: it writes out the
 * WAL before it, so the release and claim it follows are durable by then. A
 * dependent whose handler started on a batched completion (committed
 * asynchronously by the Server) that a crash then erased leaves no such row
 * when the crash comes first, and this test cannot see it; F32b looks for it
 * from the handlers' own lines, with a control.
 */
import assert from 'node:assert/strict';
import { Task, TaskIdConflictError } from '../../src/index.js';
import { heldByOwner, killsAndCrashes } from './crashes.js';
import { sleep, waitFor } from './harness.js';
import { faultTest, outageBound, report } from './kit.js';
import { fanIn, WORKFLOW_LOG_SQL } from './setups.js';

const MAX_RETRY = 8;
const GROUPS = 20;
const FANIN = 30;
const CHAINS = 4;
const CHAIN_LEN = 8;
const FAULTS = { kills: 3, crashes: 2, downMs: 3000 };
/** One enqueueMany call (a group, or a chain) every UNIT_MS. */
const UNIT_MS = 900;
/** Each ctx.transaction stays open this long before it completes its task: kills and crashes land inside completing transactions more often. */
const TX_HOLD_MS = 100;

interface Unit {
  name: string;
  tasks: Task[];
}

/** The graph: every (dependent, dependency) edge, and the units to enqueue, groups and chains interleaved. */
function buildGraph(): { units: Unit[]; edges: [string, string][]; dependents: string[] } {
  const edges: [string, string][] = [];
  const groups: Unit[] = [];
  const ms = (min: number, max: number) => ({ ms: min + Math.random() * (max - min) });
  const opts = (taskId: string, dependsOn?: string[]) => ({ taskId, maxRetry: MAX_RETRY, retention: 3_600_000, ...(dependsOn ? { dependsOn } : {}) });
  for (let g = 0; g < GROUPS; g++) {
    const group = fanIn(
      g,
      FANIN,
      (id, i) => new Task(i % 2 === 0 ? 'tx' : 'plain', ms(50, 250), opts(id)),
      (id, deps) => new Task('tx', ms(50, 150), opts(id, deps)),
    );
    edges.push(...group.edges);
    groups.push({ name: `group ${g}`, tasks: group.tasks });
  }
  const chains: Unit[] = [];
  for (let c = 0; c < CHAINS; c++) {
    const links = Array.from({ length: CHAIN_LEN }, (_, k) => `c${c}-${k}`);
    for (let k = 1; k < CHAIN_LEN; k++) edges.push([links[k]!, links[k - 1]!]);
    chains.push({ name: `chain ${c}`, tasks: links.map((id, k) => new Task('tx', ms(200, 500), opts(id, k === 0 ? undefined : [links[k - 1]!]))) });
  }
  // A chain after every 5 groups: chain links are released all through the run.
  const units: Unit[] = [];
  for (let i = 0; i < groups.length; i++) {
    if (i % 5 === 0 && chains.length > 0) units.push(chains.shift()!);
    units.push(groups[i]!);
  }
  units.push(...chains);
  return { units, edges, dependents: [...new Set(edges.map(([d]) => d))] };
}

faultTest(
  'F32 workflows under faults: kill -9 and PostgreSQL crashes during fan-in releases; each dependent released once, never early',
  { schema: 'f32', timeout: 240_000 },
  async (h) => {
    await h.query(WORKFLOW_LOG_SQL);
    const workers = await h.spawnWorkers(4, { concurrency: 4, sleepMin: 50, sleepMax: 250, env: { TX_HOLD_MS: String(TX_HOLD_MS) } });
    h.startSampler();
    const t0 = performance.now();
    const { units, edges, dependents } = buildGraph();

    // The driver: one unit every UNIT_MS, each retried through the outages until the database has it.
    // Ids go to the acknowledgement log only once enqueueMany resolved (or a retry found them all there).
    let enqueueErrors = 0;
    let enqueueConflicts = 0;
    let driverDone = false;
    const driver = (async () => {
      for (const unit of units) {
        const ids = unit.tasks.map((t) => t.options.taskId!);
        for (;;) {
          try {
            await h.client.enqueueMany(unit.tasks);
            break;
          } catch (err) {
            if (err instanceof TaskIdConflictError) {
              // An earlier try committed without its reply: enqueueMany is all or nothing, so all of it is there.
              const { n } = await h.one<{ n: number }>('SELECT count(*)::int AS n FROM {{schema}}.tasks WHERE id = ANY($1)', [ids]);
              assert.equal(n, ids.length, `${unit.name}: a conflict means the whole unit committed`);
              enqueueConflicts++;
              break;
            }
            enqueueErrors++;
            await sleep(250);
          }
        }
        h.ack(ids);
        await sleep(UNIT_MS);
      }
      driverDone = true;
    })();

    // Kill a worker holding a dependency of a waiting dependent that has at most 3 left (the next releases);
    // crash while a dependent waits only for dependencies that are running now (at most 2): its release is in flight.
    const faults = await killsAndCrashes(h, workers, {
      ...FAULTS,
      gapMs: [1500, 1500],
      held: heldByOwner(
        h,
        `SELECT s.lease_owner AS owner, count(*)::int AS held
         FROM {{schema}}.task_states s
         JOIN {{schema}}.task_dependencies d ON d.dependency_seq = s.seq AND d.outcome IS NULL
         JOIN {{schema}}.task_states w ON w.seq = d.dependent_seq AND w.state = 'waiting' AND w.waiting_for <= 3
         WHERE s.state = 'active' AND s.lease_owner IS NOT NULL GROUP BY 1`,
      ),
      victim: { min: 1, what: 'a worker holding the last dependencies of a dependent', everyMs: 20 },
      beforeCrash: () =>
        waitFor(
          async () =>
            (
              await h
                .query<{ n: number }>(
                  `SELECT count(*)::int AS n FROM {{schema}}.task_states w
                   WHERE w.state = 'waiting' AND w.waiting_for <= 2 AND NOT EXISTS (
                     SELECT 1 FROM {{schema}}.task_dependencies d JOIN {{schema}}.task_states s ON s.seq = d.dependency_seq
                     WHERE d.dependent_seq = w.seq AND d.outcome IS NULL AND s.state <> 'active')`,
                )
                .catch(() => [{ n: 0 }])
            )[0]!.n,
          30_000,
          'a release in flight',
          20,
        ),
    });
    const { heldAtKill, atCrash: inFlightAtCrash, restartMs } = faults;
    const faultsBeforeLastUnit = !driverDone;
    await driver;
    await faults.respawned;
    await h.settle(120_000);
    const wallS = Math.round((performance.now() - t0) / 1000);

    const stuckBound = outageBound(FAULTS.downMs, restartMs);
    const c = await h.check({ maxRetry: MAX_RETRY, txTypes: ['tx'], stuckBoundS: stuckBound });
    // Per dependent: its releases, whether one came in a completing transaction of its dependencies,
    // its executions and those that began before its last dependency completed, its effects.
    const per = await h.query<{
      id: string;
      state: string;
      releases: number;
      released_to: string[];
      release_in_completing_tx: boolean;
      deps: number;
      deps_done: number;
      starts: number;
      early_starts: number;
      effects: number;
      waiting_for: number | null;
    }>(
      `WITH e AS (SELECT * FROM unnest($1::text[], $2::text[]) AS e(dependent, dependency)),
       ds AS (SELECT e.dependent, t.seq, (SELECT max(x.at) FROM {{schema}}.wf_done x WHERE x.seq = t.seq) AS done_at,
                     (SELECT count(*) FROM {{schema}}.wf_done x WHERE x.seq = t.seq) AS done_n
              FROM e JOIN {{schema}}.tasks t ON t.id = e.dependency)
       SELECT t.id, t.state, t.waiting_for,
         (SELECT count(*)::int FROM {{schema}}.wf_rel r WHERE r.seq = t.seq) AS releases,
         ARRAY(SELECT r.state FROM {{schema}}.wf_rel r WHERE r.seq = t.seq ORDER BY r.at) AS released_to,
         EXISTS (SELECT 1 FROM {{schema}}.wf_rel r JOIN {{schema}}.wf_done x ON x.xid = r.xid
                 WHERE r.seq = t.seq AND x.seq IN (SELECT ds.seq FROM ds WHERE ds.dependent = t.id)) AS release_in_completing_tx,
         (SELECT count(*)::int FROM ds WHERE ds.dependent = t.id) AS deps,
         (SELECT count(*)::int FROM ds WHERE ds.dependent = t.id AND ds.done_n = 1) AS deps_done,
         (SELECT count(DISTINCT x.attempt)::int FROM {{schema}}.h_exec x WHERE x.task_id = t.id AND x.phase = 'start') AS starts,
         (SELECT count(*)::int FROM {{schema}}.h_exec x WHERE x.task_id = t.id AND x.phase = 'start'
            AND x.at <= (SELECT max(ds.done_at) FROM ds WHERE ds.dependent = t.id)) AS early_starts,
         (SELECT count(*)::int FROM {{schema}}.h_effects f WHERE f.task_id = t.id) AS effects
       FROM {{schema}}.tasks t WHERE t.id = ANY($3::text[]) ORDER BY t.id`,
      [edges.map(([d]) => d), edges.map(([, x]) => x), dependents],
    );
    const g = await h.one<{ double_completions: number; completed: number; logged: number; unsettled: number; failed_edges: number; redone: number }>(
      `SELECT (SELECT count(*)::int FROM (SELECT seq FROM {{schema}}.wf_done GROUP BY 1 HAVING count(*) > 1) d) AS double_completions,
              (SELECT count(*)::int FROM {{schema}}.tasks WHERE state = 'completed') AS completed,
              (SELECT count(DISTINCT seq)::int FROM {{schema}}.wf_done) AS logged,
              (SELECT count(*)::int FROM {{schema}}.task_dependencies WHERE outcome IS NULL) AS unsettled,
              (SELECT count(*)::int FROM {{schema}}.task_dependencies WHERE outcome IS DISTINCT FROM 'completed') AS failed_edges,
              (SELECT count(*)::int FROM (SELECT task_id FROM {{schema}}.h_exec WHERE phase = 'end' GROUP BY 1 HAVING count(*) > 1) r) AS redone`,
    );
    const doubleReleases = per.filter((d) => d.releases > 1);
    const neverReleased = per.filter((d) => d.releases === 0);
    const wrongRelease = per.filter((d) => d.released_to.some((s) => s !== 'pending'));
    const outsideCompletion = per.filter((d) => d.releases > 0 && !d.release_in_completing_tx);
    const early = per.filter((d) => d.early_starts > 0);
    const notRun = per.filter((d) => d.state !== 'completed' || d.effects !== 1);
    const depsNotDone = per.filter((d) => d.deps_done !== d.deps);
    const figures = report(h, c, 'F32 workflows under faults', {
      dependents: per.length,
      edges: edges.length,
      double_releases: doubleReleases.length,
      never_released: neverReleased.length,
      released_outside_completion: outsideCompletion.length,
      early_starts_dependents: early.length,
      dependents_rerun: per.filter((d) => d.starts > 1).length,
      double_completions: g.double_completions,
      completions_redone: g.redone,
      unsettled_edges: g.unsettled,
      kills: FAULTS.kills,
      held_near_release_at_kill: heldAtKill,
      crashes: FAULTS.crashes,
      releases_in_flight_at_crash: inFlightAtCrash,
      restart_ms: restartMs,
      enqueue_errors: enqueueErrors,
      enqueue_conflicts: enqueueConflicts,
      faults_before_last_unit: faultsBeforeLastUnit,
      stuck_bound_s: stuckBound,
      wall_s: wallS,
      notes:
        `${GROUPS} fan-ins of ${FANIN} (half tx, half batched) + ${CHAINS} chains of ${CHAIN_LEN}, one unit per ${UNIT_MS} ms; 4 workers x 4, ctx.transaction held ${TX_HOLD_MS} ms; ` +
        `SIGKILL ${FAULTS.kills}x a worker holding the last dependencies of a dependent (respawn 2 s), crash ${FAULTS.crashes}x with a release in flight ` +
        `(${FAULTS.downMs / 1000} s down); releases and completions logged by triggers in their own transactions`,
    });
    console.log(JSON.stringify({ ...figures, notes: undefined }));
    const show = (rows: typeof per) =>
      rows
        .slice(0, 5)
        .map((d) => JSON.stringify(d))
        .join('; ');
    assert.equal(heldAtKill.length, FAULTS.kills, 'every kill came');
    assert.equal(restartMs.length, FAULTS.crashes, 'every crash came');
    assert.equal(per.length, GROUPS + CHAINS * (CHAIN_LEN - 1), 'every dependent exists');
    assert.equal(c.tasks, GROUPS * (FANIN + 1) + CHAINS * CHAIN_LEN, 'every task enqueued once');
    assert.equal(doubleReleases.length, 0, `dependents released twice: ${show(doubleReleases)}`);
    assert.equal(neverReleased.length, 0, `dependents never released: ${show(neverReleased)}`);
    assert.equal(wrongRelease.length, 0, `dependents released to a state other than pending: ${show(wrongRelease)}`);
    assert.equal(outsideCompletion.length, 0, `releases not in a transaction that completed a dependency: ${show(outsideCompletion)}`);
    assert.equal(early.length, 0, `dependents started before their last dependency completed: ${show(early)}`);
    assert.equal(notRun.length, 0, `dependents not completed with exactly one committed effect: ${show(notRun)}`);
    assert.equal(depsNotDone.length, 0, `dependents with a dependency not completed exactly once: ${show(depsNotDone)}`);
    assert.ok(
      per.every((d) => d.waiting_for === 0),
      'every dependent counted every dependency down',
    );
    assert.equal(g.double_completions, 0, 'no task completed twice');
    assert.equal(g.logged, g.completed, 'every completion was logged in its transaction');
    assert.equal(g.failed_edges, 0, 'every edge settled as completed');
    assert.equal(c.states.completed, c.tasks, 'every task completed');
    assert.ok(
      heldAtKill.every((n) => n > 0),
      'every victim held a dependency near its release',
    );
    assert.ok(
      inFlightAtCrash.every((n) => n > 0),
      'every crash came with a release in flight',
    );
  },
);
