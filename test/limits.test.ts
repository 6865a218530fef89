/**
 * Cluster-wide limits (Inspector.setQueueLimits): concurrency, per-key
 * concurrency and rate, enforced by the claim. Four server processes claim
 * at once while the test samples the active tasks from SQL; the bound must
 * never be exceeded. Then the fairness of the key limit: one tenant's backlog
 * of 100,000 tasks does not hold another tenant's task back.
 */
import assert from 'node:assert/strict';
import { after, afterEach, before, describe } from 'node:test';
import { InvalidOptionError, Task, ValidationError } from '../src/index.js';
import { caught, exited, setupDb, spawnFixture, test, waitFor, type Fixture } from './helpers.js';

const { db, client, inspector, startServer } = setupDb('t_limits');

const NONE = { concurrency: null, keyConcurrency: null, rateLimit: null };

describe('setQueueLimits', () => {
  test('set, shown by getQueueInfo, replaced, cleared by null, by omission and by {}', async () => {
    await client.enqueue(new Task('t', null, { queue: 'lim' }));
    assert.deepEqual((await inspector.getQueueInfo('lim')).limits, NONE);
    await inspector.setQueueLimits('lim', { concurrency: 5, keyConcurrency: 2, rateLimit: { limit: 100, interval: 1000 } });
    assert.deepEqual((await inspector.getQueueInfo('lim')).limits, { concurrency: 5, keyConcurrency: 2, rateLimit: { limit: 100, interval: 1000 } });
    await inspector.setQueueLimits('lim', { concurrency: 7, keyConcurrency: null });
    assert.deepEqual((await inspector.getQueueInfo('lim')).limits, { concurrency: 7, keyConcurrency: null, rateLimit: null });
    await inspector.setQueueLimits('lim', {});
    assert.deepEqual((await inspector.getQueueInfo('lim')).limits, NONE);
  });

  test('bad limits are ValidationErrors naming the field, and change nothing; a queue not known yet is made known', async () => {
    await client.enqueue(new Task('t', null, { queue: 'lim2' }));
    await inspector.setQueueLimits('lim2', { concurrency: 3 });
    const bad: [unknown, string][] = [
      [{ concurrency: 0 }, 'concurrency'],
      [{ concurrency: -1 }, 'concurrency'],
      [{ concurrency: 1.5 }, 'concurrency'],
      [{ concurrency: '2' }, 'concurrency'],
      [{ concurrency: 2 ** 31 }, 'concurrency'],
      [{ keyConcurrency: 0 }, 'keyConcurrency'],
      [{ rateLimit: { limit: 0, interval: 1000 } }, 'rateLimit.limit'],
      [{ rateLimit: { limit: 10, interval: 0 } }, 'rateLimit.interval'],
      [{ rateLimit: { limit: 10 } }, 'rateLimit.interval'],
      [{ rateLimit: { limit: 10, interval: 2.5 } }, 'rateLimit.interval'],
      [{ rateLimit: 10 }, 'rateLimit'],
      [{ rateLimit: { limit: 10, interval: 100, burst: 3 } }, 'rateLimit.burst'],
      [{ concurency: 3 }, 'limits.concurency'],
      [null, 'limits'],
      ['5', 'limits'],
    ];
    for (const [limits, field] of bad) {
      const err = await caught(() => inspector.setQueueLimits('lim2', limits as never));
      assert.ok(err instanceof ValidationError, `${JSON.stringify(limits)}: ${String(err)}`);
      assert.ok(err instanceof InvalidOptionError);
      assert.equal(err.field, field, JSON.stringify(limits));
    }
    assert.deepEqual((await inspector.getQueueInfo('lim2')).limits, { ...NONE, concurrency: 3 }, 'unchanged');
    // A queue not known yet is made known with its limits (issue #27); queues-known.test.ts has the rest.
    await inspector.setQueueLimits('not-yet-known', { concurrency: 1 });
    assert.deepEqual((await inspector.getQueueInfo('not-yet-known')).limits, { ...NONE, concurrency: 1 });
    assert.ok((await caught(() => inspector.setQueueLimits('bad queue', { concurrency: 1 }))) instanceof ValidationError);
  });
});

/**
 * Samples the active tasks of `queue`, as fast as the database answers, until
 * `done()`: the most active at once, the most active with one key, and the
 * servers seen holding them.
 */
async function sampleActive(queue: string, done: () => Promise<boolean>): Promise<{ max: number; maxPerKey: number; owners: number; samples: number }> {
  let max = 0;
  let maxPerKey = 0;
  const owners = new Set<string>();
  let samples = 0;
  for (;;) {
    const rows = await db.query<{ owner: string; key: string | null }>(
      `SELECT lease_owner AS owner, concurrency_key AS key FROM {{schema}}.task_states WHERE queue = $1 AND state = 'active'`,
      [queue],
    );
    samples++;
    max = Math.max(max, rows.length);
    const perKey = new Map<string | null, number>();
    for (const r of rows) {
      owners.add(r.owner);
      perKey.set(r.key, (perKey.get(r.key) ?? 0) + 1);
    }
    for (const n of perKey.values()) maxPerKey = Math.max(maxPerKey, n);
    if (samples % 20 === 0 && (await done())) return { max, maxPerKey, owners: owners.size, samples };
  }
}

const left = (queue: string) => async () =>
  (await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM {{schema}}.task_states WHERE queue = $1 AND state <> 'completed'`, [queue]))[0]!.n === 0;

describe('four servers at once', () => {
  const workers: Fixture[] = [];

  before(async () => {
    // The limits before any task: each server's first claim already sees them.
    for (const queue of ['conc', 'keyed', 'rated']) await db.query(`INSERT INTO {{schema}}.queues (name) VALUES ($1)`, [queue]);
    await inspector.setQueueLimits('conc', { concurrency: 3 });
    await inspector.setQueueLimits('keyed', { keyConcurrency: 2 });
    await inspector.setQueueLimits('rated', { rateLimit: { limit: 5, interval: 400 } });
    // Two slots each and nothing held ahead: while one server runs two tasks the limit's
    // third is another's, so the limit reached is one held across servers. (With more slots
    // than the limit, the server whose tasks end first took every freed slot before the
    // others' next look, and the test could see one server alone.)
    const env = { DATABASE_URL: db.connectionString, SCHEMA: db.schema, QUEUES: 'conc,keyed,rated', CONCURRENCY: '2', PREFETCH: '0' };
    for (let i = 0; i < 4; i++) workers.push(spawnFixture('test/fixtures/limits-worker.ts', env));
    await Promise.all(workers.map((w) => w.next('ready')));
  });

  after(async () => {
    for (const w of workers) w.child.kill('SIGTERM');
    await Promise.all(workers.map((w) => exited(w.child)));
  });

  test('concurrency 3: never more than 3 active across the 4 servers (8 slots), and every task runs', { timeout: 120_000 }, async () => {
    await client.enqueueMany(Array.from({ length: 90 }, () => new Task('t', { ms: 15 }, { queue: 'conc', retention: 600_000 })));
    const { max, owners, samples } = await sampleActive('conc', left('conc'));
    console.log(`concurrency limit 3: sampled max active ${max} over ${samples} samples, ${owners} servers`);
    assert.ok(max <= 3, `at most 3 active (saw ${max})`);
    assert.equal(max, 3, 'the limit is reached: the servers want more than it allows');
    assert.ok(owners >= 2, `several servers took part (${owners})`);
    assert.equal((await inspector.getQueueInfo('conc')).completed, 90);
  });

  test('keyConcurrency 2: never more than 2 active per key, keys side by side', { timeout: 120_000 }, async () => {
    const keys = ['k0', 'k1', 'k2', 'k3', 'k4'];
    await client.enqueueMany(
      Array.from({ length: 100 }, (_, i) => new Task('t', { ms: 15 }, { queue: 'keyed', concurrencyKey: keys[i % keys.length], retention: 600_000 })),
    );
    const { max, maxPerKey, samples } = await sampleActive('keyed', left('keyed'));
    console.log(`key concurrency limit 2: sampled max active per key ${maxPerKey}, in all ${max}, over ${samples} samples`);
    assert.ok(maxPerKey <= 2, `at most 2 active per key (saw ${maxPerKey})`);
    assert.equal(maxPerKey, 2);
    assert.ok(max > 2, 'keys run side by side');
    assert.equal((await inspector.getQueueInfo('keyed')).completed, 100);
  });

  test('rate 5 per 400 ms: no span of 400 ms holds more than 5 starts', { timeout: 120_000 }, async () => {
    await client.enqueueMany(Array.from({ length: 30 }, () => new Task('t', { ms: 1 }, { queue: 'rated', retention: 600_000 })));
    await waitFor(left('rated'), 60_000, 'the rated tasks');
    const starts = (
      await db.query<{ at: number }>(
        `SELECT (extract(epoch FROM started_at) * 1000)::float8 AS at FROM {{schema}}.task_states WHERE queue = 'rated' ORDER BY started_at`,
      )
    ).map((r) => r.at);
    assert.equal(starts.length, 30);
    // Any 6 consecutive starts span at least the interval; equivalently no window holds 6.
    let tightest = Number.POSITIVE_INFINITY;
    for (let i = 0; i + 5 < starts.length; i++) tightest = Math.min(tightest, starts[i + 5]! - starts[i]!);
    let most = 0;
    for (let i = 0; i < starts.length; i++) most = Math.max(most, starts.filter((t) => t >= starts[i]! && t < starts[i]! + 400).length);
    console.log(`rate limit 5/400 ms: most starts in any 400 ms ${most}; 6 starts spanned at least ${tightest.toFixed(1)} ms`);
    assert.ok(most <= 5, `at most 5 starts in any 400 ms (saw ${most})`);
    assert.equal(most, 5, 'the limit is reached');
    // 30 starts at 5 per 400 ms take at least 5 windows.
    assert.ok(starts.at(-1)! - starts[0]! >= 5 * 400, 'the starts are spread over the windows');
  });
});

describe('a running server', () => {
  test('limits set, changed and cleared while it runs take effect at its next claim', { timeout: 60_000 }, async () => {
    await db.query(`INSERT INTO {{schema}}.queues (name) VALUES ('live')`);
    let release = () => {};
    let gate = Promise.resolve();
    await startServer(
      async (task) => {
        if (task.type === 'gated') await gate;
        else await new Promise((r) => setTimeout(r, 10));
      },
      { concurrency: 4, queues: { live: 1 }, taskCheckInterval: 50 },
    );
    await inspector.setQueueLimits('live', { concurrency: 1 });
    await client.enqueueMany(Array.from({ length: 20 }, () => new Task('short', null, { queue: 'live' })));
    const limited = await sampleActive('live', left('live'));
    assert.equal(limited.max, 1, `one at a time (saw ${limited.max})`);
    // Raised to 2, then cleared: each time the tasks held at the gate fill what is allowed.
    gate = new Promise((resolve) => (release = resolve));
    await inspector.setQueueLimits('live', { concurrency: 2 });
    await client.enqueueMany(Array.from({ length: 8 }, () => new Task('gated', null, { queue: 'live' })));
    const active = async () =>
      (await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM {{schema}}.task_states WHERE queue = 'live' AND state = 'active'`))[0]!.n;
    await waitFor(async () => (await active()) === 2, 10_000, 'two active');
    await inspector.setQueueLimits('live', {});
    // Four run and the server holds more ahead of its slots (prefetch): all are active.
    await waitFor(async () => (await active()) >= 4, 10_000, 'more than two active once the limit is gone');
    release();
    await waitFor(left('live'), 20_000, 'every task');
  });
});

describe('fairness of the key limit', () => {
  let release = () => {};
  // Before the file's afterEach shuts the servers down: their handlers wait for it.
  afterEach(() => release());

  test("one tenant's backlog of 100,000 does not hold another tenant's task back", { timeout: 180_000 }, async () => {
    await db.query(`INSERT INTO {{schema}}.queues (name) VALUES ('tenants')`);
    await inspector.setQueueLimits('tenants', { keyConcurrency: 2 });
    for (let i = 0; i < 100_000; i += 10_000) {
      await client.enqueueMany(Array.from({ length: 10_000 }, () => new Task('big', null, { queue: 'tenants', concurrencyKey: 'big-tenant' })));
    }
    const gate = new Promise<void>((resolve) => (release = resolve));
    const started: string[] = [];
    await startServer(
      async (task) => {
        started.push(task.type);
        // The big tenant's tasks hold their slots: only the other tenant's can still start.
        if (task.type === 'big') await gate;
      },
      { concurrency: 4, queues: { tenants: 1 }, taskCheckInterval: 50 },
    );
    await waitFor(() => started.length >= 2, 20_000, "the big tenant's first two tasks");
    await client.enqueue(new Task('small', null, { queue: 'tenants', concurrencyKey: 'small-tenant' }));
    await waitFor(() => started.includes('small'), 20_000, "the small tenant's task, behind 99,998 of the big tenant's");
    const [big] = await db.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM {{schema}}.task_states WHERE queue = 'tenants' AND state = 'active' AND concurrency_key = 'big-tenant'`,
    );
    assert.equal(big!.n, 2, 'the big tenant held to its 2');
    assert.equal(started.filter((t) => t === 'big').length, 2);
  });
});
