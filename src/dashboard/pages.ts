/**
 * The dashboard's pages: each loads what it shows through the Inspector and
 * renders it with the `html` template of ./html.ts, which escapes every
 * interpolated value. Parts that change while a page is open are wrapped in
 * `data-region` elements with an id; app.js re-fetches the page on its
 * refresh interval and replaces only the regions whose markup changed, so a
 * refresh neither flickers nor loses the boxes a user ticked.
 *
 * In read-only mode no form that acts is rendered (and actions.ts refuses
 * them anyway); with hidePayloads no payload or result leaves the server.
 */
import { FailedPreconditionError, isQueueNotFound, isTaskNotFound, isValidationError } from '../model/errors.js';
import type { Inspector } from '../inspector.js';
import { MAX_PREVIEW_PAGE_SIZE } from '../inspector-internal.js';
import type { QueueInfo } from '../model/inspector-types.js';
import type { TaskState } from '../model/task.js';
import { historyChart, type DayCounts } from './charts.js';
import { clip, datetime, duration, errorRate, instant, limitsText, num, preview, relative } from './format.js';
import { html, jsonForScript, type Html } from './html.js';
import { localPath } from './security.js';
import type { QueueSampler } from './sampler.js';

/** What every page needs besides the Inspector's data. */
export interface PageContext {
  inspector: Inspector;
  sampler: QueueSampler;
  readOnly: boolean;
  hidePayloads: boolean;
  /** The default refresh interval, ms (0: off). */
  refreshMs: number;
  /** The CSRF token for this response's forms. */
  csrf: string;
  /** Prefix of every link ('' or '/dash'). */
  base: string;
  /** The request's URL, relative to `base`. */
  url: URL;
  flash?: { ok: boolean; message: string } | undefined;
}

/** A rendered page, or a redirect a page asks for (a search that found a task id). */
export type PageResult = { status: number; body: Html } | { redirect: string };

/** The task states in the order asynqmon's tabs show them. */
export const TAB_STATES: readonly TaskState[] = ['active', 'pending', 'waiting', 'aggregating', 'scheduled', 'retry', 'archived', 'completed'];

/** Actions a task in each state allows (the same for one task, a selection, or all of a state). */
export const ALLOWED: Record<TaskState, readonly TaskOp[]> = {
  active: ['cancel'],
  pending: ['archive', 'delete'],
  aggregating: ['run', 'archive', 'delete'],
  scheduled: ['run', 'archive', 'delete'],
  retry: ['run', 'archive', 'delete'],
  archived: ['run', 'delete'],
  completed: ['delete'],
  waiting: ['run', 'archive', 'delete'],
};

export type TaskOp = 'run' | 'archive' | 'delete' | 'cancel';

export const OP_LABEL: Record<TaskOp, string> = { run: 'Run', archive: 'Archive', delete: 'Delete', cancel: 'Cancel' };

export const DEFAULT_PAGE_SIZE = 30;
export const PAGE_SIZES = [10, 30, 100, 500];
/** The largest page a list shows, whatever ?size= asks (the previews' bound: inspector.ts MAX_PREVIEW_PAGE_SIZE). */
export const MAX_PAGE_SIZE = MAX_PREVIEW_PAGE_SIZE;
/** A type search reads at most this many tasks of the state (the Inspector has no type filter). */
export const TYPE_SEARCH_SCAN = 5000;
export const HISTORY_DAYS = [7, 30, 90];
/** Running tasks listed per server on the servers page (the rest are on the queues' active tabs). */
export const MAX_WORKERS_SHOWN = 100;

// ---------------------------------------------------------------- helpers

export function href(ctx: PageContext, path: string, params: Record<string, string | number | undefined> = {}): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== '') q.set(k, String(v));
  const s = q.toString();
  return `${ctx.base}${path}${s ? `?${s}` : ''}`;
}

export const queuePath = (q: string) => `/queues/${encodeURIComponent(q)}`;
export const taskPath = (q: string, id: string) => `${queuePath(q)}/tasks/${encodeURIComponent(id)}`;

/** The current page as a `back` target for actions. */
export function here(ctx: PageContext): string {
  const u = new URL(ctx.url.href);
  u.searchParams.delete('flash');
  return u.pathname + u.search;
}

export function when(d: Date | null, now: number): Html {
  if (d === null) return html`<span class="muted">–</span>`;
  return html`<time datetime="${datetime(d)}" title="${instant(d)}">${relative(d, now)}</time>`;
}

/** A payload or result held whole (a scheduler entry's), as a one-line preview; "hidden" with hidePayloads. */
export function payloadCell(ctx: PageContext, value: unknown): Html {
  return previewCell(ctx, ctx.hidePayloads ? null : preview(value));
}

/** A preview the broker cut (model/previews.ts TaskPreview), clipped to one line; "hidden" with hidePayloads. */
export function previewCell(ctx: PageContext, text: string | null): Html {
  if (ctx.hidePayloads) return hiddenText();
  const p = clip(text ?? '');
  return p === '' ? html`<span class="muted">–</span>` : html`<code class="preview">${p}</code>`;
}

/** What shows in place of a payload, a result, headers or an error with hidePayloads. */
export function hiddenText(): Html {
  return html`<span class="muted">hidden</span>`;
}

export function hidden(fields: Record<string, string | undefined>): Html[] {
  return Object.entries(fields)
    .filter((e): e is [string, string] => e[1] !== undefined)
    .map(([k, v]) => html`<input type="hidden" name="${k}" value="${v}">`);
}

/** A POST form to /action with the CSRF token and where to come back to. */
export function actionForm(ctx: PageContext, fields: Record<string, string | undefined>, body: Html | Html[], cls = 'inline'): Html {
  return html`<form method="post" action="${ctx.base}/action" class="${cls}">${hidden({ csrf: ctx.csrf, back: here(ctx), ...fields })}${body}</form>`;
}

export function badge(text: string, kind: string): Html {
  return html`<span class="badge badge-${kind}">${text}</span>`;
}

export function tile(label: string, value: string, kind = '', id?: string): Html {
  return html`<div class="tile ${kind}"${id ? html` data-tile="${id}"` : ''}><div class="tile-value">${value}</div><div class="tile-label">${label}</div></div>`;
}

/** Whether an op on this scope destroys or moves many: those ask for confirmation. */
export function confirmText(op: TaskOp, scope: 'one' | 'selected' | 'all', what: string): string | undefined {
  if (op === 'run' && scope !== 'all') return undefined;
  const verb = { run: 'Run', archive: 'Archive', delete: 'Delete for good', cancel: 'Cancel' }[op];
  return `${verb} ${what}?`;
}

export function opButton(op: TaskOp, scope: 'one' | 'selected' | 'all', value: string, confirm: string | undefined, label: string): Html {
  const cls = op === 'delete' ? 'btn btn-danger' : op === 'run' ? 'btn btn-primary' : 'btn';
  return html`<button type="submit" class="${cls}" name="do" value="${value}" data-op="${op}" data-scope="${scope}"${confirm ? html` data-confirm="${confirm}"` : ''}>${label}</button>`;
}

export function pager(page: number, pages: number, link: (p: number) => string): Html {
  if (pages <= 1) return html``;
  const items: Html[] = [];
  const add = (p: number, label: string, current = false) =>
    items.push(current ? html`<span class="page current" aria-current="page">${label}</span>` : html`<a class="page" href="${link(p)}">${label}</a>`);
  if (page > 1) add(page - 1, '‹ Prev');
  const near = new Set([1, 2, page - 1, page, page + 1, pages - 1, pages].filter((p) => p >= 1 && p <= pages));
  let last = 0;
  for (const p of [...near].sort((a, b) => a - b)) {
    if (p > last + 1) items.push(html`<span class="page gap">…</span>`);
    add(p, num(p), p === page);
    last = p;
  }
  if (page < pages) add(page + 1, 'Next ›');
  return html`<nav class="pager" aria-label="pages">${items}</nav>`;
}

export function intParam(url: URL, name: string, def: number, min: number, max: number): number {
  const raw = url.searchParams.get(name);
  if (raw === null || !/^\d{1,10}$/.test(raw)) return def;
  return Math.min(max, Math.max(min, Number(raw)));
}

// ---------------------------------------------------------------- layout

/** The document around every page: nav, refresh control, flash message. */
export function layout(ctx: Pick<PageContext, 'base' | 'readOnly' | 'refreshMs' | 'flash'>, title: string, nav: string, body: Html | Html[]): Html {
  const link = (path: string, label: string, key: string) => html`<a href="${ctx.base}${path}"${nav === key ? html` aria-current="page"` : ''}>${label}</a>`;
  const flash = ctx.flash ? html`<div class="flash ${ctx.flash.ok ? 'flash-ok' : 'flash-err'}" role="status">${ctx.flash.message}</div>` : '';
  return html`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${title} · pgasynq</title>
<link rel="stylesheet" href="${ctx.base}/assets/app.css">
<script src="${ctx.base}/assets/app.js" defer></script>
</head>
<body data-refresh="${ctx.refreshMs}">
<header class="top">
  <a class="brand" href="${ctx.base}/">pgasynq</a>
  <nav class="main-nav">${link('/', 'Queues', 'queues')}${link('/servers', 'Servers', 'servers')}${link('/schedulers', 'Schedulers', 'schedulers')}${link('/metrics', 'Metrics', 'metrics')}</nav>
  <div class="tools">
    ${ctx.readOnly ? badge('read-only', 'muted') : ''}
    <label class="refresh">Refresh <select id="refresh-select" aria-label="refresh interval">
      <option value="0">off</option><option value="2000">2 s</option><option value="5000">5 s</option><option value="10000">10 s</option><option value="30000">30 s</option><option value="60000">60 s</option>
    </select></label>
    <span id="updated" class="muted" aria-live="polite"></span>
  </div>
</header>
<main>
${flash}
${body}
</main>
</body>
</html>`;
}

export function errorPage(ctx: Pick<PageContext, 'base' | 'readOnly' | 'refreshMs'>, status: number, message: string): Html {
  const title = status === 404 ? 'Not found' : status === 400 ? 'Bad request' : status === 401 ? 'Token required' : status === 403 ? 'Forbidden' : 'Error';
  return layout(
    { ...ctx, flash: undefined },
    title,
    '',
    html`<section class="card error-page"><h1>${status} · ${title}</h1><p>${message}</p><p><a href="${ctx.base}/">Back to the queues</a></p></section>`,
  );
}

/** A page for the token: what to do, nothing else (no data, no forms). */
export function tokenPage(): Html {
  return html`<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>Token required · pgasynq</title></head>
<body><h1>401 · Token required</h1><p>This dashboard was started with <code>--token</code>. Open it once as <code>/?token=YOUR_TOKEN</code> (a cookie keeps you in), or send <code>Authorization: Bearer YOUR_TOKEN</code>.</p></body></html>`;
}

/** Asks again before a destructive action when the browser ran no script (app.js asks with confirm()). */
export function confirmPage(ctx: PageContext, fields: Record<string, string[]>, question: string): Html {
  const inputs = Object.entries(fields).flatMap(([k, vs]) =>
    k === 'csrf' || k === 'confirmed' ? [] : vs.map((v) => html`<input type="hidden" name="${k}" value="${v}">`),
  );
  const back = localPath(fields.back?.[0]);
  return layout(
    ctx,
    'Confirm',
    '',
    html`<section class="card"><h1>Confirm</h1><p>${question}</p>
<form method="post" action="${ctx.base}/action">${hidden({ csrf: ctx.csrf, confirmed: '1' })}${inputs}<button class="btn btn-danger" type="submit">Yes, go ahead</button> <a class="btn" href="${ctx.base}${back}">Cancel</a></form></section>`,
  );
}

// ---------------------------------------------------------------- overview

async function historyTotals(inspector: Inspector, queues: readonly string[], days: number): Promise<DayCounts[]> {
  const all = await Promise.all(queues.map((q) => inspector.history(q, days).catch((err: unknown) => (isQueueNotFound(err) ? [] : Promise.reject(err)))));
  const byDay = new Map<number, DayCounts>();
  for (const list of all) {
    for (const d of list) {
      const k = d.date.getTime();
      const acc = byDay.get(k) ?? { date: d.date, processed: 0, failed: 0 };
      acc.processed += d.processed;
      acc.failed += d.failed;
      byDay.set(k, acc);
    }
  }
  if (byDay.size === 0) {
    // No queue yet: still draw the days.
    const today = Date.UTC(new Date().getUTCFullYear(), new Date().getUTCMonth(), new Date().getUTCDate());
    for (let i = 0; i < days; i++) byDay.set(today - i * 86_400_000, { date: new Date(today - i * 86_400_000), processed: 0, failed: 0 });
  }
  return [...byDay.values()].sort((a, b) => a.date.getTime() - b.date.getTime());
}

export function stateCell(ctx: PageContext, q: QueueInfo, state: TaskState): Html {
  const n = q[state];
  const cls = n === 0 ? 'num muted' : state === 'archived' || state === 'retry' ? `num warn-${state}` : 'num';
  return html`<td class="${cls}" data-col="${state}"><a href="${href(ctx, queuePath(q.queue), { state })}">${num(n)}</a></td>`;
}

/** A "limited" marker for a queue with limits, which it names on hover; nothing without. */
function limitedBadge(q: QueueInfo): Html {
  const text = limitsText(q.limits);
  return text === '' ? html`` : html` <span class="badge badge-muted" data-limits title="${text}">limited</span>`;
}

export function pauseForm(ctx: PageContext, q: QueueInfo): Html {
  if (ctx.readOnly) return html``;
  return q.paused
    ? actionForm(ctx, { queue: q.queue }, opQueueButton('resume', 'Resume', undefined))
    : actionForm(ctx, { queue: q.queue }, opQueueButton('pause', 'Pause', `Pause queue ${q.queue}? Servers stop taking its tasks until you resume it.`));
}

export function opQueueButton(op: string, label: string, confirm: string | undefined, cls = 'btn'): Html {
  return html`<button type="submit" class="${cls}" name="do" value="${op}" data-op="${op}"${confirm ? html` data-confirm="${confirm}"` : ''}>${label}</button>`;
}

export async function overviewPage(ctx: PageContext): Promise<PageResult> {
  const days = HISTORY_DAYS.includes(Number(ctx.url.searchParams.get('days'))) ? Number(ctx.url.searchParams.get('days')) : 7;
  const infos = await ctx.sampler.infos();
  const history = await historyTotals(
    ctx.inspector,
    infos.map((q) => q.queue),
    days,
  );
  const sum = (k: keyof QueueInfo) => infos.reduce((n, q) => n + (q[k] as number), 0);
  const processed = sum('processed');
  const failed = sum('failed');
  const now = Date.now();

  const summary = html`<section class="tiles" data-region id="r-summary">
${tile('queues', num(infos.length), '', 'queues')}${tile('tasks', num(sum('size')), '', 'size')}${tile('pending', num(sum('pending')), '', 'pending')}${tile('active', num(sum('active')), '', 'active')}${tile('retry', num(sum('retry')), sum('retry') > 0 ? 'tile-warn' : '', 'retry')}${tile('archived', num(sum('archived')), sum('archived') > 0 ? 'tile-bad' : '', 'archived')}${tile('processed today', num(processed), '', 'processed')}${tile('failed today', num(failed), failed > 0 ? 'tile-bad' : '', 'failed')}${tile('error rate today', errorRate(failed, processed), '', 'error-rate')}
</section>`;

  const live = html`<section class="card chart-card" id="live">
<div class="card-head"><h2>Queue sizes, live</h2>
<select id="live-metric" aria-label="series">
<option value="size">size (all states)</option><option value="pending">pending</option><option value="active">active</option><option value="waiting">waiting</option><option value="scheduled">scheduled</option><option value="retry">retry</option><option value="archived">archived</option><option value="completed">completed</option>
</select></div>
<div id="live-chart" class="live-chart" data-src="${ctx.base}/api/overview"><p class="muted">Drawn by the page's script from /api/overview.</p></div>
<script type="application/json" id="live-data">${jsonForScript({ samples: ctx.sampler.samples() })}</script>
</section>`;

  const daysLinks = HISTORY_DAYS.map((d) =>
    d === days ? html`<span class="seg current">${d} days</span>` : html`<a class="seg" href="${href(ctx, '/', { days: d })}">${d} days</a>`,
  );
  const hist = html`<section class="card chart-card" data-region id="r-history">
<div class="card-head"><h2>Processed per day (UTC, all queues)</h2><span class="segs">${daysLinks}</span></div>
${historyChart(history, `processed and failed per day, last ${days} days`)}
</section>`;

  const rows = infos.map(
    (q) => html`<tr data-queue="${q.queue}">
<th scope="row"><a href="${href(ctx, queuePath(q.queue))}">${q.queue}</a>${q.paused ? html` ${badge('paused', 'warn')}` : ''}${limitedBadge(q)}</th>
${TAB_STATES.map((s) => stateCell(ctx, q, s))}
<td class="num" data-col="size">${num(q.size)}</td>
<td class="num" data-col="latency">${duration(q.latency)}</td>
<td class="num" data-col="processed">${num(q.processed)}</td>
<td class="num${q.failed > 0 ? ' bad' : ''}" data-col="failed">${num(q.failed)}</td>
<td class="num" data-col="error-rate">${errorRate(q.failed, q.processed)}</td>
<td data-col="paused">${q.paused ? 'yes' : 'no'}</td>
${ctx.readOnly ? '' : html`<td class="actions">${pauseForm(ctx, q)}</td>`}
</tr>`,
  );
  const table =
    infos.length === 0
      ? html`<p class="empty">No queues yet: a queue exists once a task was enqueued to it.</p>`
      : html`<div class="table-wrap"><table class="queues">
<thead><tr><th>Queue</th>${TAB_STATES.map((s) => html`<th class="num">${s}</th>`)}<th class="num">size</th><th class="num">latency</th><th class="num" title="today, UTC">processed</th><th class="num" title="today, UTC">failed</th><th class="num">error rate</th><th>paused</th>${ctx.readOnly ? '' : html`<th></th>`}</tr></thead>
<tbody>${rows}</tbody></table></div>`;

  return {
    status: 200,
    body: layout(
      ctx,
      'Queues',
      'queues',
      html`<h1>Queues</h1>
${summary}
<div class="grid2">${live}${hist}</div>
<section class="card" data-region id="r-queues"><div class="card-head"><h2>Queues</h2><span class="muted">processed and failed: today, UTC · as of ${instant(infos[0]?.timestamp ?? new Date(now))}</span></div>${table}</section>`,
    ),
  };
}

/** The JSON the live chart polls: current counts and the samples of the last minutes. No payloads. */
export async function overviewJson(ctx: Pick<PageContext, 'sampler'>): Promise<unknown> {
  const infos = await ctx.sampler.infos();
  return {
    now: (infos[0]?.timestamp ?? new Date()).getTime(),
    queues: infos.map((q) => ({
      queue: q.queue,
      size: q.size,
      pending: q.pending,
      active: q.active,
      scheduled: q.scheduled,
      retry: q.retry,
      archived: q.archived,
      completed: q.completed,
      aggregating: q.aggregating,
      waiting: q.waiting,
      latency: q.latency,
      processed: q.processed,
      failed: q.failed,
      paused: q.paused,
    })),
    samples: ctx.sampler.samples(),
  };
}

// ---------------------------------------------------------------- queue page

export function statusOf(err: unknown): number {
  if (isQueueNotFound(err) || isTaskNotFound(err)) return 404;
  if (isValidationError(err)) return 400;
  if (err instanceof FailedPreconditionError) return 409;
  return 500;
}
