/** The servers page and the scheduler pages. */
import { listServerPreviews } from '../inspector-internal.js';
import { instant, num, preview, relative } from './format.js';
import { html } from './html.js';
import {
  MAX_WORKERS_SHOWN,
  type PageContext,
  type PageResult,
  badge,
  href,
  intParam,
  layout,
  payloadCell,
  previewCell,
  queuePath,
  taskPath,
  when,
} from './pages.js';

/** An entry's options as one line; with hidePayloads its headers are hidden (they often repeat payload data). */
function optionsText(ctx: PageContext, options: Record<string, unknown>): string {
  return preview(ctx.hidePayloads && options.headers !== undefined ? { ...options, headers: 'hidden' } : options);
}

export async function serversPage(ctx: PageContext): Promise<PageResult> {
  // Payload previews cut in PostgreSQL: a server running tasks of megabyte payloads costs this page a few hundred bytes each.
  const servers = await listServerPreviews(ctx.inspector, ctx.hidePayloads);
  const now = Date.now();
  const cards = servers.map((s) => {
    const weights = Object.entries(s.queues)
      .sort((a, b) => b[1] - a[1])
      .map(([q, wt]) => html`<a class="chip" href="${href(ctx, queuePath(q))}">${q} <span class="count">${wt}</span></a>`);
    const shown = s.activeWorkers.slice(0, MAX_WORKERS_SHOWN);
    const more = s.activeWorkers.length - shown.length;
    const workers =
      s.activeWorkers.length === 0
        ? html`<p class="muted">Idle.</p>`
        : html`<div class="table-wrap"><table class="workers"><thead><tr><th>Task</th><th>Queue</th><th>Type</th><th>Payload</th><th>Started</th><th>Lease expires</th><th>Deadline</th></tr></thead><tbody>${shown.map(
            (w) =>
              html`<tr data-task-id="${w.taskId}"><td class="id"><a href="${href(ctx, taskPath(w.queue, w.taskId))}"><code>${w.taskId}</code></a></td><td>${w.queue}</td><td class="type">${w.type}</td><td class="payload">${previewCell(ctx, w.payload)}</td><td>${when(w.startedAt, now)}</td><td>${when(w.leaseExpiresAt, now)}</td><td>${when(w.deadline, now)}</td></tr>`,
          )}</tbody></table></div>${more > 0 ? html`<p class="note">… and ${num(more)} more, the longest-running first: see each queue's active tab.</p>` : ''}`;
    const busy = s.activeWorkers.length;
    return html`<section class="card server" id="server-${s.id}" data-server-id="${s.id}">
<div class="card-head"><h2>${s.host} <span class="muted small">pid ${s.pid}</span></h2>${badge(s.status, s.status === 'active' ? 'ok' : 'warn')}</div>
<dl class="facts inline-facts"><dt>ID</dt><dd><code>${s.id}</code></dd><dt>Started</dt><dd>${instant(s.startedAt)} (${relative(s.startedAt, now)})</dd><dt>Busy</dt><dd data-field="busy">${busy} / ${s.concurrency}</dd><dt>Queues</dt><dd>${weights} ${s.strictPriority ? badge('strict priority', 'muted') : ''}</dd></dl>
<div class="meter" role="img" aria-label="${busy} of ${s.concurrency} workers busy"><svg viewBox="0 0 100 6" class="meter-svg" preserveAspectRatio="none"><rect class="meter-bg" x="0" y="0" width="100" height="6"></rect><rect class="meter-fg" x="0" y="0" width="${s.concurrency === 0 ? 0 : Math.min(100, (100 * busy) / s.concurrency).toFixed(1)}" height="6"></rect></svg></div>
<h3>Running (${busy})</h3>${workers}
</section>`;
  });
  return {
    status: 200,
    body: layout(
      ctx,
      'Servers',
      'servers',
      html`<h1>Servers</h1><div data-region id="r-servers">${servers.length === 0 ? html`<p class="empty card">No live server.</p>` : cards}</div>`,
    ),
  };
}

// ---------------------------------------------------------------- schedulers

export async function schedulersPage(ctx: PageContext): Promise<PageResult> {
  const entries = await ctx.inspector.schedulerEntries();
  const now = Date.now();
  const rows = entries.map(
    (e) => html`<tr data-entry-id="${e.id}">
<td class="id"><a href="${href(ctx, `/schedulers/${encodeURIComponent(e.id)}`)}"><code>${e.id}</code></a></td>
<td><code>${e.spec}</code></td>
<td class="type">${e.task.type}</td>
<td class="payload">${payloadCell(ctx, e.task.payload)}</td>
<td><code class="preview">${optionsText(ctx, e.options)}</code></td>
<td data-col="next">${when(e.next, now)}</td>
<td data-col="prev">${when(e.prev, now)}</td>
</tr>`,
  );
  return {
    status: 200,
    body: layout(
      ctx,
      'Schedulers',
      'schedulers',
      html`<h1>Scheduler entries</h1><section class="card" data-region id="r-entries">${
        entries.length === 0
          ? html`<p class="empty">No entry: no scheduler is running (entries show within a scheduler heartbeat).</p>`
          : html`<div class="table-wrap"><table class="entries"><thead><tr><th>Entry</th><th>Spec</th><th>Type</th><th>Payload</th><th>Options</th><th>Next</th><th>Previous</th></tr></thead><tbody>${rows}</tbody></table></div>`
      }</section>`,
    ),
  };
}

export async function schedulerEntryPage(ctx: PageContext, entryId: string): Promise<PageResult> {
  const pageSize = 30;
  const page = intParam(ctx.url, 'page', 1, 1, 1_000_000);
  const [entries, events] = await Promise.all([ctx.inspector.schedulerEntries(), ctx.inspector.listSchedulerEnqueueEvents(entryId, { page, pageSize })]);
  const entry = entries.find((e) => e.id === entryId);
  const now = Date.now();
  const queue = typeof entry?.options.queue === 'string' ? entry.options.queue : 'default';
  const facts = entry
    ? html`<dl class="facts"><dt>Spec</dt><dd><code>${entry.spec}</code></dd><dt>Type</dt><dd>${entry.task.type}</dd><dt>Payload</dt><dd>${payloadCell(ctx, entry.task.payload)}</dd><dt>Options</dt><dd><code class="preview">${optionsText(ctx, entry.options)}</code></dd><dt>Next</dt><dd>${entry.next ? html`${instant(entry.next)} (${relative(entry.next, now)})` : '–'}</dd><dt>Previous</dt><dd>${entry.prev ? html`${instant(entry.prev)} (${relative(entry.prev, now)})` : '–'}</dd></dl>`
    : html`<p class="muted">No live scheduler has this entry now; its history is kept.</p>`;
  const rows = events.map(
    (e) =>
      html`<tr><td class="id"><a href="${href(ctx, taskPath(queue, e.taskId))}"><code>${e.taskId}</code></a></td><td>${instant(e.tickAt)}</td><td>${instant(e.enqueuedAt)} <span class="muted">(${relative(e.enqueuedAt, now)})</span></td></tr>`,
  );
  const prev = page > 1 ? html`<a class="page" href="${href(ctx, `/schedulers/${encodeURIComponent(entryId)}`, { page: page - 1 })}">‹ Newer</a>` : '';
  const next =
    events.length === pageSize ? html`<a class="page" href="${href(ctx, `/schedulers/${encodeURIComponent(entryId)}`, { page: page + 1 })}">Older ›</a>` : '';
  return {
    status: 200,
    body: layout(
      ctx,
      `Entry ${entryId}`,
      'schedulers',
      html`<nav class="crumbs"><a href="${ctx.base}/schedulers">Schedulers</a> / <span>${entryId}</span></nav>
<h1>Entry <code>${entryId}</code></h1>
<section class="card" data-region id="r-entry">${facts}</section>
<section class="card" data-region id="r-events"><h2>Enqueue history <span class="muted small">newest first</span></h2>${
        events.length === 0
          ? html`<p class="empty">No enqueue recorded${page > 1 ? ' on this page' : ''}.</p>`
          : html`<div class="table-wrap"><table class="events"><thead><tr><th>Task</th><th>Tick</th><th>Enqueued</th></tr></thead><tbody>${rows}</tbody></table></div>`
      }<nav class="pager">${prev}${next}</nav></section>`,
    ),
  };
}

/** Errors a page turns into a status: unknown queue or task 404, bad input 400, a refused action 409. */
