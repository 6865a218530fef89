/**
 * OpenTelemetry, when the application uses it. `@opentelemetry/api` is an
 * optional peer dependency: it is imported once, at a server's start or on the first enqueue,
 * and when it is not installed, or no tracer provider is registered, every
 * hook calls straight through: no span, no header, no attribute object, no
 * warning. A tracing failure never fails an enqueue or a run.
 *
 * The spans follow OpenTelemetry's messaging conventions (semantic
 * conventions 1.3x; attribute names are written out here, so that nothing
 * depends on @opentelemetry/semantic-conventions at run time): a PRODUCER span
 * `send <queue>` around each enqueue call, whose context travels in the
 * task's headers (`traceparent`, `tracestate`, and whatever else the global
 * propagator writes, `baggage` with W3C baggage), and a CONSUMER span
 * `process <queue>` around each run of a handler (src/server/tracing.ts).
 *
 * No type from the API appears in a declaration outside this layer's
 * `@internal` ones: the package's .d.ts files must typecheck where the peer
 * is not installed.
 */
import type * as Api from '@opentelemetry/api';
import { readFileSync } from 'node:fs';
import { validateHeaders } from '../model/headers.js';
import type { TaskRecord } from '../model/task.js';

type Otel = typeof Api;

/** @internal What a traced hook gets: the API and a tracer of a registered provider. */
export interface Tracing {
  otel: Otel;
  tracer: Api.Tracer;
}

/** The instrumentation scope: the spans' tracer is this package's, at its version. */
const SCOPE = 'pgasynq';

/**
 * @internal Attribute names (semantic conventions 1.3x). `messaging.system` is the
 * name most backends still read (and the one pgasynq's API documents);
 * `messaging.system.name` is its successor: both are set.
 */
export const ATTR = {
  system: 'messaging.system',
  systemName: 'messaging.system.name',
  operationType: 'messaging.operation.type',
  operationName: 'messaging.operation.name',
  destination: 'messaging.destination.name',
  messageId: 'messaging.message.id',
  batchCount: 'messaging.batch.message_count',
  errorType: 'error.type',
  /** pgasynq's own, under its own namespace: the task's type and the run's attempt (ctx.attempt). */
  taskType: 'pgasynq.task.type',
  attempt: 'pgasynq.task.attempt',
} as const;

/** @internal The value of messaging.system. */
export const SYSTEM = 'pgasynq';

/** The API once imported; null when it is not installed (or would not load); undefined before the first try. */
let api: Otel | null | undefined;
let loading: Promise<unknown> | undefined;
let version: string | undefined;

/**
 * @internal Imports the API once (never rejects). A Server awaits it at start, so
 * that no lease's trust is spent waiting for the import ahead of its first run.
 */
export function loadTracing(): Promise<unknown> {
  return (loading ??= import('@opentelemetry/api').then(
    (m) => {
      version = packageVersion();
      api = m;
    },
    () => (api = null),
  ));
}

function packageVersion(): string | undefined {
  try {
    return (JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version?: string }).version;
  } catch {
    return undefined;
  }
}

/**
 * A tracer of the registered provider; undefined when there is none. The API's
 * global provider is a proxy that hands out no-op tracers until an SDK
 * registers one: asking it for its delegate's tracer tells which, without a span.
 */
function activeTracer(otel: Otel): Api.Tracer | undefined {
  try {
    const provider = otel.trace.getTracerProvider() as Api.TracerProvider & { getDelegateTracer?: (name: string, version?: string) => Api.Tracer | undefined };
    return typeof provider.getDelegateTracer === 'function' ? provider.getDelegateTracer(SCOPE, version) : provider.getTracer(SCOPE, version);
  } catch {
    return undefined;
  }
}

/**
 * @internal `traced(t)` when tracing is on, else `untraced()`. The first call waits
 * for the API's import; the later ones decide at once, and call straight
 * through (no async frame of its own: this runs once per task).
 */
export function withTracing<T>(untraced: () => Promise<T>, traced: (t: Tracing) => Promise<T>): Promise<T> {
  if (api === undefined) return loadTracing().then(() => withTracing(untraced, traced));
  const tracer = api ? activeTracer(api) : undefined;
  return tracer ? traced({ otel: api!, tracer }) : untraced();
}

/**
 * Runs `send` (the insert of `records`) in a PRODUCER span `send <queue>`, and
 * puts the span's context in each record's headers first (see {@link withContext}).
 * `batch`: an enqueueMany, one span for the call (as BullMQ's addBulk and
 * River's InsertMany): its context is every task's creation context, and
 * messaging.batch.message_count says how many; a span per task would cost as
 * many spans as tasks for what is one statement. Tasks of several queues:
 * the span is `send`, without a destination.
 */
export function traceSend<T>(records: TaskRecord[], send: () => Promise<T>, batch = false): Promise<T> {
  return withTracing(send, (t) => sendSpan(t, records, send, batch));
}

async function sendSpan<T>({ otel, tracer }: Tracing, records: TaskRecord[], send: () => Promise<T>, batch: boolean): Promise<T> {
  let span: Api.Span | undefined;
  let ctx: Api.Context;
  try {
    const first = records[0]!;
    const queue = records.every((r) => r.queue === first.queue) ? first.queue : undefined;
    const attributes: Api.Attributes = {
      [ATTR.system]: SYSTEM,
      [ATTR.systemName]: SYSTEM,
      [ATTR.operationType]: 'send',
      [ATTR.operationName]: 'send',
    };
    if (queue !== undefined) attributes[ATTR.destination] = queue;
    if (batch) attributes[ATTR.batchCount] = records.length;
    else Object.assign(attributes, { [ATTR.messageId]: first.id, [ATTR.taskType]: first.type });
    const parent = otel.context.active();
    span = tracer.startSpan(queue === undefined ? 'send' : `send ${queue}`, { kind: otel.SpanKind.PRODUCER, attributes }, parent);
    ctx = otel.trace.setSpan(parent, span);
    const headers = records.map((r) => withContext(otel, ctx, r.headers));
    records.forEach((r, i) => (r.headers = headers[i]!));
  } catch {
    span?.end();
    return send();
  }
  try {
    return await otel.context.with(ctx, send);
  } catch (err) {
    recordFailure(otel, span, err);
    throw err;
  } finally {
    span.end();
  }
}

/** @internal Records a failure on `span` as the conventions ask: the exception as an event, error.type, status ERROR. */
export function recordFailure(otel: Otel, span: Api.Span, err: unknown): void {
  try {
    const e = err instanceof Error ? err : new Error(String(err));
    span.recordException(e);
    span.setAttribute(ATTR.errorType, e.name || 'Error');
    span.setStatus({ code: otel.SpanStatusCode.ERROR, message: e.message });
  } catch {
    // A span that cannot record is no reason to change what the caller sees.
  }
}

/**
 * @internal `headers` with ctx's propagation fields added: what the global
 * propagator writes, and a W3C `traceparent` (and `tracestate`) when it wrote
 * none (no propagator registered: the SDK's BasicTracerProvider sets none), so
 * that the context always travels under the names pgasynq documents. Headers
 * that already have a `traceparent` (the caller's own) are left as they are,
 * and so is any key the caller set; so are headers the fields would push over
 * the headers' limits.
 */
export function withContext(otel: Otel, ctx: Api.Context, headers: Record<string, string>): Record<string, string> {
  if (Object.hasOwn(headers, 'traceparent')) return headers;
  const carrier: Record<string, string> = {};
  otel.propagation.inject(ctx, carrier);
  if (!Object.hasOwn(carrier, 'traceparent')) {
    const sc = otel.trace.getSpanContext(ctx);
    if (sc === undefined || !otel.isSpanContextValid(sc)) return headers;
    carrier.traceparent = traceparentOf(sc);
    const state = sc.traceState?.serialize();
    if (state) carrier.tracestate = state;
  }
  const added = Object.entries(carrier).filter(([k, v]) => typeof v === 'string' && !Object.hasOwn(headers, k));
  if (added.length === 0) return headers;
  try {
    return validateHeaders({ ...headers, ...Object.fromEntries(added) });
  } catch {
    return headers;
  }
}

/**
 * @internal The context a task's headers carry: the global propagator's reading
 * of them, or else their W3C `traceparent`; ROOT_CONTEXT (a new trace) when they
 * carry none. Never the context the caller runs in: a task's run is no child of
 * the claim loop's.
 */
export function contextOf(otel: Otel, headers: Readonly<Record<string, string>>): Api.Context {
  const ctx = otel.propagation.extract(otel.ROOT_CONTEXT, headers);
  if (otel.trace.getSpanContext(ctx) !== undefined) return ctx;
  const sc = parseTraceparent(otel, headers.traceparent, headers.tracestate);
  return sc === undefined ? ctx : otel.trace.setSpanContext(ctx, sc);
}

/** @internal A span context as a W3C traceparent (version 00). */
export function traceparentOf(sc: Api.SpanContext): string {
  return `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, '0')}`;
}

/** version-traceid-parentid-flags; a later version may add fields after another dash. */
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** @internal A remote span context from a W3C traceparent (and tracestate); undefined unless it is a valid one. */
export function parseTraceparent(otel: Otel, traceparent: string | undefined, tracestate?: string): Api.SpanContext | undefined {
  const m = traceparent === undefined ? null : TRACEPARENT.exec(traceparent.trim());
  if (m === null || m[1] === 'ff' || (m[1] === '00' && m[5] !== undefined)) return undefined;
  const sc: Api.SpanContext = { traceId: m[2]!, spanId: m[3]!, traceFlags: parseInt(m[4]!, 16), isRemote: true };
  if (tracestate) sc.traceState = otel.createTraceState(tracestate);
  return otel.isSpanContextValid(sc) ? sc : undefined;
}
