/**
 * Inspector.watch() (migration 0013): the servers' events for a queue, in
 * order per task, sent only while a watcher is registered; the registration
 * ends with the watch; a notification that is not an event is ignored.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import pg from 'pg';
import { SkipRetry, Task, ValidationError, migrate, type TaskEvent } from '../src/index.js';
import { parseEvents } from '../src/inspector-following.js';
import { complete } from '../src/broker/leases.js';
import { eventWithoutTime } from '../src/model/following.js';
import { claim } from './broker-helpers.js';
import { deferred, setupDb, test, waitFor } from './helpers.js';

const { db, client, inspector, broker, startServer } = setupDb('t_watch', {
  resetEach: true,
  server: { concurrency: 2, queues: { watched: 1, other: 1 }, taskCheckInterval: 50, retryDelay: () => 0 },
});

/** Collects the events of one watch until `until` says stop; resolves with them. */
async function collect(opts: { queue?: string }, until: (events: TaskEvent[]) => boolean, started: () => void): Promise<TaskEvent[]> {
  const abort = new AbortController();
  const events: TaskEvent[] = [];
  const registered = waitFor(async () => (await db.query('SELECT count(*)::int AS n FROM {{schema}}.watchers'))[0].n > 0).then(started);
  for await (const e of inspector.watch({ ...opts, signal: abort.signal })) {
    events.push(e);
    if (until(events)) abort.abort();
  }
  await registered;
  return events;
}

describe('watch', () => {
  test('started, progress and completed of one task; failed then archived of another; only the watched queue', async () => {
    await startServer(async (task, ctx) => {
      if (task.type === 'fails') throw ctx.attempt === 1 ? new Error('first') : new SkipRetry('second');
      await ctx.progress(50);
    });
    const events = await collect(
      { queue: 'watched' },
      (es) => es.filter((e) => e.kind === 'completed' || e.kind === 'archived').length === 2,
      () => {
        void client.enqueue(new Task('other', null), { queue: 'other', taskId: 'o1' });
        void client.enqueue(new Task('ok', null), { queue: 'watched', taskId: 'w1' });
        void client.enqueue(new Task('fails', null), { queue: 'watched', taskId: 'w2', maxRetry: 3 });
      },
    );
    assert.ok(
      events.every((e) => e.queue === 'watched'),
      'nothing of the other queue',
    );
    const of = (id: string) => events.filter((e) => e.id === id).map((e) => [e.kind, e.attempt, e.error ?? e.progress ?? null]);
    assert.deepEqual(of('w1'), [
      ['started', 1, null],
      ['progress', 1, 50],
      ['completed', 1, null],
    ]);
    assert.deepEqual(of('w2'), [
      ['started', 1, null],
      ['failed', 1, 'first'],
      ['started', 2, null],
      ['archived', 2, 'second'],
    ]);
    assert.ok(events.every((e) => e.type !== undefined && e.at instanceof Date));
    await waitFor(async () => (await db.query('SELECT count(*)::int AS n FROM {{schema}}.watchers'))[0].n === 0, 20_000, 'the watch unregistered');
  });

  test('with no watcher the servers send no event', async () => {
    const listener = new pg.Client({ connectionString: db.connectionString });
    await listener.connect();
    const heard: string[] = [];
    listener.on('notification', (n) => heard.push(n.payload ?? ''));
    await listener.query(`LISTEN "${db.schema}_events"`);
    try {
      const done = deferred();
      await startServer(async () => done.resolve());
      await client.enqueue(new Task('t', null), { queue: 'watched' });
      await done.promise;
      await waitFor(async () => (await db.query('SELECT count(*)::int AS n FROM {{schema}}.tasks'))[0].n === 0);
      // A round trip on the listening connection delivers whatever was sent before it.
      await listener.query('SELECT 1');
      assert.deepEqual(heard, []);
    } finally {
      await listener.end();
    }
  });

  test('a notification carries an array of events; what is not an event is left out', async () => {
    // An event is an array since 0016, an object before it (a schema migrated down): both are read.
    const failed = { kind: 'failed', queue: 'q', id: 'i', type: 't', attempt: 2, at: '2026-01-01T00:00:00Z', error: 'e' };
    const asArray = ['failed', 'q', 'i', 't', 2, '2026-01-01T00:00:00Z', 'e', null];
    const started = ['started', 'q', 'j', 't', 1, '2026-01-01T00:00:01Z'];
    for (const bad of [
      '',
      'x',
      '[]',
      'null',
      '{}',
      JSON.stringify(failed),
      JSON.stringify(asArray),
      '[{"kind":"started"}]',
      '[null, 1, "x"]',
      '[[]]',
      '[["started"]]',
    ]) {
      assert.deepEqual(parseEvents(bad), [], bad);
    }
    const expected = { ...failed, at: new Date(failed.at) };
    assert.deepEqual(parseEvents(JSON.stringify([{ ...failed, kind: 'nope' }, failed, { ...failed, attempt: '2' }])), [expected]);
    assert.deepEqual(
      parseEvents(
        JSON.stringify([
          ['nope', ...asArray.slice(1)],
          asArray,
          started,
          [...started.slice(0, 4), '1', started[5]],
          [...started.slice(0, 5), 'not a time'],
          [...started, null, { done: 3 }],
        ]),
      ),
      [
        expected,
        { kind: 'started', queue: 'q', id: 'j', type: 't', attempt: 1, at: new Date('2026-01-01T00:00:01Z') },
        { kind: 'started', queue: 'q', id: 'j', type: 't', attempt: 1, at: new Date('2026-01-01T00:00:01Z'), progress: { done: 3 } },
      ],
    );
  });

  /** Sends the events `rows` selects in one send_task_events() call; the events a watcher gets, and each notification's size. */
  async function sendBatch(rows: string, count: number): Promise<{ events: TaskEvent[]; sizes: number[] }> {
    const listener = new pg.Client({ connectionString: db.connectionString });
    await listener.connect();
    const sizes: number[] = [];
    listener.on('notification', (n) => sizes.push(Buffer.byteLength(n.payload ?? '')));
    await listener.query(`LISTEN "${db.schema}_events"`);
    try {
      const events = await collect(
        { queue: 'watched' },
        (es) => es.length === count,
        () => void db.query(`SELECT {{schema}}.send_task_events(ARRAY(${rows}))`),
      );
      // Every notification of the batch has reached the listener too once this round trip is back.
      await listener.query('SELECT 1');
      return { events, sizes };
    } finally {
      await listener.end();
    }
  }

  test('a batch of events wider than one notification arrives whole and in order, each notification under 8,000 bytes', async () => {
    // 40 events of about 3.5 KB: an id of 128 characters, a type of 100 two-byte characters, an error
    // of 2,000 three-byte characters, cut to its first 1,000.
    const { events, sizes } = await sendBatch(
      `SELECT {{schema}}.task_event('failed', 'watched', lpad(g::text, 128, 'x'), repeat('é', 100), 1, now(), repeat('€', 2000), NULL)
       FROM generate_series(1, 40) g ORDER BY g`,
      40,
    );
    assert.deepEqual(
      events.map((e) => e.id),
      Array.from({ length: 40 }, (_, i) => String(i + 1).padStart(128, 'x')),
    );
    assert.ok(events.every((e) => e.error === '€'.repeat(1000) && e.type === 'é'.repeat(100)));
    assert.ok(sizes.length > 1 && sizes.length < 40, `${sizes.length} notifications`);
    assert.ok(Math.max(...sizes) <= 8000, `the largest: ${Math.max(...sizes)} bytes`);
  });

  test('short and long events mixed in one batch arrive whole and in order, each notification under 8,000 bytes', async () => {
    // 300 events of about 90 bytes, 10 of about 3.5 KB, 300 short ones again: the pieces are sized on
    // the batch's average, so the long ones' piece must be cut again.
    const { events, sizes } = await sendBatch(
      `SELECT {{schema}}.task_event('failed', 'watched', g::text, 't', 1, now(), CASE WHEN g BETWEEN 301 AND 310 THEN repeat('€', 1000) END, NULL)
       FROM generate_series(1, 610) g ORDER BY g`,
      610,
    );
    assert.deepEqual(
      events.map((e) => e.id),
      Array.from({ length: 610 }, (_, i) => String(i + 1)),
    );
    assert.ok(events.every((e, i) => (i >= 300 && i < 310 ? e.error === '€'.repeat(1000) : e.error === undefined)));
    assert.ok(Math.max(...sizes) <= 8000, `the largest: ${Math.max(...sizes)} bytes`);
    // The short events share their notifications: 600 of them come in a few dozen at most.
    assert.ok(sizes.length <= 40, `${sizes.length} notifications`);
  });

  test('a watched task that fails with an error of 2,000 four-byte characters fails as any other; its event carries the first 1,000', async () => {
    await startServer(async () => {
      throw new SkipRetry('😀'.repeat(2000));
    });
    const events = await collect(
      { queue: 'watched' },
      (es) => es.some((e) => e.kind === 'archived'),
      () => void client.enqueue(new Task('fails', null), { queue: 'watched', taskId: 'wide' }),
    );
    assert.equal(events.find((e) => e.kind === 'archived')?.error, '😀'.repeat(1000));
    assert.equal((await inspector.getTaskInfo('watched', 'wide')).state, 'archived');
  });

  test('while someone watches, a server sends its completions their events: each task of many batches has its two, once, in order', async () => {
    await startServer(async () => {});
    const ids = Array.from({ length: 120 }, (_, i) => `many-${i}`);
    const events = await collect(
      { queue: 'watched' },
      (es) => es.filter((e) => e.kind === 'completed').length === ids.length,
      // Chunks, so that the completions come in many batches: the first after the watcher came
      // has its events built by the database, the later ones carry the server's.
      () =>
        void (async () => {
          for (let i = 0; i < ids.length; i += 10) {
            await client
              .enqueueMany(
                ids.slice(i, i + 10).map(() => new Task('many', null)),
                { queue: 'watched' },
              )
              .catch(() => {});
          }
        })(),
    );
    const byId = new Map<string, string[]>();
    for (const e of events) byId.set(e.id, [...(byId.get(e.id) ?? []), `${e.kind}:${e.attempt}:${e.type}`]);
    assert.equal(byId.size, ids.length);
    for (const [id, kinds] of byId) assert.deepEqual(kinds, ['started:1:many', 'completed:1:many'], id);
    assert.ok(events.every((e) => e.queue === 'watched' && e.at instanceof Date && !Number.isNaN(e.at.getTime())));
  });

  test("complete() with the server's events: sent for the tasks its fence let through in a watched queue, with the batch's time; none is built", async () => {
    const listener = new pg.Client({ connectionString: db.connectionString });
    await listener.connect();
    const heard: string[] = [];
    listener.on('notification', (n) => heard.push(n.payload ?? ''));
    await listener.query(`LISTEN "${db.schema}_events"`);
    try {
      await client.enqueueMany([new Task('a', null), new Task('b', null)], { queue: 'watched' });
      await client.enqueue(new Task('c', null), { queue: 'other' });
      const [a, b] = await claim(broker, ['watched'], 2, 'me', 30_000);
      const [c] = await claim(broker, ['other'], 1, 'me', 30_000);
      const item = (r: typeof a, token = r!.lease_token) => ({
        queue: r!.queue,
        id: r!.id,
        seq: r!.seq,
        token,
        keep: false,
        // A type the task does not have: only the server's text can carry it.
        event: eventWithoutTime('completed', r!.queue, r!.id, 'from-the-server', 7),
      });
      // Nobody watches: nothing is sent, and the server is told so.
      const alone = await complete(broker, [item(a)]);
      assert.equal(alone.watching, false);
      assert.equal(alone.held.length, 1);
      await db.query("INSERT INTO {{schema}}.watchers (id, queue, expires_at) VALUES (gen_random_uuid(), 'watched', now() + interval '1 minute')");
      // b with a stale token is fenced off; c's queue is not watched.
      const stale = '00000000-0000-0000-0000-000000000000';
      const done = await complete(broker, [item(b, stale), item(c)]);
      assert.equal(done.watching, true);
      assert.deepEqual(
        done.held.map((r) => r.id),
        [c!.id],
      );
      assert.deepEqual(await complete(broker, [item(b)]).then((r) => r.held.map((x) => x.id)), [b!.id]);
      await listener.query('SELECT 1');
      const events = heard.flatMap(parseEvents);
      assert.deepEqual(
        events.map((e) => [e.kind, e.id, e.type, e.attempt]),
        [['completed', b!.id, 'from-the-server', 7]],
      );
      const [{ now }] = await db.query('SELECT now() AS now');
      assert.ok(Math.abs(events[0]!.at.getTime() - new Date(now).getTime()) < 60_000, 'dated by the database');
    } finally {
      await listener.end();
    }
  });

  test("complete() with an event too long for a notification, or a batch where some task has none: the task completes; the database's event or none", async () => {
    const listener = new pg.Client({ connectionString: db.connectionString });
    await listener.connect();
    const heard: string[] = [];
    listener.on('notification', (n) => heard.push(n.payload ?? ''));
    await listener.query(`LISTEN "${db.schema}_events"`);
    try {
      await db.query("INSERT INTO {{schema}}.watchers (id, queue, expires_at) VALUES (gen_random_uuid(), NULL, now() + interval '1 minute')");
      await client.enqueueMany([new Task('long', null), new Task('x', null), new Task('y', null)], { queue: 'watched' });
      const [long, x, y] = await claim(broker, ['watched'], 3, 'me', 30_000);
      const key = (r: typeof long) => ({ queue: r!.queue, id: r!.id, seq: r!.seq, token: r!.lease_token, keep: false });
      const huge = await complete(broker, [{ ...key(long), event: eventWithoutTime('completed', 'watched', long!.id, 'é'.repeat(4000), 1) }]);
      assert.equal(huge.held.length, 1);
      // One item without its event: the batch's events are the database's own.
      const mixed = await complete(broker, [{ ...key(x), event: eventWithoutTime('completed', 'watched', x!.id, 'from-the-server', 1) }, key(y)]);
      assert.equal(mixed.held.length, 2);
      await listener.query('SELECT 1');
      assert.deepEqual(
        heard
          .flatMap(parseEvents)
          .filter((e) => e.kind === 'completed')
          .map((e) => [e.id, e.type])
          .sort(),
        [
          [x!.id, 'x'],
          [y!.id, 'y'],
        ].sort(),
      );
      assert.equal((await db.query('SELECT count(*)::int AS n FROM {{schema}}.tasks'))[0].n, 0);
    } finally {
      await listener.end();
    }
  });

  test('migration 0020: the roles that could complete tasks can complete them with the events; no other can', async () => {
    const schema = 't_watch_0020';
    const roles = ['t_watch_0020_worker', 't_watch_0020_other'];
    const newSig = `${schema}.complete_tasks(bigint[], uuid[], boolean[], jsonb, text[], float8)`;
    const oldSig = `${schema}.complete_tasks(bigint[], uuid[], boolean[], jsonb, float8)`;
    await db.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    for (const r of roles) await db.query(`DROP ROLE IF EXISTS ${r}`);
    try {
      for (const r of roles) await db.query(`CREATE ROLE ${r}`);
      await migrate({ connectionString: db.connectionString, schema, to: '0019_awaited_enqueue', logger: false });
      await db.query(`GRANT EXECUTE ON FUNCTION ${oldSig} TO ${roles[0]}`);
      await migrate({ connectionString: db.connectionString, schema, logger: false });
      const can = async (role: string, sig: string) => (await db.query(`SELECT has_function_privilege($1, $2, 'EXECUTE') AS ok`, [role, sig]))[0].ok as boolean;
      assert.deepEqual([await can(roles[0]!, newSig), await can(roles[0]!, oldSig)], [true, true]);
      assert.deepEqual([await can(roles[1]!, newSig), await can(roles[1]!, oldSig)], [false, false]);
      assert.equal(await can('public', newSig), false);
    } finally {
      await db.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      for (const r of roles) await db.query(`DROP ROLE IF EXISTS ${r}`);
    }
  });

  test('bad options: a ValidationError naming the option', async () => {
    for (const [opts, field] of [
      [{ queue: '' }, 'queue'],
      [{ signal: 1 }, 'signal'],
      [{ other: 1 }, 'options.other'],
    ] as const) {
      const err = await inspector
        .watch(opts as never)
        [Symbol.asyncIterator]()
        .next()
        .catch((e: unknown) => e);
      assert.ok(err instanceof ValidationError && err.field === field, `${JSON.stringify(opts)}: ${String(err)}`);
    }
  });
});
