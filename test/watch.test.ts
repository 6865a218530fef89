/**
 * Inspector.watch() (migration 0013): the servers' events for a queue, in
 * order per task, sent only while a watcher is registered; the registration
 * ends with the watch; a notification that is not an event is ignored.
 */
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import pg from 'pg';
import { SkipRetry, Task, ValidationError, type TaskEvent } from '../src/index.js';
import { parseEvents } from '../src/inspector-following.js';
import { deferred, setupDb, test, waitFor } from './helpers.js';

const { db, client, inspector, startServer } = setupDb('t_watch', {
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
