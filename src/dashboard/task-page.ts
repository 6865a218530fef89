/**
 * The task page: one task's facts, progress, timeline (with every run it
 * made), lease, log lines, payload, result and headers, and for a task of a
 * workflow its dependencies and dependents, each a link to its own page, so
 * a chain can be walked both ways.
 */
import { PAGE_VALUE_CHARS, type DependencyPreview, type TaskPageInfo, type ValueExcerpt } from '../model/previews.js';
import { listTaskDependencies, listTaskDependents, taskPageInfo } from '../inspector-internal.js';
import { attemptText, lastFailedText } from '../model/attempt.js';
import type { TaskRef } from '../model/task.js';
import { datetime, duration, instant, num, pretty, relative } from './format.js';
import { html, type Html } from './html.js';
import { ALLOWED, OP_LABEL, type PageContext, type PageResult, actionForm, badge, confirmText, href, layout, opButton, queuePath, taskPath } from './pages.js';
import { taskKey, workersByTask } from './queue-pages.js';
import { attemptEntries, logsCard, progressCard } from './task-following.js';

/** Dependencies, and dependents, a task page lists: a task may have up to MAX_DEPENDENCIES of the first, any number of the second. */
const MAX_LISTED = 100;

function block(title: string, value: TaskPageInfo['payload'], what: 'payload' | 'result'): Html {
  if (value === 'hidden') return html`<section class="card"><h2>${title}</h2>${hiddenNote}</section>`;
  if (value === null)
    return html`<section class="card"><h2>${title}</h2><p class="muted">${what === 'result' ? 'No result written.' : 'No payload.'}</p></section>`;
  const kind = value.kind === 'bytes' ? `bytes (${num(value.bytes)})` : value.truncated ? `JSON (${num(value.bytes)} bytes)` : 'JSON';
  // A JSON value cut short is no longer JSON: shown as the text it starts with.
  const text = value.kind === 'bytes' ? pretty(value.head).text : value.truncated ? (value.head as string) : pretty(JSON.parse(value.head as string)).text;
  return html`<section class="card"><h2>${title} <span class="muted small">${kind}</span></h2>${truncatedNote(value, what)}<pre class="code" data-block="${what}">${text}</pre></section>`;
}

// Headers and errors often repeat what the payload held: --hide-payloads hides them too.
const hiddenNote = html`<p class="muted">Hidden: the dashboard runs with --hide-payloads.</p>`;

/** Says that a value was cut, and how large it is whole; nothing for a value shown whole. */
function truncatedNote(value: ValueExcerpt, what: string): Html {
  if (!value.truncated) return html``;
  const unit = value.kind === 'bytes' ? 'bytes' : 'characters';
  return html`<p class="muted small" data-truncated="${what}">Truncated: the first ${num(PAGE_VALUE_CHARS)} ${unit} of ${num(value.bytes)} bytes.</p>`;
}

/** A link to a task's page, named `queue/id` (a workflow may span queues). */
function taskLink(ctx: PageContext, ref: TaskRef): Html {
  return html`<a href="${href(ctx, taskPath(ref.queue, ref.id))}"><code>${ref.queue}/${ref.id}</code></a>`;
}

/** "and 12 more" under a list cut at MAX_LISTED. */
function moreNote(total: number, shown: number): Html {
  return total > shown ? html`<p class="muted small">and ${num(total - shown)} more</p>` : html``;
}

/**
 * What a dependency's row says: how it was settled (the edge keeps that after
 * the dependency's rows are gone) and what it is now. A dependency no longer
 * stored is named without a link, which would only lead to a 404.
 */
function dependencyRow(ctx: PageContext, d: DependencyPreview): Html {
  const name = `${d.queue}/${d.id}`;
  return html`<tr data-dep="${name}">
<td>${d.state === null ? html`<code>${name}</code>` : taskLink(ctx, d)}</td>
<td>${d.outcome === null ? html`<span class="muted">not yet</span>` : badge(d.outcome, d.outcome === 'completed' ? 'completed' : 'bad')}</td>
<td>${d.state === null ? html`<span class="muted">gone</span>` : badge(d.state, d.state)}</td>
</tr>`;
}

/**
 * The "Depends on" and "Dependents" sections, each only when it has rows. In
 * one region that is always there, so a refresh shows a section that appears
 * (a dependent enqueued meanwhile) or goes.
 */
async function workflowSections(ctx: PageContext, t: TaskPageInfo): Promise<Html> {
  const [deps, dependents] = await Promise.all([
    t.dependsOn.length === 0 ? Promise.resolve([]) : listTaskDependencies(ctx.inspector, t.queue, t.id, MAX_LISTED),
    listTaskDependents(ctx.inspector, t.queue, t.id, MAX_LISTED),
  ]);
  const dependsOn =
    deps.length === 0
      ? html``
      : html`<section class="card" data-list="depends-on"><h2>Depends on <span class="muted small">${num(t.dependsOn.length)}, ${num(t.waitingFor)} unfinished</span></h2>
<div class="table-wrap"><table class="deps"><thead><tr><th>Task</th><th>Outcome</th><th>State now</th></tr></thead><tbody>${deps.map((d) => dependencyRow(ctx, d))}</tbody></table></div>
${moreNote(t.dependsOn.length, deps.length)}</section>`;
  const shown = dependents.tasks;
  const dependentsBlock =
    shown.length === 0
      ? html``
      : html`<section class="card" data-list="dependents"><h2>Dependents <span class="muted small">${num(dependents.total)}</span></h2>
<div class="table-wrap"><table class="deps"><thead><tr><th>Task</th><th>State</th></tr></thead><tbody>${shown.map(
          (d) => html`<tr data-dep="${d.queue}/${d.id}"><td>${taskLink(ctx, d)}</td><td>${badge(d.state, d.state)}</td></tr>`,
        )}</tbody></table></div>
${moreNote(dependents.total, shown.length)}</section>`;
  return html`<div data-region id="r-workflow">${dependsOn}${dependentsBlock}</div>`;
}

export async function taskPage(ctx: PageContext, queue: string, id: string): Promise<PageResult> {
  const t = await taskPageInfo(ctx.inspector, queue, id, ctx.hidePayloads);
  const now = Date.now();
  const [w, workflow, attempts, logs] = await Promise.all([
    t.state === 'active' ? workersByTask(ctx.inspector).then((m) => m.get(taskKey(t.queue, t.id))) : undefined,
    workflowSections(ctx, t),
    ctx.inspector.listAttempts(t.queue, t.id),
    // At most MAX_LOG_LINES (64 KiB) kept: read whole, to say how many the page leaves out.
    ctx.hidePayloads ? ('hidden' as const) : ctx.inspector.getTaskLogs(t.queue, t.id),
  ]);
  const ops = ctx.readOnly ? [] : ALLOWED[t.state];
  const actions =
    ops.length === 0
      ? html``
      : actionForm(
          ctx,
          { queue, state: t.state },
          ops.map((op) => opButton(op, 'one', `${op}:one:${t.id}`, confirmText(op, 'one', `task ${t.id}`), OP_LABEL[op])),
        );

  const dl = (rows: [string, Html | string][]) => html`<dl class="facts">${rows.map(([k, v]) => html`<dt>${k}</dt><dd>${v}</dd>`)}</dl>`;
  const facts = dl([
    ['Queue', html`<a href="${href(ctx, queuePath(queue))}">${queue}</a>`],
    ['State', badge(t.state, t.state)],
    ['Type', html`<span data-field="type">${t.type}</span>`],
    ['Retried', `${t.retried} of ${t.maxRetry}`],
    ['Attempt', html`<span data-field="attempt">${attemptText(t)}</span>`],
    ['Timeout', t.timeout === 0 ? 'none (deadline only)' : duration(t.timeout)],
    ['Deadline', t.deadline ? html`${instant(t.deadline)} (${relative(t.deadline, now)})` : 'none'],
    ['Group', t.group ?? '–'],
    ...(t.priority === 0 ? [] : [['Priority', html`<span data-field="priority">${t.priority}</span>`] as [string, Html]]),
    ...(t.concurrencyKey === null ? [] : [['Concurrency key', html`<code data-field="concurrency-key">${t.concurrencyKey}</code>`] as [string, Html]]),
    ...(t.state === 'waiting' ? [['Waiting for', `${num(t.waitingFor)} of ${num(t.dependsOn.length)} dependencies`] as [string, string]] : []),
    ['Retention', t.retention === 0 ? 'none (deleted when done)' : duration(t.retention)],
  ]);

  // The task's events, and each run it made: with its runs recorded, they tell when it started and failed.
  const evs: { at: Date; li: Html }[] = [];
  const ev = (at: Date, label: string, detail?: string) =>
    evs.push({
      at,
      li: html`<li class="${at.getTime() > now ? 'future' : ''}"><time datetime="${datetime(at)}">${instant(at)}</time> <strong>${label}</strong> <span class="muted">${relative(at, now)}${detail ? ` · ${detail}` : ''}</span></li>`,
    });
  ev(t.enqueuedAt, 'enqueued');
  if (attempts.length > 0) evs.push(...attemptEntries(attempts, t, { hide: ctx.hidePayloads, now, live: w?.server }));
  else {
    if (w) ev(w.worker.startedAt, 'started', `by ${w.server.host}:${w.server.pid}`);
    else if (t.startedAt) ev(t.startedAt, 'started', t.leaseOwner ? `by server ${t.leaseOwner.slice(0, 8)}` : undefined);
    if (t.lastFailedAt) ev(t.lastFailedAt, 'failed', lastFailedText(t) ?? undefined);
  }
  if (t.completedAt) ev(t.completedAt, 'completed');
  if (t.nextProcessAt && t.state !== 'pending') ev(t.nextProcessAt, t.state === 'retry' ? 'next retry' : 'due');
  if (t.completedAt && t.retention > 0) ev(new Date(t.completedAt.getTime() + t.retention), 'deleted (end of retention)');
  if (t.deadline) ev(t.deadline, 'deadline');
  // Enqueued stays first: a run's start is its claim's transaction time, which can be a few ms before
  // the commit of the enqueue that claim then saw.
  const [enqueued, ...later] = evs;
  const ordered = [enqueued!, ...later.sort((a, b) => a.at.getTime() - b.at.getTime())];
  const timeline = html`<section class="card"><h2>Timeline${attempts.length > 0 ? html` <span class="muted small">${num(attempts.length)} run${attempts.length === 1 ? '' : 's'}</span>` : ''}</h2>${
    evs.length === 0
      ? html`<p class="muted">${t.state === 'pending' ? 'Waiting to be picked up.' : 'Nothing recorded yet.'}</p>`
      : html`<ol class="timeline">${ordered.map((e) => e.li)}</ol>`
  }</section>`;

  const lease =
    t.state !== 'active'
      ? html``
      : html`<section class="card" data-region id="r-lease"><h2>Lease</h2>${dl([
          [
            'Owner',
            w
              ? html`<a href="${href(ctx, '/servers')}#server-${w.server.id}"><code>${w.server.id}</code></a> (${w.server.host}, pid ${w.server.pid})`
              : html`<span class="muted">not a live server (its server is gone)</span>`,
          ],
          ['Started', w ? html`${instant(w.worker.startedAt)} (${relative(w.worker.startedAt, now)})` : '–'],
          ['Expires', w ? html`${instant(w.worker.leaseExpiresAt)} (${relative(w.worker.leaseExpiresAt, now)})` : '–'],
          ['Attempt deadline', w?.worker.deadline ? html`${instant(w.worker.deadline)} (${relative(w.worker.deadline, now)})` : '–'],
          ['Orphaned', t.isOrphaned ? html`${badge('yes', 'bad')} the lease expired; a recoverer will retry or archive the task` : 'no'],
        ])}</section>`;

  const headersBlock = html`<section class="card"><h2>Headers</h2>${headersTable(t.headers)}</section>`;
  const errorBlock =
    t.lastError === null
      ? html``
      : html`<section class="card"><h2>Last error ${t.lastFailedAt ? html`<span class="muted small">${instant(t.lastFailedAt)}</span>` : ''}</h2>${
          t.lastError === 'hidden'
            ? hiddenNote
            : html`${truncatedNote(t.lastError, 'error')}<pre class="code error-text" data-block="error">${t.lastError.head}</pre>`
        }</section>`;

  return {
    status: 200,
    body: layout(
      ctx,
      `Task ${t.id}`,
      'queues',
      html`<nav class="crumbs"><a href="${ctx.base}/">Queues</a> / <a href="${href(ctx, queuePath(queue), { state: t.state })}">${queue}</a> / <span>${t.id}</span></nav>
<div class="page-head" data-region id="r-thead"><h1><code>${t.id}</code> ${badge(t.state, t.state)}</h1><div class="head-actions">${actions}</div></div>
<div data-region id="r-progress">${progressCard(t.progress, ctx.hidePayloads)}</div>
<div class="grid2">
<section class="card" data-region id="r-facts"><h2>Task</h2>${facts}</section>
<div data-region id="r-timeline">${timeline}${lease}</div>
</div>
${errorBlock}
<div data-region id="r-logs">${logsCard(logs)}</div>
${workflow}
${block('Payload', t.payload, 'payload')}
${t.state === 'completed' || t.result !== null ? block('Result', t.result, 'result') : ''}
${headersBlock}`,
    ),
  };
}

/** The headers as a table; cut short, as the text they start with. */
function headersTable(headers: TaskPageInfo['headers']): Html {
  if (headers === 'hidden') return hiddenNote;
  if (headers.truncated) return html`${truncatedNote(headers, 'headers')}<pre class="code" data-block="headers">${headers.head}</pre>`;
  const entries = Object.entries(JSON.parse(headers.head as string) as Record<string, string>);
  if (entries.length === 0) return html`<p class="muted">None.</p>`;
  return html`<div class="table-wrap"><table class="kv"><tbody>${entries.map(([k, v]) => html`<tr><th scope="row"><code>${k}</code></th><td><code>${v}</code></td></tr>`)}</tbody></table></div>`;
}
