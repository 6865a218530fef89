/**
 * F02b commit-reply-lost: the unknown commit outcome (plan §5.2).
 *
 * Injected: the workers' DATABASE_URL goes through commit-proxy.ts (their
 * oracle rows go direct, ORACLE_DATABASE_URL). The proxy reads the server's
 * replies and, with p = 0.05, drops the reply that ends a transaction which
 * completed a task, and resets the worker's socket instead of relaying it:
 *   - explicit: the CommandComplete 'COMMIT' (and its ReadyForQuery 'I') of a
 *     ctx.transaction (`tx` tasks): the h_effects insert and the fenced
 *     completion commit together, the handler's ctx.transaction then throws;
 *   - implicit: the CommandComplete and ReadyForQuery 'I' of an autocommitted
 *     batched completion (`plain` tasks: the handler returned, the library
 *     completes the task in one statement, which has committed when its
 *     CommandComplete is sent).
 * "Completes a task" = the transaction ran the completion statement (it
 * calls complete_tasks(), which deletes a task or marks it completed) and it changed rows (a retried
 * completion that the token fenced off, `SELECT 0`, is relayed: it committed
 * nothing); claims, heartbeats, retries and every other statement are relayed
 * untouched. The server has committed (the completion's transaction commits
 * with synchronous_commit on); only the worker does not know. The tasks in
 * doubt are read from each cut statement's parameters (the batch's seqs).
 *
 * Must hold:
 *   - no second effect (I2: dup_effects 0) and no second execution of a task
 *     whose completion committed: spurious_retries 0 (a cut task ran once,
 *     retried = 0); with nothing else injected, no task ran twice at all;
 *   - nothing lost, all completed (I1); I3–I6;
 *   - an explicit cut is invisible to its handler: ctx.transaction asks
 *     PostgreSQL what became of its transaction (txid_status), finds it
 *     committed and returns (no txFailed event for that attempt), and the
 *     worker logs "the COMMIT's reply was lost; the transaction committed"
 *     once per cut;
 *   - the worker's later writes on an implicitly cut task are refused by the
 *     lease token and logged (a 'fenced write rejected' warning for that
 *     task, or 'lease lost; the outcome of this attempt is dropped'), never
 *     written as a retry ('task failed; will retry' must not appear for it).
 * Figures: ambiguous_commits (replies cut, explicit and implicit), the tasks
 * they left in doubt, dup_effects (0), spurious_retries (0).
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { startCommitProxy } from './commit-proxy.js';
import { sleep } from './harness.js';
import { faultTest, report } from './kit.js';

const MAX_RETRY = 3;
const P = 0.05;
const TX_TASKS = 400;
const PLAIN_TASKS = 300;
faultTest(
  `F02b commit-reply-lost: p = ${P} of completion replies cut; no second effect, no retry of a committed task`,
  { schema: 'f02b', timeout: 240_000 },
  async (h) => {
    const proxy = await startCommitProxy({ targetPort: h.cluster.port, p: P, match: /complete_tasks"?\(/ });
    h.defer(() => proxy.close());
    const env = { DATABASE_URL: proxy.url(h.connectionString), ORACLE_DATABASE_URL: h.connectionString, REPORT_EXEC: '1' };
    const workers = await h.spawnWorkers(3, { concurrency: 4, sleepMin: 50, sleepMax: 250, env });
    h.startSampler();
    const t0 = performance.now();
    const producers = await Promise.all([
      h.spawnProducer({ count: TX_TASKS, rate: 20, maxRetry: MAX_RETRY, scheduled: 0.1 }),
      h.spawnProducer({ count: PLAIN_TASKS, rate: 15, type: 'plain', maxRetry: MAX_RETRY }, 'producer-plain'),
    ]);
    await Promise.all(producers.map((p) => p.exited));
    await h.waitDrained(120_000);
    const wallS = Math.round((performance.now() - t0) / 1000);
    proxy.setP(0);
    await sleep(1500); // late fenced writes and their log lines, the last metrics lines
    await h.stopSampler();

    const c = await h.check({ maxRetry: MAX_RETRY });
    const cuts = [...proxy.cuts];
    const explicitCuts = cuts.filter((x) => x.kind === 'explicit').length;
    const implicitCuts = cuts.length - explicitCuts;

    // What the workers said and logged about each task.
    const txFailed = workers.flatMap((w) => w.events.filter((e) => e.event === 'txFailed'));
    const logs = workers.flatMap((w) =>
      readFileSync(join(h.logDir, `${w.name}.stderr.log`), 'utf8')
        .split('\n')
        .flatMap((l) => {
          try {
            return [JSON.parse(l) as { msg?: string; task?: { id?: string }; write?: string }];
          } catch {
            return [];
          }
        }),
    );
    const idsWith = (pred: (l: { msg?: string; write?: string }) => boolean) => new Set(logs.filter(pred).flatMap((l) => (l.task?.id ? [l.task.id] : [])));
    const fencedLogged = idsWith((l) => l.msg === 'fenced write rejected: the lease is no longer held');
    const lostLogged = idsWith((l) => l.msg === 'lease lost; the outcome of this attempt is dropped');
    const retryLogged = idsWith((l) => l.msg === 'task failed; will retry');
    const commitsResolved = logs.filter((l) => l.msg === "the COMMIT's reply was lost; the transaction committed").length;
    const completeRefused = idsWith((l) => l.msg === 'fenced write rejected: the lease is no longer held' && l.write === 'complete');

    // The tasks each cut left in doubt: a parameter of the completion statement is the batch's seqs ('{"12","15"}').
    const seqsOf = (params: (string | null)[]) =>
      (params.find((p) => p !== null && /^\{"?\d+"?(,"?\d+"?)*\}$/.test(p)) ?? '{}').slice(1, -1).replaceAll('"', '').split(',').filter(Boolean);
    const cutSeqs = cuts.map((x) => ({ kind: x.kind, seqs: seqsOf(x.params) }));
    const rows = await h.query<{ seq: string; id: string; type: string; state: string; retried: number; starts: number; effects: number }>(
      `SELECT t.seq::text, t.id, t.type, t.state, t.retried,
            (SELECT count(DISTINCT x.attempt)::int FROM {{schema}}.h_exec x WHERE x.task_id = t.id AND x.phase = 'start') AS starts,
            (SELECT count(*)::int FROM {{schema}}.h_effects e WHERE e.task_id = t.id) AS effects
     FROM {{schema}}.tasks t WHERE t.seq = ANY($1::bigint[])`,
      [cutSeqs.flatMap((x) => x.seqs)],
    );
    const inDoubt = rows.map((r) => r.id);
    const explicitTasks = rows.filter((r) => cutSeqs.some((x) => x.kind === 'explicit' && x.seqs.includes(r.seq))).map((r) => r.id);
    const implicitTasks = rows.filter((r) => cutSeqs.some((x) => x.kind === 'implicit' && x.seqs.includes(r.seq))).map((r) => r.id);
    // Explicit: a handler that saw ctx.transaction throw for an attempt whose effect committed (must be none).
    const committedAttempts = new Set(
      (
        await h.query<{ attempt: string }>('SELECT attempt::text FROM {{schema}}.h_effects WHERE attempt = ANY($1::uuid[])', [txFailed.map((e) => e.attempt)])
      ).map((r) => r.attempt),
    );
    const txFailedCommitted = new Set(txFailed.filter((e) => committedAttempts.has(e.attempt)).map((e) => e.taskId as string));
    const spuriousRetries = rows.filter((r) => r.starts > 1 || r.retried > 0).length;
    const notLogged = implicitTasks.filter((id) => !fencedLogged.has(id) && !lostLogged.has(id));
    const retriedAnyway = inDoubt.filter((id) => retryLogged.has(id));

    const fig = report(h, c, 'F02b commit-reply-lost', {
      ambiguous_commits: cuts.length,
      ambiguous_explicit: explicitCuts,
      ambiguous_implicit: implicitCuts,
      candidates: proxy.stats.candidates,
      tasks_in_doubt: inDoubt.length,
      tasks_in_doubt_explicit: explicitTasks.length,
      tasks_in_doubt_implicit: implicitTasks.length,
      tx_failed_but_committed: txFailedCommitted.size,
      commits_resolved: commitsResolved,
      complete_refused_logged: completeRefused.size,
      cuts: cuts.map((x) => ({ at: x.at, kind: x.kind, seqs: seqsOf(x.params) })),
      spurious_retries: spuriousRetries,
      in_doubt_not_logged: notLogged.length,
      in_doubt_written_as_retry: retriedAnyway.length,
      tx_failed_events: txFailed.length,
      tx_failed_errors: [...new Set(txFailed.map((e) => `${e.code ?? e.name}: ${String(e.message).slice(0, 80)}`))].slice(0, 6),
      proxy_connections: proxy.stats.connections,
      wall_s: wallS,
      notes:
        `3 workers x 4 through commit-proxy.ts (oracle direct); ${TX_TASKS} tx at 20/s + ${PLAIN_TASKS} plain at 15/s; p = ${P} of the replies ending a transaction that ran the completion ` +
        `(explicit COMMIT of ctx.transaction, or ReadyForQuery 'I' of the autocommitted batched completion) dropped and the client socket reset; ` +
        `spurious_retries = tasks in doubt that ran again or were retried (must be 0)`,
    });
    console.log(`figures ${JSON.stringify(fig)}`);
    assert.ok(explicitCuts >= 1, `explicit COMMIT replies were cut (${explicitCuts} of ${proxy.stats.candidates} candidates)`);
    assert.ok(implicitCuts >= 1, `implicit (autocommit) completion replies were cut (${implicitCuts})`);
    assert.ok(
      cutSeqs.every((x) => x.seqs.length >= 1),
      'every cut statement named the tasks it completed',
    );
    assert.equal(explicitTasks.length, explicitCuts, 'each cut COMMIT completed exactly one task (ctx.transaction completes its own)');
    assert.deepEqual([...txFailedCommitted], [], 'no ctx.transaction threw for a transaction that committed');
    assert.equal(commitsResolved, explicitCuts, 'each cut COMMIT was found committed by its id, and said so');
    assert.ok(implicitTasks.length >= implicitCuts, 'each cut batched completion completed at least one task');
    assert.equal(
      rows.length,
      cutSeqs.reduce((n, x) => n + x.seqs.length, 0),
      'every task in doubt exists, each in one cut',
    );
    for (const r of rows) {
      assert.equal(r.state, 'completed', `task ${r.id} in doubt is completed`);
      if (r.type === 'tx') assert.equal(r.effects, 1, `task ${r.id} in doubt has its effect once`);
    }
    assert.equal(spuriousRetries, 0, 'no task whose completion committed ran again or was retried');
    assert.deepEqual(notLogged, [], 'every later write on an implicitly cut task was refused and logged');
    assert.deepEqual(retriedAnyway, [], 'no task in doubt was written as a retry');
    assert.equal(c.dupExternal, 0, 'nothing else injected: no task ran twice');
    assert.equal(c.dupEffects, 0, 'no second effect');
    assert.equal(c.acked, TX_TASKS + PLAIN_TASKS, 'every task was acknowledged');
  },
);
