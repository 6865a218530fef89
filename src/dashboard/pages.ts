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
import { FailedPreconditionError, isQueueNotFound, isTaskNotFound, isValidationError } from '../errors.js';
import type { Inspector } from '../inspector.js';
import type { QueueInfo, ServerInfo, WorkerInfo } from '../inspector-types.js';
import type { TaskInfo, TaskState } from '../task.js';
import { historyChart, type DayCounts } from './charts.js';
import { duration, errorRate, instant, num, preview, pretty, relative } from './format.js';
import { html, jsonForScript, type Html } from './html.js';
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
export const TAB_STATES: readonly TaskState[] = ['active', 'pending', 'aggregating', 'scheduled', 'retry', 'archived', 'completed'];

/** Actions a task in each state allows (the same for one task, a selection, or all of a state). */
export const ALLOWED: Record<TaskState, readonly TaskOp[]> = {
  active: ['cancel'],
  pending: ['archive', 'delete'],
  aggregating: ['run', 'archive', 'delete'],
  scheduled: ['run', 'archive', 'delete'],
  retry: ['run', 'archive', 'delete'],
  archived: ['run', 'delete'],
  completed: ['delete'],
};

export type TaskOp = 'run' | 'archive' | 'delete' | 'cancel';

const OP_LABEL: Record<TaskOp, string> = { run: 'Run', archive: 'Archive', delete: 'Delete', cancel: 'Cancel' };

const DEFAULT_PAGE_SIZE = 30;
const PAGE_SIZES = [10, 30, 100, 500];
/** A type search reads at most this many tasks of the state (the Inspector has no type filter). */
export const TYPE_SEARCH_SCAN = 5000;
const HISTORY_DAYS = [7, 30, 90];
/** Running tasks listed per server on the servers page (the rest are on the queues' active tabs). */
const MAX_WORKERS_SHOWN = 100;

// ---------------------------------------------------------------- helpers

function href(ctx: PageContext, path: string, params: Record<string, string | number | undefined> = {}): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== '') q.set(k, String(v));
  const s = q.toString();
  return `${ctx.base}${path}${s ? `?${s}` : ''}`;
}

const queuePath = (q: string) => `/queues/${encodeURIComponent(q)}`;
const taskPath = (q: string, id: string) => `${queuePath(q)}/tasks/${encodeURIComponent(id)}`;

/** The current page as a `back` target for actions. */
function here(ctx: PageContext): string {
  const u = new URL(ctx.url.href);
  u.searchParams.delete('flash');
  return u.pathname + u.search;
}

function when(d: Date | null, now: number): Html {
  if (d === null) return html`<span class="muted">–</span>`;
  return html`<time datetime="${d.toISOString()}" title="${instant(d)}">${relative(d, now)}</time>`;
}

function payloadCell(ctx: PageContext, value: unknown): Html {
  if (ctx.hidePayloads) return html`<span class="muted">hidden</span>`;
  const p = preview(value);
  return p === '' ? html`<span class="muted">–</span>` : html`<code class="preview">${p}</code>`;
}

function hidden(fields: Record<string, string | undefined>): Html[] {
  return Object.entries(fields)
    .filter((e): e is [string, string] => e[1] !== undefined)
    .map(([k, v]) => html`<input type="hidden" name="${k}" value="${v}">`);
}

/** A POST form to /action with the CSRF token and where to come back to. */
function actionForm(ctx: PageContext, fields: Record<string, string | undefined>, body: Html | Html[], cls = 'inline'): Html {
  return html`<form method="post" action="${ctx.base}/action" class="${cls}">${hidden({ csrf: ctx.csrf, back: here(ctx), ...fields })}${body}</form>`;
}

function badge(text: string, kind: string): Html {
  return html`<span class="badge badge-${kind}">${text}</span>`;
}

function tile(label: string, value: string, kind = '', id?: string): Html {
  return html`<div class="tile ${kind}"${id ? html` data-tile="${id}"` : ''}><div class="tile-value">${value}</div><div class="tile-label">${label}</div></div>`;
}

/** Whether an op on this scope destroys or moves many: those ask for confirmation. */
function confirmText(op: TaskOp, scope: 'one' | 'selected' | 'all', what: string): string | undefined {
  if (op === 'run' && scope !== 'all') return undefined;
  const verb = { run: 'Run', archive: 'Archive', delete: 'Delete for good', cancel: 'Cancel' }[op];
  return `${verb} ${what}?`;
}

function opButton(op: TaskOp, scope: 'one' | 'selected' | 'all', value: string, confirm: string | undefined, label: string): Html {
  const cls = op === 'delete' ? 'btn btn-danger' : op === 'run' ? 'btn btn-primary' : 'btn';
  return html`<button type="submit" class="${cls}" name="do" value="${value}" data-op="${op}" data-scope="${scope}"${confirm ? html` data-confirm="${confirm}"` : ''}>${label}</button>`;
}

function pager(page: number, pages: number, link: (p: number) => string): Html {
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

function intParam(url: URL, name: string, def: number, min: number, max: number): number {
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
  return layout({ ...ctx, flash: undefined }, title, '', html`<section class="card error-page"><h1>${status} · ${title}</h1><p>${message}</p><p><a href="${ctx.base}/">Back to the queues</a></p></section>`);
}

/** A page for the token: what to do, nothing else (no data, no forms). */
export function tokenPage(): Html {
  return html`<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>Token required · pgasynq</title></head>
<body><h1>401 · Token required</h1><p>This dashboard was started with <code>--token</code>. Open it once as <code>/?token=YOUR_TOKEN</code> (a cookie keeps you in), or send <code>Authorization: Bearer YOUR_TOKEN</code>.</p></body></html>`;
}

/** Asks again before a destructive action when the browser ran no script (app.js asks with confirm()). */
export function confirmPage(ctx: PageContext, fields: Record<string, string[]>, question: string): Html {
  const inputs = Object.entries(fields).flatMap(([k, vs]) => (k === 'csrf' || k === 'confirmed' ? [] : vs.map((v) => html`<input type="hidden" name="${k}" value="${v}">`)));
  const wanted = fields.back?.[0] ?? '/';
  const back = wanted.startsWith('/') && !wanted.startsWith('//') && !wanted.includes('\\') ? wanted : '/';
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

function stateCell(ctx: PageContext, q: QueueInfo, state: TaskState): Html {
  const n = q[state];
  const cls = n === 0 ? 'num muted' : state === 'archived' || state === 'retry' ? `num warn-${state}` : 'num';
  return html`<td class="${cls}" data-col="${state}"><a href="${href(ctx, queuePath(q.queue), { state })}">${num(n)}</a></td>`;
}

function pauseForm(ctx: PageContext, q: QueueInfo): Html {
  if (ctx.readOnly) return html``;
  return q.paused
    ? actionForm(ctx, { queue: q.queue }, opQueueButton('resume', 'Resume', undefined))
    : actionForm(ctx, { queue: q.queue }, opQueueButton('pause', 'Pause', `Pause queue ${q.queue}? Servers stop taking its tasks until you resume it.`));
}

function opQueueButton(op: string, label: string, confirm: string | undefined, cls = 'btn'): Html {
  return html`<button type="submit" class="${cls}" name="do" value="${op}" data-op="${op}"${confirm ? html` data-confirm="${confirm}"` : ''}>${label}</button>`;
}

export async function overviewPage(ctx: PageContext): Promise<PageResult> {
  const days = HISTORY_DAYS.includes(Number(ctx.url.searchParams.get('days'))) ? Number(ctx.url.searchParams.get('days')) : 7;
  const infos = await ctx.sampler.infos();
  const history = await historyTotals(ctx.inspector, infos.map((q) => q.queue), days);
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
<option value="size">size (all states)</option><option value="pending">pending</option><option value="active">active</option><option value="scheduled">scheduled</option><option value="retry">retry</option><option value="archived">archived</option><option value="completed">completed</option>
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
<th scope="row"><a href="${href(ctx, queuePath(q.queue))}">${q.queue}</a>${q.paused ? html` ${badge('paused', 'warn')}` : ''}</th>
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
      latency: q.latency,
      processed: q.processed,
      failed: q.failed,
      paused: q.paused,
    })),
    samples: ctx.sampler.samples(),
  };
}

// ---------------------------------------------------------------- queue page

function listOf(inspector: Inspector, state: TaskState, queue: string, group: string | undefined, page: number, pageSize: number): Promise<TaskInfo[]> {
  const o = { page, pageSize };
  switch (state) {
    case 'pending':
      return inspector.listPendingTasks(queue, o);
    case 'active':
      return inspector.listActiveTasks(queue, o);
    case 'scheduled':
      return inspector.listScheduledTasks(queue, o);
    case 'retry':
      return inspector.listRetryTasks(queue, o);
    case 'archived':
      return inspector.listArchivedTasks(queue, o);
    case 'completed':
      return inspector.listCompletedTasks(queue, o);
    case 'aggregating':
      return group === undefined ? Promise.resolve([]) : inspector.listAggregatingTasks(queue, group, o);
  }
}

/** Which server holds each active task, from the live servers' workers. */
async function workersByTask(inspector: Inspector): Promise<Map<string, { server: ServerInfo; worker: WorkerInfo }>> {
  const out = new Map<string, { server: ServerInfo; worker: WorkerInfo }>();
  for (const server of await inspector.servers()) for (const worker of server.activeWorkers) out.set(`${worker.queue}\u0000${worker.taskId}`, { server, worker });
  return out;
}

function errorCell(t: TaskInfo): Html {
  if (t.lastError === null) return html`<td class="muted">–</td>`;
  const short = t.lastError.length > 120 ? `${t.lastError.slice(0, 119)}…` : t.lastError;
  return html`<td class="error-text" title="${t.lastError.slice(0, 1000)}">${short}</td>`;
}

function stateColumns(state: TaskState): string[] {
  switch (state) {
    case 'active':
      return ['started', 'lease', 'server'];
    case 'pending':
      return ['retried'];
    case 'scheduled':
      return ['process at'];
    case 'retry':
      return ['next retry', 'retried', 'last error'];
    case 'archived':
      return ['last failed', 'retried', 'last error'];
    case 'completed':
      return ['completed', 'result', 'kept until'];
    case 'aggregating':
      return ['group'];
  }
}

function stateCells(ctx: PageContext, t: TaskInfo, now: number, workers: Map<string, { server: ServerInfo; worker: WorkerInfo }>): Html {
  const retried = html`<td class="num">${t.retried} / ${t.maxRetry}</td>`;
  switch (t.state) {
    case 'active': {
      const w = workers.get(`${t.queue}\u0000${t.id}`);
      const lease = t.isOrphaned ? badge('orphaned', 'bad') : w ? html`expires ${when(w.worker.leaseExpiresAt, now)}` : html`<span class="muted">–</span>`;
      return html`<td>${w ? when(w.worker.startedAt, now) : html`<span class="muted">–</span>`}</td><td>${lease}</td><td>${w ? html`<a href="${href(ctx, '/servers')}#server-${w.server.id}">${w.server.host}:${w.server.pid}</a>` : html`<span class="muted">gone</span>`}</td>`;
    }
    case 'pending':
      return retried;
    case 'scheduled':
      return html`<td>${when(t.nextProcessAt, now)}</td>`;
    case 'retry':
      return html`<td>${when(t.nextProcessAt, now)}</td>${retried}${errorCell(t)}`;
    case 'archived':
      return html`<td>${when(t.lastFailedAt, now)}</td>${retried}${errorCell(t)}`;
    case 'completed':
      return html`<td>${when(t.completedAt, now)}</td><td>${payloadCell(ctx, t.result)}</td><td>${when(t.completedAt === null ? null : new Date(t.completedAt.getTime() + t.retention), now)}</td>`;
    case 'aggregating':
      return html`<td>${t.group ?? ''}</td>`;
  }
}

/** Lists up to TYPE_SEARCH_SCAN tasks of the state and keeps those whose type contains `needle` (case-insensitive). */
async function searchByType(ctx: PageContext, queue: string, state: TaskState, group: string | undefined, needle: string, count: number): Promise<{ tasks: TaskInfo[]; scanned: number }> {
  const pageSize = 1000;
  const n = needle.toLowerCase();
  const out: TaskInfo[] = [];
  let scanned = 0;
  for (let page = 1; scanned < Math.min(count, TYPE_SEARCH_SCAN); page++) {
    const tasks = await listOf(ctx.inspector, state, queue, group, page, pageSize);
    scanned += tasks.length;
    for (const t of tasks) if (t.type.toLowerCase().includes(n) && out.length < 500) out.push(t);
    if (tasks.length < pageSize) break;
  }
  return { tasks: out, scanned };
}

export async function queuePage(ctx: PageContext, queue: string): Promise<PageResult> {
  const url = ctx.url;
  const stateParam = url.searchParams.get('state');
  const search = (url.searchParams.get('search') ?? '').trim();

  // A search that is a task id of this queue opens the task.
  if (search !== '' && /^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$/.test(search)) {
    try {
      const t = await ctx.inspector.getTaskInfo(queue, search);
      return { redirect: taskPath(t.queue, t.id) };
    } catch (err) {
      if (!isTaskNotFound(err) && !isValidationError(err)) throw err;
    }
  }

  const info = await ctx.inspector.getQueueInfo(queue);
  const state: TaskState = (TAB_STATES as readonly string[]).includes(stateParam ?? '') ? (stateParam as TaskState) : info.active > 0 ? 'active' : 'pending';
  const pageSize = intParam(url, 'size', DEFAULT_PAGE_SIZE, 1, 1000);
  const now = Date.now();

  let group: string | undefined;
  let groupSize = 0;
  let groupsNav: Html = html``;
  if (state === 'aggregating') {
    const groups = await ctx.inspector.groups(queue);
    const wanted = url.searchParams.get('group');
    const chosen = groups.find((g) => g.group === wanted) ?? groups[0];
    group = chosen?.group;
    groupSize = chosen?.size ?? 0;
    groupsNav = groups.length === 0
      ? html``
      : html`<nav class="groups" aria-label="groups"><span class="muted">Groups:</span> ${groups.map((g) =>
          g.group === group
            ? html`<span class="seg current" data-group="${g.group}">${g.group} <span class="count">${num(g.size)}</span></span>`
            : html`<a class="seg" data-group="${g.group}" href="${href(ctx, queuePath(queue), { state, group: g.group })}">${g.group} <span class="count">${num(g.size)}</span></a>`,
        )}</nav>`;
  }
  const stateCount = state === 'aggregating' ? groupSize : info[state];
  const pages = Math.max(1, Math.ceil(stateCount / pageSize));
  const page = intParam(url, 'page', 1, 1, pages);

  let tasks: TaskInfo[];
  let searchNote: Html = html``;
  if (search !== '') {
    const r = await searchByType(ctx, queue, state, group, search, stateCount);
    tasks = r.tasks;
    searchNote = html`<p class="note" data-search-result>${num(tasks.length)}${tasks.length === 500 ? '+' : ''} ${state} task(s) whose type contains “${search}”${
      r.scanned < stateCount ? html` among the first ${num(r.scanned)} of ${num(stateCount)}` : ''
    }. No task has this id. <a href="${href(ctx, queuePath(queue), { state, group })}">Clear</a></p>`;
  } else {
    tasks = await listOf(ctx.inspector, state, queue, group, page, pageSize);
  }
  const workers = state === 'active' ? await workersByTask(ctx.inspector) : new Map<string, { server: ServerInfo; worker: WorkerInfo }>();

  const tabs = TAB_STATES.map((s) => {
    const current = s === state;
    return html`<a class="tab${current ? ' current' : ''}" href="${href(ctx, queuePath(queue), { state: s })}" data-state="${s}"${current ? html` aria-current="page"` : ''}>${s} <span class="count">${num(info[s])}</span></a>`;
  });

  const ops = ALLOWED[state];
  const canAct = !ctx.readOnly && ops.length > 0;
  const what = state === 'aggregating' ? `group ${group ?? ''}` : `queue ${queue}`;
  const rows = tasks.map(
    (t) => html`<tr data-task-id="${t.id}">
${canAct ? html`<td class="check"><input type="checkbox" name="id" value="${t.id}" aria-label="select ${t.id}"></td>` : ''}
<td class="id"><a href="${href(ctx, taskPath(queue, t.id))}"><code>${t.id}</code></a></td>
<td class="type">${t.type}</td>
<td class="payload">${payloadCell(ctx, t.payload)}</td>
${stateCells(ctx, t, now, workers)}
${canAct ? html`<td class="actions">${ops.map((op) => opButton(op, 'one', `${op}:one:${t.id}`, confirmText(op, 'one', `task ${t.id}`), OP_LABEL[op]))}</td>` : ''}
</tr>`,
  );
  const bulk = canAct
    ? html`<div class="bulk">
<span class="bulk-group"><span class="muted">Selected:</span> ${ops.map((op) => opButton(op, 'selected', `${op}:selected`, confirmText(op, 'selected', 'the selected tasks'), OP_LABEL[op]))}</span>
<span class="bulk-group"><span class="muted">All ${num(stateCount)} ${state}:</span> ${ops.map((op) =>
        opButton(op, 'all', `${op}:all`, confirmText(op, 'all', `all ${num(stateCount)} ${state} tasks of ${what}`), `${OP_LABEL[op]} all`),
      )}</span>
</div>`
    : html``;
  const head = html`<tr>${canAct ? html`<th class="check"><input type="checkbox" data-select-all aria-label="select all on this page"></th>` : ''}<th>ID</th><th>Type</th><th>Payload</th>${stateColumns(state).map((c) => html`<th${c === 'retried' ? html` class="num"` : ''}>${c}</th>`)}${canAct ? html`<th></th>` : ''}</tr>`;
  const tableBody =
    tasks.length === 0
      ? html`<p class="empty">No ${state} tasks${state === 'aggregating' && group !== undefined ? html` in group ${group}` : ''}.</p>`
      : html`<div class="table-wrap"><table class="tasks" data-state="${state}"><thead>${head}</thead><tbody>${rows}</tbody></table></div>`;
  const list = canAct && stateCount > 0 ? actionForm(ctx, { queue, state, group }, [bulk, tableBody], 'task-form') : tableBody;
  const pageLinks = search === '' ? pager(page, pages, (p) => href(ctx, queuePath(queue), { state, group, page: p, size: pageSize === DEFAULT_PAGE_SIZE ? undefined : pageSize })) : html``;
  const sizes = html`<span class="page-sizes muted">Per page: ${PAGE_SIZES.map((s) =>
    s === pageSize ? html`<span class="seg current">${s}</span>` : html`<a class="seg" href="${href(ctx, queuePath(queue), { state, group, size: s === DEFAULT_PAGE_SIZE ? undefined : s })}">${s}</a>`,
  )}</span>`;

  const [history] = await Promise.all([ctx.inspector.history(queue, 14)]);
  const queueActions = ctx.readOnly
    ? html``
    : html`${pauseForm(ctx, info)}${
        info.size === 0 ? actionForm(ctx, { queue }, opQueueButton('delete-queue', 'Delete queue', `Delete the empty queue ${queue}?`, 'btn btn-danger')) : ''
      }`;

  return {
    status: 200,
    body: layout(
      ctx,
      `${queue} · ${state}`,
      'queues',
      html`<nav class="crumbs"><a href="${ctx.base}/">Queues</a> / <span>${queue}</span></nav>
<div class="page-head" data-region id="r-qhead"><h1>${queue} ${info.paused ? badge('paused', 'warn') : ''}</h1><div class="head-actions">${queueActions}</div></div>
<section class="tiles" data-region id="r-qstats">
${tile('size', num(info.size), '', 'size')}${tile('latency', duration(info.latency), '', 'latency')}${tile('processed today', num(info.processed), '', 'processed')}${tile('failed today', num(info.failed), info.failed > 0 ? 'tile-bad' : '', 'failed')}${tile('error rate today', errorRate(info.failed, info.processed), '', 'error-rate')}${tile('processed, all time', num(info.processedTotal), '', 'processed-total')}${tile('failed, all time', num(info.failedTotal), '', 'failed-total')}${tile('groups', num(info.groups), '', 'groups')}
</section>
<section class="card chart-card" data-region id="r-qhistory"><div class="card-head"><h2>Processed per day (UTC), last 14 days</h2></div>${historyChart([...history].reverse(), `processed and failed per day in ${queue}`, { width: 1400, height: 170 })}</section>
<section class="card">
<nav class="tabs" data-region id="r-tabs" aria-label="task states">${tabs}</nav>
<form class="search" method="get" action="${href(ctx, queuePath(queue))}" role="search">
<input type="hidden" name="state" value="${state}">${group !== undefined ? html`<input type="hidden" name="group" value="${group}">` : ''}
<input type="search" name="search" value="${search}" placeholder="Search by task id or type" aria-label="search by task id or type">
<button class="btn" type="submit">Search</button>
</form>
<div data-region id="r-tasks">
${groupsNav}${searchNote}
${list}
<div class="list-foot">${pageLinks}${search === '' ? sizes : ''}</div>
</div>
</section>`,
    ),
  };
}

// ---------------------------------------------------------------- task page

function block(ctx: PageContext, title: string, value: unknown, what: 'payload' | 'result'): Html {
  if (ctx.hidePayloads) return html`<section class="card"><h2>${title}</h2><p class="muted">Hidden: the dashboard runs with --hide-payloads.</p></section>`;
  const p = pretty(value);
  if (p.kind === 'none') return html`<section class="card"><h2>${title}</h2><p class="muted">${what === 'result' ? 'No result written.' : 'No payload.'}</p></section>`;
  return html`<section class="card"><h2>${title} <span class="muted small">${p.kind === 'bytes' ? `bytes (${num((value as Buffer).length)})` : 'JSON'}</span></h2><pre class="code" data-block="${what}">${p.text}</pre></section>`;
}

export async function taskPage(ctx: PageContext, queue: string, id: string): Promise<PageResult> {
  const t = await ctx.inspector.getTaskInfo(queue, id);
  const now = Date.now();
  const w = t.state === 'active' ? (await workersByTask(ctx.inspector)).get(`${t.queue}\u0000${t.id}`) : undefined;
  const ops = ctx.readOnly ? [] : ALLOWED[t.state];
  const actions = ops.length === 0 ? html`` : actionForm(ctx, { queue, state: t.state }, ops.map((op) => opButton(op, 'one', `${op}:one:${t.id}`, confirmText(op, 'one', `task ${t.id}`), OP_LABEL[op])));

  const dl = (rows: [string, Html | string][]) => html`<dl class="facts">${rows.map(([k, v]) => html`<dt>${k}</dt><dd>${v}</dd>`)}</dl>`;
  const facts = dl([
    ['Queue', html`<a href="${href(ctx, queuePath(queue))}">${queue}</a>`],
    ['State', badge(t.state, t.state)],
    ['Type', html`<span data-field="type">${t.type}</span>`],
    ['Retried', `${t.retried} of ${t.maxRetry}`],
    ['Timeout', t.timeout === 0 ? 'none (deadline only)' : duration(t.timeout)],
    ['Deadline', t.deadline ? html`${instant(t.deadline)} (${relative(t.deadline, now)})` : 'none'],
    ['Group', t.group ?? '–'],
    ['Retention', t.retention === 0 ? 'none (deleted when done)' : duration(t.retention)],
  ]);

  type Ev = { at: Date; label: string; detail?: string };
  const evs: Ev[] = [];
  evs.push({ at: t.enqueuedAt, label: 'enqueued' });
  if (w) evs.push({ at: w.worker.startedAt, label: 'started', detail: `by ${w.server.host}:${w.server.pid}` });
  else if (t.startedAt) evs.push({ at: t.startedAt, label: 'started', detail: t.leaseOwner ? `by server ${t.leaseOwner.slice(0, 8)}` : undefined });
  if (t.lastFailedAt) evs.push({ at: t.lastFailedAt, label: 'failed', detail: t.retried > 0 ? `attempt ${t.retried}` : undefined });
  if (t.completedAt) evs.push({ at: t.completedAt, label: 'completed' });
  if (t.nextProcessAt && t.state !== 'pending') evs.push({ at: t.nextProcessAt, label: t.state === 'retry' ? 'next retry' : 'due' });
  if (t.completedAt && t.retention > 0) evs.push({ at: new Date(t.completedAt.getTime() + t.retention), label: 'deleted (end of retention)' });
  if (t.deadline) evs.push({ at: t.deadline, label: 'deadline' });
  evs.sort((a, b) => a.at.getTime() - b.at.getTime());
  const timeline = html`<section class="card"><h2>Timeline</h2>${
    evs.length === 0
      ? html`<p class="muted">${t.state === 'pending' ? 'Waiting to be picked up.' : 'Nothing recorded yet.'}</p>`
      : html`<ol class="timeline">${evs.map((e) => html`<li class="${e.at.getTime() > now ? 'future' : ''}"><time datetime="${e.at.toISOString()}">${instant(e.at)}</time> <strong>${e.label}</strong> <span class="muted">${relative(e.at, now)}${e.detail ? ` · ${e.detail}` : ''}</span></li>`)}</ol>`
  }</section>`;

  const lease =
    t.state !== 'active'
      ? html``
      : html`<section class="card" data-region id="r-lease"><h2>Lease</h2>${dl([
          ['Owner', w ? html`<a href="${href(ctx, '/servers')}#server-${w.server.id}"><code>${w.server.id}</code></a> (${w.server.host}, pid ${w.server.pid})` : html`<span class="muted">not a live server (its server is gone)</span>`],
          ['Started', w ? html`${instant(w.worker.startedAt)} (${relative(w.worker.startedAt, now)})` : '–'],
          ['Expires', w ? html`${instant(w.worker.leaseExpiresAt)} (${relative(w.worker.leaseExpiresAt, now)})` : '–'],
          ['Attempt deadline', w?.worker.deadline ? html`${instant(w.worker.deadline)} (${relative(w.worker.deadline, now)})` : '–'],
          ['Orphaned', t.isOrphaned ? html`${badge('yes', 'bad')} the lease expired; a recoverer will retry or archive the task` : 'no'],
        ])}</section>`;

  const headers = Object.entries(t.headers);
  const headersBlock = html`<section class="card"><h2>Headers</h2>${
    headers.length === 0
      ? html`<p class="muted">None.</p>`
      : html`<div class="table-wrap"><table class="kv"><tbody>${headers.map(([k, v]) => html`<tr><th scope="row"><code>${k}</code></th><td><code>${v}</code></td></tr>`)}</tbody></table></div>`
  }</section>`;
  const errorBlock = t.lastError === null ? html`` : html`<section class="card"><h2>Last error ${t.lastFailedAt ? html`<span class="muted small">${instant(t.lastFailedAt)}</span>` : ''}</h2><pre class="code error-text" data-block="error">${t.lastError}</pre></section>`;

  return {
    status: 200,
    body: layout(
      ctx,
      `Task ${t.id}`,
      'queues',
      html`<nav class="crumbs"><a href="${ctx.base}/">Queues</a> / <a href="${href(ctx, queuePath(queue), { state: t.state })}">${queue}</a> / <span>${t.id}</span></nav>
<div class="page-head" data-region id="r-thead"><h1><code>${t.id}</code> ${badge(t.state, t.state)}</h1><div class="head-actions">${actions}</div></div>
<div class="grid2">
<section class="card" data-region id="r-facts"><h2>Task</h2>${facts}</section>
<div data-region id="r-timeline">${timeline}${lease}</div>
</div>
${errorBlock}
${block(ctx, 'Payload', t.payload, 'payload')}
${t.state === 'completed' || t.result !== null ? block(ctx, 'Result', t.result, 'result') : ''}
${headersBlock}`,
    ),
  };
}

// ---------------------------------------------------------------- servers

export async function serversPage(ctx: PageContext): Promise<PageResult> {
  const servers = await ctx.inspector.servers();
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
            (w) => html`<tr data-task-id="${w.taskId}"><td class="id"><a href="${href(ctx, taskPath(w.queue, w.taskId))}"><code>${w.taskId}</code></a></td><td>${w.queue}</td><td class="type">${w.type}</td><td class="payload">${payloadCell(ctx, w.payload)}</td><td>${when(w.startedAt, now)}</td><td>${when(w.leaseExpiresAt, now)}</td><td>${when(w.deadline, now)}</td></tr>`,
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
<td><code class="preview">${preview(e.options)}</code></td>
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
    ? html`<dl class="facts"><dt>Spec</dt><dd><code>${entry.spec}</code></dd><dt>Type</dt><dd>${entry.task.type}</dd><dt>Payload</dt><dd>${payloadCell(ctx, entry.task.payload)}</dd><dt>Options</dt><dd><code class="preview">${preview(entry.options)}</code></dd><dt>Next</dt><dd>${entry.next ? html`${instant(entry.next)} (${relative(entry.next, now)})` : '–'}</dd><dt>Previous</dt><dd>${entry.prev ? html`${instant(entry.prev)} (${relative(entry.prev, now)})` : '–'}</dd></dl>`
    : html`<p class="muted">No live scheduler has this entry now; its history is kept.</p>`;
  const rows = events.map(
    (e) => html`<tr><td class="id"><a href="${href(ctx, taskPath(queue, e.taskId))}"><code>${e.taskId}</code></a></td><td>${instant(e.tickAt)}</td><td>${instant(e.enqueuedAt)} <span class="muted">(${relative(e.enqueuedAt, now)})</span></td></tr>`,
  );
  const prev = page > 1 ? html`<a class="page" href="${href(ctx, `/schedulers/${encodeURIComponent(entryId)}`, { page: page - 1 })}">‹ Newer</a>` : '';
  const next = events.length === pageSize ? html`<a class="page" href="${href(ctx, `/schedulers/${encodeURIComponent(entryId)}`, { page: page + 1 })}">Older ›</a>` : '';
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
export function statusOf(err: unknown): number {
  if (isQueueNotFound(err) || isTaskNotFound(err)) return 404;
  if (isValidationError(err)) return 400;
  if (err instanceof FailedPreconditionError) return 409;
  return 500;
}
