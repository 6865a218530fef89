/**
 * OpenTelemetry: enqueue's PRODUCER span and its context in the task's
 * headers, the handler's CONSUMER span (parent, attributes, exceptions,
 * attempts, links of an aggregate, a new trace for a task enqueued in SQL),
 * a producer in another process, and nothing at all without a provider or
 * without @opentelemetry/api. Spans are read from the SDK's in-memory
 * exporter, behind a BasicTracerProvider registered globally.
 */
import assert from 'node:assert/strict';
import { before, beforeEach, describe } from 'node:test';
import { context, propagation, SpanKind, SpanStatusCode, trace, type Span, type TextMapPropagator } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { CompositePropagator, W3CBaggagePropagator, W3CTraceContextPropagator } from '@opentelemetry/core';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { RevokeTask, Snooze, Task, type TaskContext } from '../src/index.js';
import { MAX_HEADER_KEYS } from '../src/model/headers.js';
import { runNode, setupDb, test, waitFor } from './helpers.js';

const { db, client, startServer } = setupDb('t_tracing', { resetEach: true });

const exporter = new InMemorySpanExporter();
const tracer = trace.getTracer('test');

/** The SDK as an application sets it up: provider, context manager (AsyncLocalStorage), W3C trace context and baggage. */
function registerProvider(): void {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  setPropagator();
  trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
}

function setPropagator(): void {
  propagation.setGlobalPropagator(new CompositePropagator({ propagators: [new W3CTraceContextPropagator(), new W3CBaggagePropagator()] }));
}

/** Runs `fn` inside a new active span `name`, ended after; resolves to fn's result and the span. */
async function inSpan<T>(name: string, fn: () => Promise<T>): Promise<[T, Span]> {
  const span = tracer.startSpan(name);
  try {
    return [await context.with(trace.setSpan(context.active(), span), fn), span];
  } finally {
    span.end();
  }
}

const spans = () => exporter.getFinishedSpans();
/** The finished span of `kind` about task `id` (its messaging.message.id), waited for. */
const spanOf = (kind: SpanKind, id: string, attempt?: number) =>
  waitFor(
    () =>
      spans().find(
        (s) => s.kind === kind && s.attributes['messaging.message.id'] === id && (attempt === undefined || s.attributes['pgasynq.task.attempt'] === attempt),
      ),
    20_000,
    `the ${SpanKind[kind]} span of ${id}${attempt === undefined ? '' : ` (attempt ${attempt})`}`,
  );
const parentId = (s: ReadableSpan) => s.parentSpanContext?.spanId;
const traceparentOf = (s: ReadableSpan | Span) => `00-${s.spanContext().traceId}-${s.spanContext().spanId}-01`;

// Before any provider is registered: the API is installed, so pgasynq loads it and finds no provider.
test('without a tracer provider: no span, no header, the handler runs as before', async () => {
  const seen: { headers: Record<string, string>; active: unknown }[] = [];
  await startServer((task: Task) => void seen.push({ headers: { ...task.headers }, active: trace.getActiveSpan() }), { queues: { plain: 1 } });
  const [[info, [many]]] = await inSpan('request', () =>
    Promise.all([
      client.enqueue(new Task('t', null, { headers: { a: '1' } }), { queue: 'plain' }),
      client.enqueueMany([new Task('t', null)], { queue: 'plain' }),
    ]),
  );
  assert.deepEqual(info.headers, { a: '1' });
  assert.deepEqual(many!.headers, {});
  await waitFor(() => seen.length === 2, 20_000, 'both tasks run');
  assert.deepEqual(
    seen.map((s) => s.active),
    [undefined, undefined],
  );
  assert.deepEqual(
    seen.map((s) => s.headers).sort((x, y) => Object.keys(y).length - Object.keys(x).length),
    [{ a: '1' }, {}],
  );
  assert.equal(spans().length, 0);
});

test('without @opentelemetry/api installed: enqueue and run work, add no header, and print nothing', async () => {
  const r = await runNode(['--import', './test/fixtures/without-otel.ts', 'test/fixtures/otel-absent.ts'], {
    DATABASE_URL: db.connectionString,
    SCHEMA: db.schema,
  });
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stderr, '', 'no warning');
  assert.deepEqual(JSON.parse(r.stdout), { apiMissing: true, headers: { a: '1' } });
});

describe('with a tracer provider', () => {
  before(registerProvider);
  beforeEach(() => exporter.reset());

  test("enqueue in a span: PRODUCER span, its context in the headers; the handler's CONSUMER span is its child", async () => {
    const inHandler: { active?: string; follow?: string } = {};
    await startServer(
      async (task: Task, ctx: TaskContext) => {
        if (task.type !== 'email') return;
        inHandler.active = trace.getActiveSpan()?.spanContext().spanId;
        await tracer.startActiveSpan('render', async (s) => {
          s.end();
        });
        inHandler.follow = (await client.enqueue(new Task('email:sent', { of: ctx.taskId }), { queue: 'mail' })).id;
      },
      { queues: { mail: 1 } },
    );
    const [info, request] = await inSpan('request', () => client.enqueue(new Task('email', { to: 'ada' }), { queue: 'mail' }));
    const producer = await spanOf(SpanKind.PRODUCER, info.id);
    assert.equal(producer.name, 'send mail');
    assert.equal(producer.spanContext().traceId, request.spanContext().traceId);
    assert.equal(parentId(producer), request.spanContext().spanId);
    assert.equal(producer.instrumentationScope.name, 'pgasynq');
    assert.deepEqual(producer.attributes, {
      'messaging.system': 'pgasynq',
      'messaging.system.name': 'pgasynq',
      'messaging.operation.type': 'send',
      'messaging.operation.name': 'send',
      'messaging.destination.name': 'mail',
      'messaging.message.id': info.id,
      'pgasynq.task.type': 'email',
    });
    assert.equal(producer.status.code, SpanStatusCode.UNSET);
    assert.equal(info.headers.traceparent, traceparentOf(producer), 'the PRODUCER span travels in traceparent');

    const consumer = await spanOf(SpanKind.CONSUMER, info.id);
    assert.equal(consumer.name, 'process mail');
    assert.equal(consumer.spanContext().traceId, request.spanContext().traceId);
    assert.equal(parentId(consumer), producer.spanContext().spanId);
    assert.deepEqual(consumer.attributes, {
      'messaging.system': 'pgasynq',
      'messaging.system.name': 'pgasynq',
      'messaging.operation.type': 'process',
      'messaging.operation.name': 'process',
      'messaging.destination.name': 'mail',
      'messaging.message.id': info.id,
      'pgasynq.task.type': 'email',
      'pgasynq.task.attempt': 1,
    });
    assert.equal(consumer.status.code, SpanStatusCode.UNSET, 'success leaves the status unset');
    assert.deepEqual(consumer.links, []);
    assert.equal(inHandler.active, consumer.spanContext().spanId, 'the CONSUMER span is active in the handler');
    const render = spans().find((s) => s.name === 'render');
    assert.equal(render && parentId(render), consumer.spanContext().spanId, "the handler's own spans nest under it");
    const follow = await spanOf(SpanKind.PRODUCER, inHandler.follow!);
    assert.equal(parentId(follow), consumer.spanContext().spanId, 'an enqueue in the handler is its child');
    assert.equal(parentId(await spanOf(SpanKind.CONSUMER, inHandler.follow!)), follow.spanContext().spanId);
  });

  test("the caller's own traceparent is kept; baggage travels through the global propagator", async () => {
    const theirs = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    const ctx = propagation.setBaggage(context.active(), propagation.createBaggage({ tenant: { value: 'acme' } }));
    const [[mine, kept]] = await context.with(ctx, () =>
      inSpan('request', () => Promise.all([client.enqueue(new Task('t', null)), client.enqueue(new Task('t', null, { headers: { traceparent: theirs } }))])),
    );
    assert.equal(mine.headers.baggage, 'tenant=acme');
    assert.match(mine.headers.traceparent!, /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);
    assert.deepEqual(kept.headers, { traceparent: theirs });
    await startServer(() => {}, { queues: { default: 1 } });
    const consumer = await spanOf(SpanKind.CONSUMER, kept.id);
    assert.equal(consumer.spanContext().traceId, '0af7651916cd43dd8448eb211c80319c');
    assert.equal(parentId(consumer), 'b7ad6b7169203331');
  });

  test("enqueueAndWait: its PRODUCER span is the request's child and the CONSUMER span's parent, as enqueue's", async () => {
    await startServer(() => 'ok', { queues: { waited: 1 } });
    const [done, request] = await inSpan('request', () => client.enqueueAndWait(new Task('report', null), { queue: 'waited', waitTimeout: 20_000 }));
    const producer = await spanOf(SpanKind.PRODUCER, done.id);
    assert.equal(producer.name, 'send waited');
    assert.equal(parentId(producer), request.spanContext().spanId);
    assert.equal(done.headers.traceparent, traceparentOf(producer));
    assert.equal(parentId(await spanOf(SpanKind.CONSUMER, done.id)), producer.spanContext().spanId);
  });

  test('enqueueMany: one PRODUCER span for the call, whose context every task carries', async () => {
    const [infos] = await inSpan('batch', () => client.enqueueMany([new Task('a', 1), new Task('b', 2), new Task('c', 3)], { queue: 'bulk' }));
    const producers = spans().filter((s) => s.kind === SpanKind.PRODUCER);
    assert.equal(producers.length, 1);
    const [producer] = producers as [ReadableSpan];
    assert.equal(producer.name, 'send bulk');
    assert.equal(producer.attributes['messaging.batch.message_count'], 3);
    assert.equal(producer.attributes['messaging.message.id'], undefined, 'no single message id on a batch');
    for (const info of infos) assert.equal(info.headers.traceparent, traceparentOf(producer));
    const [mixed] = await inSpan('mixed', () => client.enqueueMany([new Task('a', 1, { queue: 'q1' }), new Task('b', 2, { queue: 'q2' })]));
    const send = spans().find((s) => s.kind === SpanKind.PRODUCER && s.attributes['messaging.batch.message_count'] === 2)!;
    assert.equal(send.name, 'send', 'tasks of several queues: no destination in the name');
    assert.equal(send.attributes['messaging.destination.name'], undefined);
    assert.equal(mixed[1]!.headers.traceparent, traceparentOf(send));
    await startServer(() => {}, { queues: { bulk: 1 } });
    for (const info of infos) assert.equal(parentId(await spanOf(SpanKind.CONSUMER, info.id)), producer.spanContext().spanId);
  });

  test('a throwing handler: the exception recorded, error.type, status ERROR, on each attempt', async () => {
    await startServer(
      (_task: Task, ctx: TaskContext) => {
        if (ctx.attempt === 1) throw new TypeError('boom');
      },
      { queues: { flaky: 1 }, retryDelay: () => 0, delayedTaskCheckInterval: 50 },
    );
    const [info] = await inSpan('request', () => client.enqueue(new Task('t', null), { queue: 'flaky', maxRetry: 1 }));
    const first = await spanOf(SpanKind.CONSUMER, info.id, 1);
    assert.equal(first.status.code, SpanStatusCode.ERROR);
    assert.equal(first.status.message, 'boom');
    assert.equal(first.attributes['error.type'], 'TypeError');
    const [event] = first.events;
    assert.equal(event?.name, 'exception');
    assert.equal(event.attributes?.['exception.type'], 'TypeError');
    assert.equal(event.attributes?.['exception.message'], 'boom');
    const second = await spanOf(SpanKind.CONSUMER, info.id, 2);
    assert.equal(second.status.code, SpanStatusCode.UNSET);
    assert.equal(second.events.length, 0);
    const producer = await spanOf(SpanKind.PRODUCER, info.id);
    assert.equal(parentId(second), producer.spanContext().spanId, 'every attempt is a child of the enqueue');
  });

  test('Snooze and RevokeTask are no failures: no exception, status unset', async () => {
    await startServer((task: Task) => {
      throw task.type === 'snooze' ? new Snooze(60_000) : new RevokeTask();
    });
    const snoozed = await client.enqueue(new Task('snooze', null));
    const revoked = await client.enqueue(new Task('revoke', null));
    const s = await spanOf(SpanKind.CONSUMER, snoozed.id);
    assert.equal(s.status.code, SpanStatusCode.UNSET);
    assert.deepEqual(
      s.events.map((e) => [e.name, e.attributes]),
      [['snoozed', { 'pgasynq.snooze.delay_ms': 60_000 }]],
    );
    const r = await spanOf(SpanKind.CONSUMER, revoked.id);
    assert.equal(r.status.code, SpanStatusCode.UNSET);
    assert.equal(r.events.length, 0);
  });

  test('a task enqueued in SQL carries no context: its CONSUMER span starts a new trace', async () => {
    const [{ id }] = await db.query("SELECT {{schema}}.enqueue('sql:task', queue => 'sql') AS id");
    await startServer(() => {}, { queues: { sql: 1 } });
    const consumer = await spanOf(SpanKind.CONSUMER, id);
    assert.equal(consumer.parentSpanContext, undefined, 'a root span');
    assert.equal(consumer.name, 'process sql');
  });

  test("a group's aggregate: its CONSUMER span links to every member's enqueue", async () => {
    const members = [];
    for (const n of [1, 2, 3]) members.push((await inSpan(`member ${n}`, () => client.enqueue(new Task('item', n), { queue: 'agg', group: 'g' })))[0]);
    await client.enqueue(new Task('item', 4), { queue: 'agg', group: 'g' }); // enqueued outside any span: still traced, its own trace
    await startServer(() => {}, {
      queues: { agg: 1 },
      groupMaxSize: 4,
      groupGracePeriod: 100,
      groupAggregator: (_group, tasks) =>
        new Task(
          'batch',
          tasks.map((t) => t.payload),
        ),
    });
    const consumer = await waitFor(() => spans().find((s) => s.kind === SpanKind.CONSUMER && s.name === 'process agg'));
    const producers = await Promise.all(members.map((m) => spanOf(SpanKind.PRODUCER, m.id)));
    assert.equal(consumer.links.length, 4);
    for (const p of producers) {
      assert.ok(
        consumer.links.some((l) => l.context.traceId === p.spanContext().traceId && l.context.spanId === p.spanContext().spanId),
        `a link to ${p.spanContext().traceId}`,
      );
    }
    assert.equal(consumer.parentSpanContext, undefined, 'an aggregate has many parents: links, and a trace of its own');
  });

  test('a producer in another process: the worker here continues its trace', async () => {
    await startServer(() => {}, { queues: { remote: 1 } });
    const r = await runNode(['test/fixtures/otel-producer.ts'], { DATABASE_URL: db.connectionString, SCHEMA: db.schema });
    assert.equal(r.code, 0, r.stderr);
    const remote = JSON.parse(r.stdout) as { traceId: string; requestSpanId: string; producerSpanId: string; taskId: string };
    assert.match(remote.producerSpanId, /^[0-9a-f]{16}$/);
    const consumer = await spanOf(SpanKind.CONSUMER, remote.taskId);
    assert.equal(consumer.spanContext().traceId, remote.traceId, "the other process's trace");
    assert.equal(parentId(consumer), remote.producerSpanId, 'child of its PRODUCER span');
    assert.equal(consumer.parentSpanContext?.isRemote, true);
  });

  test('tracing never fails an enqueue: a propagator that throws, headers at their limit', async () => {
    const throwing: TextMapPropagator = {
      inject: () => {
        throw new Error('propagator bug');
      },
      extract: (ctx) => ctx,
      fields: () => [],
    };
    propagation.disable();
    propagation.setGlobalPropagator(throwing);
    try {
      const [info] = await inSpan('request', () => client.enqueue(new Task('t', null)));
      assert.deepEqual(info.headers, {});
    } finally {
      propagation.disable();
      setPropagator();
    }
    const full = Object.fromEntries(Array.from({ length: MAX_HEADER_KEYS }, (_, i) => [`h${i}`, 'x']));
    const [info] = await inSpan('request', () => client.enqueue(new Task('t', null, { headers: full })));
    assert.equal(Object.keys(info.headers).length, MAX_HEADER_KEYS);
    assert.equal(info.headers.traceparent, undefined, 'no room for it: the task goes without');
    assert.equal((await spanOf(SpanKind.PRODUCER, info.id)).status.code, SpanStatusCode.UNSET, 'the span is there all the same');
  });
});
