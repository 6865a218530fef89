/**
 * The `pgasynq` CLI's actions, run as users run them, and the rows they
 * change: task delete, archive, run, cancel, the bulk commands, queue pause
 * and rm; and the commands on a workflow's waiting tasks.
 */
import assert from 'node:assert/strict';
import { before, describe } from 'node:test';
import { Task, type TaskInfo } from '../src/index.js';
import { ACTIVE, ARCHIVED, RETRY, client, db, fails, force, inspector, json, ok, pgasynq, plain, put, setupCliAdmin, stateOf, test } from './cli-admin-kit.js';

setupCliAdmin('t_cli_admin_actions');

/** How many tasks of `queue` are in each state. */
const countsOf = async (queue: string) =>
  Object.fromEntries(
    (await db.query<{ state: string; n: number }>('SELECT state, count(*)::int AS n FROM {{schema}}.tasks WHERE queue = $1 GROUP BY state', [queue])).map(
      (r) => [r.state, r.n],
    ),
  );

// Each action on a queue of its own, so they run at once too.
describe('actions change the rows', { concurrency: true }, () => {
  before(async () => {
    for (const id of ['d1', 'd2', 'dact']) await put('del', id);
    await force('del', 'dact', ACTIVE('srv-x'));
    await put('arc', 'a1');
    await put('arc', 'a2', { processIn: 3_600_000 });
    for (const id of ['r1', 'r2']) await put('run', id);
    await force('run', 'r1', ARCHIVED);
    await force('run', 'r2', RETRY);
    for (const id of ['c1', 'c2']) await put('cancel', id);
    await force('cancel', 'c1', ACTIVE('srv-x'));
    for (const id of ['bd1', 'bd2', 'bd3']) await put('bdel', id);
    for (const id of ['bd4', 'bd5']) await put('bdel', id, { processIn: 3_600_000 });
    for (const id of ['ba1', 'ba2']) await put('barc', id);
    for (const id of ['ba1', 'ba2']) await force('barc', id, RETRY);
    for (const id of ['ba3', 'ba4']) await put('barc', id, { group: 'g1' });
    await put('barc', 'ba5', { group: 'g2' });
    for (const id of ['br1', 'br2']) await put('brun', id);
    for (const id of ['br1', 'br2']) await force('brun', id, ARCHIVED);
    await put('brun', 'br3', { processIn: 3_600_000 });
    await put('pq', 'x');
    await put('rq', 'x');
    await put('rq_empty', 'x');
    await inspector.deleteTask('rq_empty', 'x');
  });

  test('task delete: any state but active', async () => {
    const [human, asJson, active] = await Promise.all([
      pgasynq('task', 'delete', 'del', 'd1'),
      pgasynq('--json', 'task', 'rm', 'del', 'd2'),
      pgasynq('task', 'delete', 'del', 'dact'),
    ]);
    assert.equal(ok(human), 'task d1 in queue "del": deleted\n');
    assert.deepEqual(JSON.parse(ok(asJson)), { ok: true });
    fails(active, 1, /^error: cannot delete task in active state: id=dact, queue=del; use cancelProcessing instead\n$/);
    assert.deepEqual([await stateOf('del', 'd1'), await stateOf('del', 'd2'), await stateOf('del', 'dact')], ['gone', 'gone', 'active']);
  });

  test('task archive and task run', async () => {
    const [a1, a2, r1, r2] = await Promise.all([
      pgasynq('task', 'archive', 'arc', 'a1'),
      pgasynq('--json', 'task', 'archive', 'arc', 'a2'),
      pgasynq('task', 'run', 'run', 'r1'),
      pgasynq('--json', 'task', 'run', 'run', 'r2'),
    ]);
    assert.equal(ok(a1), 'task a1 in queue "arc": archived\n');
    assert.deepEqual(JSON.parse(ok(a2)), { ok: true });
    assert.equal(ok(r1), 'task r1 in queue "run": now pending\n');
    assert.deepEqual(JSON.parse(ok(r2)), { ok: true });
    assert.deepEqual(await countsOf('arc'), { archived: 2 });
    assert.deepEqual(await countsOf('run'), { pending: 2 });
  });

  test('task inspect ID held by several queues: 1, naming them and asking for the queue; task inspect QUEUE ID still works', async () => {
    await put('twin_a', 'twin');
    await put('twin_b', 'twin');
    const [both, one] = await Promise.all([pgasynq('task', 'inspect', 'twin'), json<TaskInfo>('task', 'inspect', 'twin_b', 'twin')]);
    fails(both, 1, /^error: 2 queues hold a task with id=twin \(twin_a, twin_b\): say which, with: pgasynq task inspect QUEUE twin\n$/);
    assert.equal(one.queue, 'twin_b');
  });

  test('task inspect: an instant no Date can show is "—"', async () => {
    await put('far', 'far');
    await force('far', 'far', "started_at = '10000-01-01T00:00:00Z'");
    assert.match(ok(await pgasynq('task', 'inspect', 'far')), /^started at:\s+—$/m);
  });

  test('task cancel: marks the active task; a task not running is a count of 0', async () => {
    const [running, idle] = await Promise.all([pgasynq('task', 'cancel', 'c1'), pgasynq('--json', 'task', 'cancel', 'c2')]);
    assert.equal(ok(running), 'cancellation requested for task c1\n');
    assert.deepEqual(JSON.parse(ok(idle)), { count: 0 });
    const rows = await db.query("SELECT id, cancel_requested FROM {{schema}}.tasks WHERE queue = 'cancel' ORDER BY id");
    assert.deepEqual(rows, [
      { id: 'c1', cancel_requested: true },
      { id: 'c2', cancel_requested: false },
    ]);
  });

  test('task deleteall, archiveall, runall: the count, and the rows moved', async () => {
    const [dHuman, dJson, aHuman, aJson, rHuman, rJson] = await Promise.all([
      pgasynq('task', 'deleteall', 'bdel', 'pending'),
      pgasynq('--json', 'task', 'deleteall', 'bdel', 'scheduled'),
      pgasynq('task', 'archiveall', 'barc', 'retry'),
      pgasynq('--json', 'task', 'archiveall', 'barc', 'aggregating', '--group', 'g1'),
      pgasynq('task', 'runall', 'brun', 'archived'),
      pgasynq('--json', 'task', 'runall', 'brun', 'scheduled'),
    ]);
    assert.equal(ok(dHuman), 'deleted 3 pending tasks from queue "bdel"\n');
    assert.deepEqual(JSON.parse(ok(dJson)), { count: 2 });
    assert.equal(ok(aHuman), 'archived 2 retry tasks of queue "barc"\n');
    assert.deepEqual(JSON.parse(ok(aJson)), { count: 2 });
    assert.equal(ok(rHuman), '2 archived tasks of queue "brun" are now pending\n');
    assert.deepEqual(JSON.parse(ok(rJson)), { count: 1 });
    assert.deepEqual(await countsOf('bdel'), {});
    assert.deepEqual(await countsOf('barc'), { archived: 4, aggregating: 1 }, 'the other group is untouched');
    assert.deepEqual(await countsOf('brun'), { pending: 3 });
  });

  test('queue pause and unpause', async () => {
    assert.equal(ok(await pgasynq('queue', 'pause', 'pq')), 'queue "pq" paused\n');
    assert.equal((await inspector.getQueueInfo('pq')).paused, true);
    assert.deepEqual(JSON.parse(ok(await pgasynq('--json', 'queue', 'unpause', 'pq'))), { ok: true });
    assert.equal((await inspector.getQueueInfo('pq')).paused, false);
  });

  test('queue rm: refused when not empty; --force deletes its tasks', async () => {
    const [refused, empty] = await Promise.all([pgasynq('queue', 'rm', 'rq'), pgasynq('queue', 'rm', 'rq_empty')]);
    fails(refused, 1, /^error: queue "rq" is not empty\n$/);
    assert.equal(ok(empty), 'queue "rq_empty" removed\n');
    assert.deepEqual(JSON.parse(ok(await pgasynq('--json', 'queue', 'rm', 'rq', '--force'))), { ok: true });
    const queues = await inspector.queues();
    assert.ok(!queues.includes('rq') && !queues.includes('rq_empty'), queues.join());
    assert.deepEqual(await countsOf('rq'), {});
  });
});

describe('workflows', () => {
  test('task ls --state waiting, task inspect naming dependencies, and the bulk commands on waiting tasks', async () => {
    await client.enqueueMany([
      new Task('job', null, { queue: 'flows', taskId: 'first' }),
      new Task('job', null, { queue: 'flows', taskId: 'second' }),
      new Task('job', null, { queue: 'flows', taskId: 'after', dependsOn: ['first', 'second'] }),
      new Task('job', null, { queue: 'flows', taskId: 'last', dependsOn: ['after'] }),
    ]);
    const [listed, text, inspected] = await Promise.all([
      json<TaskInfo[]>('task', 'ls', '-q', 'flows', '-s', 'waiting'),
      pgasynq('task', 'ls', '-q', 'flows', '-s', 'waiting'),
      pgasynq('task', 'inspect', 'flows', 'after'),
    ]);
    assert.deepEqual(listed, plain(await inspector.listWaitingTasks('flows')));
    assert.deepEqual(
      listed.map((t) => [t.id, t.waitingFor]),
      [
        ['after', 2],
        ['last', 1],
      ],
    );
    const lines = ok(text).trim().split('\n');
    assert.match(lines[0]!, /^id\s+type\s+payload\s+waiting for\s+depends on$/);
    assert.match(lines[2]!, /^after\s+job\s+-\s+2 of 2\s+flows\/first, flows\/second$/);
    assert.match(lines[3]!, /^last\s+job\s+-\s+1 of 1\s+flows\/after$/);
    assert.match(ok(inspected), /^state:\s+waiting$/m);
    assert.match(ok(inspected), /^depends on:\s+flows\/first, flows\/second$/m);
    assert.match(ok(inspected), /^waiting for:\s+2 of 2 dependencies$/m);
    // archiveall: 'after' fails 'last' in the same statement; whichever of the two the bulk update reaches
    // second has moved on by then and is not counted again.
    assert.match(ok(await pgasynq('task', 'archiveall', 'flows', 'waiting')), /^archived [12] waiting tasks? of queue "flows"\n$/);
    assert.deepEqual(await countsOf('flows'), { pending: 2, archived: 2 });
    assert.equal(ok(await pgasynq('task', 'deleteall', 'flows', 'archived')), 'deleted 2 archived tasks from queue "flows"\n');
    await client.enqueue(new Task('job', null, { queue: 'flows', taskId: 'again', dependsOn: ['first'] }));
    assert.equal(ok(await pgasynq('task', 'runall', 'flows', 'waiting')), '1 waiting task of queue "flows" is now pending\n');
    assert.deepEqual(await countsOf('flows'), { pending: 3 });
    await inspector.deleteQueue('flows', true);
  });
});
