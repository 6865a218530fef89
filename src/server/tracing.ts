/**
 * The server's side of OpenTelemetry (see src/internal/otel.ts for the
 * loading and the enqueue's side): each run of a handler in a CONSUMER span
 * `process <queue>`, whose parent is the context the task's headers carry (its
 * enqueue's PRODUCER span), and a group's aggregate linked to its members.
 * Without @opentelemetry/api or a registered provider, both call straight through.
 */
import type * as Api from '@opentelemetry/api';
import type { ClaimedRow } from '../broker/claim.js';
import { ATTR, contextOf, parseTraceparent, recordFailure, SYSTEM, traceparentOf, withTracing, type Tracing } from '../internal/otel.js';
import { attemptOf } from '../model/attempt.js';
import { isRevokeTask } from '../model/errors.js';
import { validateHeaders } from '../model/headers.js';
import { snoozeOf } from '../model/snooze.js';
import type { TaskRecord } from '../model/task.js';
import type { Outcome } from './outcomes.js';

/**
 * The header in which an aggregate carries its members' contexts: their W3C
 * traceparents, comma-separated, at most {@link MAX_LINKS} of them.
 */
export const LINKS_HEADER = 'pgasynq-trace-links';
/** The most members an aggregate links to: the SDK's default limit of links per span. */
const MAX_LINKS = 128;

/**
 * Runs `run` (the handler, resolving with its outcome) in a CONSUMER span
 * `process <queue>`: active while the handler runs, so that its own spans, and
 * the PRODUCER spans of tasks it enqueues, are its children. Its parent is the
 * context in the task's headers; a task without one (enqueued from SQL, a
 * periodic task) starts a trace of its own, and an aggregate links to its
 * members. A handler's error is recorded (exception event, error.type, status
 * ERROR); a Snooze or a RevokeTask is not a failure, and success leaves the
 * status unset, as the conventions ask of instrumentation libraries. The span
 * ends when the handler settles, before the outcome is written.
 */
export function traceProcess(row: ClaimedRow, run: () => Promise<Outcome>): Promise<Outcome> {
  return withTracing(run, async ({ otel, tracer }) => {
    let span: Api.Span;
    let ctx: Api.Context;
    try {
      const parent = contextOf(otel, row.headers);
      const attributes: Api.Attributes = {
        [ATTR.system]: SYSTEM,
        [ATTR.systemName]: SYSTEM,
        [ATTR.operationType]: 'process',
        [ATTR.operationName]: 'process',
        [ATTR.destination]: row.queue,
        [ATTR.messageId]: row.id,
        [ATTR.taskType]: row.type,
        [ATTR.attempt]: attemptOf(row.retried),
      };
      const links = linksOf(otel, row.headers[LINKS_HEADER]);
      span = tracer.startSpan(`process ${row.queue}`, { kind: otel.SpanKind.CONSUMER, attributes, links }, parent);
      ctx = otel.trace.setSpan(parent, span);
    } catch {
      return run();
    }
    try {
      const outcome = await otel.context.with(ctx, run);
      const { error } = outcome;
      if (error === null) return outcome;
      const snoozed = snoozeOf(error);
      if (snoozed) span.addEvent('snoozed', { 'pgasynq.snooze.delay_ms': snoozed.delayMs });
      else if (!isRevokeTask(error)) recordFailure(otel, span, error);
      return outcome;
    } finally {
      span.end();
    }
  });
}

/** The links in an aggregate's LINKS_HEADER. */
function linksOf(otel: Tracing['otel'], value: string | undefined): Api.Link[] | undefined {
  if (value === undefined) return undefined;
  const links: Api.Link[] = [];
  for (const tp of value.split(',', MAX_LINKS)) {
    const context = parseTraceparent(otel, tp);
    if (context) links.push({ context });
  }
  return links.length > 0 ? links : undefined;
}

/**
 * Puts the contexts of a group's members (the creation contexts their headers
 * carry) in the aggregate's LINKS_HEADER, so that the aggregate's CONSUMER span
 * links to each: an aggregate has many parents, and a span has one. Nothing
 * when tracing is off, when no member carries a context, when the aggregate's
 * own headers already have the header, or when it would not fit their limits.
 */
export function linkMembers(record: TaskRecord, members: readonly { headers: Record<string, string> }[]): Promise<void> {
  return withTracing(
    () => Promise.resolve(),
    ({ otel }) => Promise.resolve(addLinks(otel, record, members)),
  );
}

function addLinks(otel: Tracing['otel'], record: TaskRecord, members: readonly { headers: Record<string, string> }[]): void {
  if (Object.hasOwn(record.headers, LINKS_HEADER)) return;
  const seen = new Set<string>();
  for (const m of members) {
    if (seen.size === MAX_LINKS) break;
    try {
      const sc = otel.trace.getSpanContext(contextOf(otel, m.headers));
      if (sc !== undefined && otel.isSpanContextValid(sc)) seen.add(traceparentOf(sc));
    } catch {
      // A member whose headers a propagator cannot read is left unlinked.
    }
  }
  if (seen.size === 0) return;
  try {
    record.headers = validateHeaders({ ...record.headers, [LINKS_HEADER]: [...seen].join(',') });
  } catch {
    // Over the headers' limits: the aggregate goes without its links.
  }
}
