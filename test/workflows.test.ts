/**
 * Workflows: tasks that wait for other tasks (dependsOn), released exactly
 * once by the transaction that finishes their last dependency, with the
 * results their dependencies wrote. Every release is counted (helpers.ts
 * countReleases), not inferred from final states. Races between worker
 * processes and kill -9: workflows-race.test.ts.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { InvalidOptionError, Scheduler, SkipRetry, Task, TaskNotFoundError, ValidationError, type EnqueueOptions } from '../src/index.js';
import { caught, countReleases, deferred, setupDb, test, waitFor } from './helpers.js';

/** How many times each task left `waiting`, by id (helpers.ts countReleases). */
let releases: () => Promise<Record<string, string[]>>;
const { db, client, inspector, running, startServer } = setupDb('t_workflows', {
  setup: async (db) => (releases = await countReleases(db)),
  resetEach: true,
  tables: { also: ['t_releases'] },
  server: { concurrency: 4, taskCheckInterval: 50, delayedTaskCheckInterval: 50, recoverInterval: 100, retryDelay: () => 50 },
});

const stateOf = async (id: string, queue = 'default') => (await inspector.getTaskInfo(queue, id)).state;
const rowCount = async () => (await db.query<{ n: number }>('SELECT count(*)::int AS n FROM {{schema}}.task_inputs'))[0]!.n;
const edgeCount = async () => (await db.query<{ n: number }>('SELECT count(*)::int AS n FROM {{schema}}.task_dependencies'))[0]!.n;

const t = (id: string, opts: EnqueueOptions = {}, payload: unknown = null) => new Task('step', payload, { taskId: id, ...opts });

describe('enqueueing a graph', () => {
  test('a whole graph in one enqueueMany: waiting tasks, their dependencies and counts everywhere', async () => {
    const infos = await client.enqueueMany([
      t('a'),
      t('b'),
      t('c', { dependsOn: ['a', 'b'] }),
      t('d', { dependsOn: ['c', { queue: 'other', id: 'x' }] }),
      t('x', { queue: 'other' }),
    ]);
    assert.deepEqual(
      infos.map((i) => [i.id, i.state, i.waitingFor]),
      [
        ['a', 'pending', 0],
        ['b', 'pending', 0],
        ['c', 'waiting', 2],
        ['d', 'waiting', 2],
        ['x', 'pending', 0],
      ],
    );
    const d = await inspector.getTaskInfo('default', 'd');
    assert.equal(d.state, 'waiting');
    assert.equal(d.waitingFor, 2);
    assert.deepEqual(d.dependsOn.map((r) => `${r.queue}/${r.id}`).sort(), ['default/c', 'other/x']);
    assert.deepEqual((await inspector.getTaskInfo('default', 'a')).dependsOn, []);
    assert.deepEqual(
      (await inspector.listWaitingTasks('default')).map((w) => w.id),
      ['c', 'd'],
    );
    const info = await inspector.getQueueInfo('default');
    assert.equal(info.waiting, 2);
    assert.equal(info.pending, 2);
    assert.equal(info.size, 4);
    const [stats] = await db.query("SELECT waiting::int, size::int FROM {{schema}}.queue_stats WHERE queue = 'default'");
    assert.deepEqual(stats, { waiting: 2, size: 4 });
  });

  test('a cycle is a ValidationError naming it, and nothing is written', async () => {
    const err = await caught(() => client.enqueueMany([t('free'), t('a', { dependsOn: ['c'] }), t('b', { dependsOn: ['a'] }), t('c', { dependsOn: ['b'] })]));
    assert.ok(err instanceof ValidationError, String(err));
    assert.equal(err.field, 'dependsOn');
    assert.match(err.message, /cycle: default\/(a|b|c) → default\/(a|b|c) → default\/(a|b|c) → default\/\1/);
    assert.equal(await rowCount(), 0);
  });

  test('a dependency that does not exist is TaskNotFoundError, and nothing of the call is written', async () => {
    await client.enqueue(t('exists'));
    const err = await caught(() => client.enqueueMany([t('n1'), t('n2', { dependsOn: ['exists', { queue: 'elsewhere', id: 'ghost' }] })]));
    assert.ok(err instanceof TaskNotFoundError, String(err));
    assert.equal(err.queue, 'elsewhere');
    assert.equal(err.taskId, 'ghost');
    assert.equal(await rowCount(), 1);
    assert.equal(await edgeCount(), 0);
    const [exists] = await db.query("SELECT has_dependents FROM {{schema}}.task_states s JOIN {{schema}}.task_inputs i USING (seq) WHERE i.id = 'exists'");
    assert.equal(exists.has_dependents, false, 'the lock on the dependency wrote nothing');
  });

  test('inside the caller’s transaction: a refusal leaves the transaction usable and nothing written', async () => {
    const conn = await db.pool.connect();
    try {
      await conn.query('BEGIN');
      const err = await caught(() => client.enqueue(t('n', { dependsOn: ['ghost'] }), { tx: conn }));
      assert.ok(err instanceof TaskNotFoundError);
      await client.enqueueMany([t('p'), t('q', { dependsOn: ['p'] })], { tx: conn });
      await conn.query('COMMIT');
    } finally {
      conn.release();
    }
    assert.equal(await stateOf('q'), 'waiting');
    assert.equal(await rowCount(), 2);
  });

  const bad: [string, EnqueueOptions, RegExp][] = [
    ['not an array', { dependsOn: 'a' as never }, /^dependsOn must be an array/],
    ['a bad id', { dependsOn: ['../x'] }, /^dependsOn\[0\]/],
    ['a bad queue', { dependsOn: [{ queue: 'no spaces', id: 'x' }] }, /^dependsOn\[0\]\.queue/],
    ['an unknown key', { dependsOn: [{ queue: 'q', id: 'x', extra: 1 } as never] }, /^dependsOn\[0\].*extra/],
    ['a number', { dependsOn: [7 as never] }, /^dependsOn\[0\]/],
    ['too many', { dependsOn: Array.from({ length: 10_001 }, (_, i) => `d${i}`) }, /at most 10000/],
    ['itself', { taskId: 'me', dependsOn: ['me'] }, /itself \(default\/me\)/],
    ['with a group', { dependsOn: ['a'], group: 'g' }, /cannot be combined with group/],
    ['a bad policy', { dependsOn: ['a'], onDependencyFailure: 'skip' as never }, /^onDependencyFailure must be 'archive' or 'run'/],
  ];
  for (const [what, opts, message] of bad) {
    test(`refuses dependsOn ${what} with a ValidationError naming the field`, async () => {
      await client.enqueue(t('a'));
      const err = await caught(() => client.enqueue(new Task('step'), opts));
      assert.ok(err instanceof ValidationError, String(err));
      assert.match(err.message, message);
      assert.equal(await rowCount(), 1);
    });
  }

  test('a periodic task cannot have dependencies', async () => {
    const scheduler = new Scheduler({ connectionString: db.connectionString, schema: db.schema, logger: false });
    try {
      const err = await caught(() => scheduler.register('@every 1m', t('tick', { dependsOn: ['a'] })));
      assert.ok(err instanceof InvalidOptionError, String(err));
      assert.match(err.message, /^dependsOn cannot be set on a periodic task/);
    } finally {
      await scheduler.shutdown();
    }
  });

  test('a stored dependency in a group is refused: grouped tasks are merged', async () => {
    await client.enqueue(t('member'), { group: 'g' });
    const err = await caught(() => client.enqueue(t('after', { dependsOn: ['member'] })));
    assert.ok(err instanceof InvalidOptionError, String(err));
    assert.match(err.message, /default\/member, which belongs to a group/);
    assert.equal(await rowCount(), 1);
  });

  test('a dependency already completed counts as done, with its result; one already archived fails the dependent', async () => {
    await client.enqueueMany([t('kept', { retention: 3_600_000 }), t('doomed', { maxRetry: 0 })]);
    await startServer(async (_task, ctx) => {
      if (ctx.taskId === 'doomed') throw new Error('no');
      await ctx.writeResult({ from: ctx.taskId });
    });
    await waitFor(async () => (await stateOf('kept')) === 'completed' && (await stateOf('doomed')) === 'archived', 10_000, 'both finished');
    await Promise.all(running.splice(0).map((s) => s.shutdown()));
    const [done, failed, runs] = await client.enqueueMany([
      t('after-kept', { dependsOn: ['kept'] }),
      t('after-doomed', { dependsOn: ['doomed'] }),
      t('runs-anyway', { dependsOn: ['doomed', 'kept'], onDependencyFailure: 'run' }),
    ]);
    assert.equal(done!.state, 'pending');
    assert.equal(failed!.state, 'archived');
    assert.equal(failed!.lastError, 'dependency default/doomed failed');
    assert.equal(runs!.state, 'pending');
    assert.equal((await inspector.getTaskInfo('default', 'after-doomed')).lastError, 'dependency default/doomed failed');
    const results = new Map<string, Map<string, unknown>>();
    await startServer(async (_task, ctx) => void results.set(ctx.taskId, await ctx.dependencyResults()));
    await waitFor(() => results.size === 2, 10_000, 'both released tasks ran');
    assert.deepEqual(Object.fromEntries(results.get('after-kept')!), { 'default/kept': { from: 'kept' } });
    assert.deepEqual(Object.fromEntries(results.get('runs-anyway')!), { 'default/kept': { from: 'kept' } }, 'a failed dependency is not in the map');
  });

  test('a dependency in a later enqueue, still running: the dependent waits for it', async () => {
    await client.enqueue(t('first'));
    const info = await client.enqueue(t('second', { dependsOn: ['first'] }));
    assert.equal(info.state, 'waiting');
    const ran: string[] = [];
    await startServer((_task, ctx) => void ran.push(ctx.taskId));
    await waitFor(() => ran.length === 2, 10_000, 'both ran');
    assert.deepEqual(ran, ['first', 'second']);
    assert.deepEqual(await releases(), { second: ['pending'] });
  });
});

describe('release', () => {
  test('fan-out and fan-in: each task runs after all it depends on, once, with their results', { timeout: 30_000 }, async () => {
    const parts = Array.from({ length: 20 }, (_, i) => t(`part-${i}`, {}, { n: i }));
    await client.enqueueMany([
      t('split'),
      ...parts.map((p) => new Task(p.type, p.payload, { ...p.options, dependsOn: ['split'] })),
      t('combine', { dependsOn: parts.map((p) => p.options.taskId!) }),
    ]);
    const ran: string[] = [];
    let combined: Map<string, unknown> | undefined;
    await startServer(
      async (task, ctx) => {
        ran.push(ctx.taskId);
        if (ctx.taskId.startsWith('part-')) await ctx.writeResult((task.payload as { n: number }).n * 2);
        if (ctx.taskId === 'combine') combined = await ctx.dependencyResults();
      },
      { concurrency: 8 },
    );
    await waitFor(() => combined, 20_000, 'combine ran and read its results');
    assert.equal(ran[0], 'split');
    assert.equal(ran.at(-1), 'combine');
    assert.equal(ran.length, 22);
    assert.equal(combined!.size, 20);
    assert.equal(
      [...combined!.values()].reduce((a: number, b) => a + (b as number), 0),
      2 * ((19 * 20) / 2),
    );
    const counted = await releases();
    assert.equal(Object.keys(counted).length, 21);
    for (const [id, states] of Object.entries(counted)) assert.deepEqual(states, ['pending'], id);
    // Edges go with their dependents: once combine's completion is written.
    await waitFor(async () => (await edgeCount()) === 0, 10_000, 'no edge left');
  });

  test('a processAt later than the release: the dependent becomes scheduled, and runs when due', { timeout: 30_000 }, async () => {
    const enqueuedAt = Date.now();
    await client.enqueueMany([t('now'), t('later', { dependsOn: ['now'], processIn: 1500 })]);
    const ran = new Map<string, number>();
    await startServer((_task, ctx) => void ran.set(ctx.taskId, Date.now()));
    await waitFor(() => ran.has('later'), 10_000, 'the dependent ran');
    // The release trigger records the state it released to (polling for 'scheduled' raced the run on a loaded machine).
    assert.deepEqual(await releases(), { later: ['scheduled'] });
    assert.ok(ran.get('now')! <= ran.get('later')!, 'the dependency ran first');
    assert.ok(ran.get('later')! - enqueuedAt >= 1450, `the dependent ran when due (${ran.get('later')! - enqueuedAt} ms after the enqueue)`);
  });

  test('through ctx.transaction: released by its commit, not before, and not at all when it rolls back', { timeout: 30_000 }, async () => {
    await client.enqueueMany([t('dep'), t('waiter', { dependsOn: ['dep'] })]);
    const inside = deferred<string>();
    const go = deferred();
    let attempts = 0;
    await startServer(async (_task, ctx) => {
      if (ctx.taskId !== 'dep') return;
      attempts++;
      await ctx.transaction(async (trx) => {
        await trx.selectNoFrom((eb) => eb.val(1).as('one')).execute();
        inside.resolve(await stateOf('waiter'));
        await go.promise;
        if (attempts === 1) throw new Error('roll back the first time');
      });
    });
    assert.equal(await inside.promise, 'waiting', 'not released while the transaction is open');
    go.resolve();
    await waitFor(() => attempts === 2, 10_000, 'the second attempt');
    await waitFor(async () => (await releases()).waiter !== undefined, 10_000, 'released');
    assert.deepEqual(await releases(), { waiter: ['pending'] });
  });

  test('a dependency retried by the recoverer still counts once', { timeout: 30_000 }, async () => {
    await client.enqueueMany([t('dep'), t('waiter', { dependsOn: ['dep'] })]);
    // As a worker that died holding it would leave it: active, its lease long expired.
    await db.query(`UPDATE {{schema}}.tasks SET state = 'active', lease_owner = 'gone', lease_token = gen_random_uuid(),
                      lease_expires_at = now() - interval '1 hour', started_at = now() - interval '1 hour' WHERE id = 'dep'`);
    const ran: string[] = [];
    await startServer((_task, ctx) => void ran.push(`${ctx.taskId}:${ctx.retryCount}`), { recoverInterval: 50 });
    await waitFor(() => ran.includes('waiter:0'), 10_000, 'the waiter ran');
    assert.deepEqual(ran, ['dep:1', 'waiter:0']);
    assert.deepEqual(await releases(), { waiter: ['pending'] });
  });
});

describe('failure', () => {
  test('SkipRetry archives the dependency; archive dependents follow transitively, run dependents are released', { timeout: 30_000 }, async () => {
    await client.enqueueMany([
      t('root'),
      t('child', { dependsOn: ['root'] }),
      t('grandchild', { dependsOn: ['child'] }),
      t('tolerant', { dependsOn: ['root'], onDependencyFailure: 'run' }),
      t('after-tolerant', { dependsOn: ['tolerant'] }),
    ]);
    const ran: string[] = [];
    await startServer((_task, ctx) => {
      ran.push(ctx.taskId);
      if (ctx.taskId === 'root') throw new SkipRetry('bad input');
    });
    await waitFor(() => ran.includes('after-tolerant'), 10_000, 'the tolerant branch ran');
    assert.deepEqual(ran, ['root', 'tolerant', 'after-tolerant']);
    const child = await inspector.getTaskInfo('default', 'child');
    assert.equal(child.state, 'archived');
    assert.equal(child.lastError, 'dependency default/root failed');
    const grandchild = await inspector.getTaskInfo('default', 'grandchild');
    assert.equal(grandchild.state, 'archived');
    assert.equal(grandchild.lastError, 'dependency default/child failed');
    assert.deepEqual(await releases(), { child: ['archived'], grandchild: ['archived'], tolerant: ['pending'], 'after-tolerant': ['pending'] });
  });

  test('retries spent archive the dependents', { timeout: 30_000 }, async () => {
    await client.enqueueMany([t('flaky', { maxRetry: 1 }), t('waiter', { dependsOn: ['flaky'] })]);
    await startServer(() => {
      throw new Error('always');
    });
    await waitFor(async () => (await stateOf('waiter')) === 'archived', 10_000, 'the waiter archived');
    assert.equal((await inspector.getTaskInfo('default', 'flaky')).retried, 1);
  });

  test('archiveTask and deleteTask on a dependency fail its dependents; on a waiting task, leave its dependencies alone', async () => {
    await client.enqueueMany([
      t('a'),
      t('b'),
      t('after-a', { dependsOn: ['a'] }),
      t('after-b', { dependsOn: ['b'], onDependencyFailure: 'run' }),
      t('last', { dependsOn: ['after-a', 'after-b'] }),
    ]);
    await inspector.archiveTask('default', 'a');
    assert.equal(await stateOf('after-a'), 'archived');
    assert.equal(await stateOf('last'), 'archived', 'transitively');
    await inspector.deleteTask('default', 'b');
    assert.equal(await stateOf('after-b'), 'pending', "'run': released as if b had completed");
    assert.deepEqual(await releases(), { 'after-a': ['archived'], last: ['archived'], 'after-b': ['pending'] });
    // Deleting a dependent takes its edges with it.
    await client.enqueueMany([t('c'), t('after-c', { dependsOn: ['c'] })]);
    const before = await edgeCount();
    await inspector.deleteTask('default', 'after-c');
    assert.equal(await edgeCount(), before - 1);
    assert.equal(await stateOf('c'), 'pending');
  });

  test('runTask on an archived dependency: its dependents were settled once, and are not again', { timeout: 30_000 }, async () => {
    await client.enqueueMany([t('dep', { maxRetry: 0 }), t('tolerant', { dependsOn: ['dep'], onDependencyFailure: 'run' })]);
    let fail = true;
    const ran: string[] = [];
    await startServer((_task, ctx) => {
      ran.push(ctx.taskId);
      if (ctx.taskId === 'dep' && fail) throw new Error('first time');
    });
    await waitFor(() => ran.includes('tolerant'), 10_000, 'the tolerant dependent ran');
    fail = false;
    await inspector.runTask('default', 'dep');
    await waitFor(() => ran.filter((r) => r === 'dep').length === 2, 10_000, 'the dependency ran again');
    // Any second release would be written by the completion: wait until it deleted the task.
    const gone = () =>
      inspector.getTaskInfo('default', 'dep').then(
        () => false,
        (err: unknown) => err instanceof TaskNotFoundError,
      );
    await waitFor(gone, 10_000, 'dep completed');
    assert.deepEqual(await releases(), { tolerant: ['pending'] });
    assert.equal(ran.filter((r) => r === 'tolerant').length, 1);
  });

  test('runTask and runAllWaitingTasks run a waiting task without its dependencies; its later settling changes nothing', async () => {
    await client.enqueueMany([t('slow'), t('w1', { dependsOn: ['slow'] }), t('w2', { dependsOn: ['slow'] })]);
    await inspector.runTask('default', 'w1');
    assert.equal(await stateOf('w1'), 'pending');
    assert.equal(await inspector.runAllWaitingTasks('default'), 1);
    assert.equal(await stateOf('w2'), 'pending');
    await inspector.archiveTask('default', 'slow');
    assert.equal(await stateOf('w1'), 'pending');
    assert.equal(await inspector.archiveAllWaitingTasks('default'), 0);
    await client.enqueueMany([t('w3', { dependsOn: ['w1'] })]);
    assert.equal(await inspector.deleteAllWaitingTasks('default'), 1);
  });

  test('deleteQueue with force: dependents in other queues count the deleted tasks as failed', async () => {
    await client.enqueue(t('doomed', { queue: 'gone' }));
    await client.enqueue(t('elsewhere', { dependsOn: [{ queue: 'gone', id: 'doomed' }] }));
    await inspector.deleteQueue('gone', true);
    const info = await inspector.getTaskInfo('default', 'elsewhere');
    assert.equal(info.state, 'archived');
    assert.equal(info.lastError, 'dependency gone/doomed failed');
  });

  test('a chain of 2,000 fails from its head in one transaction, without deepening the stack', { timeout: 60_000 }, async () => {
    const n = 2000;
    await client.enqueueMany(Array.from({ length: n }, (_, i) => t(`link-${i}`, i === 0 ? {} : { dependsOn: [`link-${i - 1}`] })));
    await inspector.archiveTask('default', 'link-0');
    const [row] = await db.query("SELECT count(*)::int AS n FROM {{schema}}.task_states WHERE state = 'archived'");
    assert.equal(row.n, n);
  });
});
