/** The queue page: a tab per state, its list and actions (the task page is task-page.ts). */
import type { ServerPreview, TaskPreview } from '../model/previews.js';
import type { QueueInfo } from '../model/inspector-types.js';
import { isTaskNotFound, isValidationError } from '../model/errors.js';
import type { Inspector } from '../inspector.js';
import { listServerPreviews, listTaskPreviews, taskPageInfo } from '../inspector-internal.js';
import type { TaskState } from '../model/task.js';
import { historyChart } from './charts.js';
import { duration, errorRate, num, rateText } from './format.js';
import { html, type Html } from './html.js';
import {
  ALLOWED,
  DEFAULT_PAGE_SIZE,
  MAX_PAGE_SIZE,
  OP_LABEL,
  PAGE_SIZES,
  type PageContext,
  type PageResult,
  TAB_STATES,
  TYPE_SEARCH_SCAN,
  actionForm,
  badge,
  confirmText,
  hiddenText,
  href,
  intParam,
  layout,
  opButton,
  opQueueButton,
  pager,
  pauseForm,
  previewCell,
  queuePath,
  taskPath,
  tile,
  when,
} from './pages.js';

/** A page of the tab's tasks as previews: the rows the list shows, never whole payloads, results or errors. */
function listOf(ctx: PageContext, state: TaskState, queue: string, group: string | undefined, page: number, pageSize: number): Promise<TaskPreview[]> {
  if (state === 'aggregating' && group === undefined) return Promise.resolve([]);
  return listTaskPreviews(ctx.inspector, queue, state, { page, pageSize, group, hide: ctx.hidePayloads });
}

export type Worker = { server: ServerPreview; worker: ServerPreview['activeWorkers'][number] };

/** A task's key in workersByTask: ids are unique per queue only. */
export const taskKey = (queue: string, id: string) => `${queue}\u0000${id}`;

/** Which server holds each active task, from the live servers' workers (their payloads are not read). */
export async function workersByTask(inspector: Inspector): Promise<Map<string, Worker>> {
  const out = new Map<string, Worker>();
  for (const server of await listServerPreviews(inspector, true))
    for (const worker of server.activeWorkers) out.set(taskKey(worker.queue, worker.taskId), { server, worker });
  return out;
}

function errorCell(ctx: PageContext, t: TaskPreview): Html {
  if (ctx.hidePayloads) return html`<td>${hiddenText()}</td>`;
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
    case 'waiting':
      return ['waiting for', 'depends on'];
  }
}

function stateCells(ctx: PageContext, t: TaskPreview, now: number, workers: Map<string, Worker>): Html {
  const retried = html`<td class="num">${t.retried} / ${t.maxRetry}</td>`;
  switch (t.state) {
    case 'active': {
      const w = workers.get(taskKey(t.queue, t.id));
      const lease = t.isOrphaned ? badge('orphaned', 'bad') : w ? html`expires ${when(w.worker.leaseExpiresAt, now)}` : html`<span class="muted">–</span>`;
      return html`<td>${w ? when(w.worker.startedAt, now) : html`<span class="muted">–</span>`}</td><td>${lease}</td><td>${w ? html`<a href="${href(ctx, '/servers')}#server-${w.server.id}">${w.server.host}:${w.server.pid}</a>` : html`<span class="muted">gone</span>`}</td>`;
    }
    case 'pending':
      return retried;
    case 'scheduled':
      return html`<td>${when(t.nextProcessAt, now)}</td>`;
    case 'retry':
      return html`<td>${when(t.nextProcessAt, now)}</td>${retried}${errorCell(ctx, t)}`;
    case 'archived':
      return html`<td>${when(t.lastFailedAt, now)}</td>${retried}${errorCell(ctx, t)}`;
    case 'completed':
      return html`<td>${when(t.completedAt, now)}</td><td>${previewCell(ctx, t.result)}</td><td>${when(t.completedAt === null ? null : new Date(t.completedAt.getTime() + t.retention), now)}</td>`;
    case 'aggregating':
      return html`<td>${t.group ?? ''}</td>`;
    case 'waiting':
      return html`<td class="num" data-col="waiting-for">${num(t.waitingFor)} of ${num(t.dependsTotal)}</td>${dependsOnCell(ctx, t)}`;
  }
}

/**
 * A waiting task's first dependencies as links to their pages, unfinished
 * ones first (the preview's order: what it still waits for), settled ones
 * muted with their outcome on hover; "…" when it has more. A dependency in
 * the task's own queue is named by its id alone.
 */
function dependsOnCell(ctx: PageContext, t: TaskPreview): Html {
  const links = t.dependsOn.map(
    (d, i) =>
      html`${i > 0 ? ', ' : ''}<a class="dep${d.outcome === null ? '' : ' muted'}" href="${href(ctx, taskPath(d.queue, d.id))}"${
        d.outcome === null ? '' : html` title="${d.outcome}"`
      }><code>${d.queue === t.queue ? d.id : `${d.queue}/${d.id}`}</code></a>`,
  );
  const more = t.dependsTotal - t.dependsOn.length;
  return html`<td class="deps" data-col="depends-on">${links}${more > 0 ? html`, <span class="muted" title="${num(more)} more">…</span>` : ''}</td>`;
}

/**
 * Lists up to TYPE_SEARCH_SCAN tasks of the state and keeps those whose type
 * contains `needle` (case-insensitive), up to 500. Previews, a page at a time:
 * what it holds is bounded by the matches kept and one page.
 */
async function searchByType(
  ctx: PageContext,
  queue: string,
  state: TaskState,
  group: string | undefined,
  needle: string,
  count: number,
): Promise<{ tasks: TaskPreview[]; scanned: number }> {
  const pageSize = MAX_PAGE_SIZE;
  const n = needle.toLowerCase();
  const out: TaskPreview[] = [];
  let scanned = 0;
  for (let page = 1; scanned < Math.min(count, TYPE_SEARCH_SCAN); page++) {
    const tasks = await listOf(ctx, state, queue, group, page, pageSize);
    scanned += tasks.length;
    for (const t of tasks) if (t.type.toLowerCase().includes(n) && out.length < 500) out.push(t);
    if (tasks.length < pageSize) break;
  }
  return { tasks: out, scanned };
}

/** A tile per limit the queue has (Inspector.setQueueLimits); none without limits. */
function limitTiles(l: QueueInfo['limits']): Html {
  return html`${l.concurrency === null ? '' : tile('concurrency limit', num(l.concurrency), '', 'limit-concurrency')}${
    l.keyConcurrency === null ? '' : tile('limit per key', num(l.keyConcurrency), '', 'limit-key-concurrency')
  }${l.rateLimit === null ? '' : tile('rate limit', rateText(l.rateLimit), '', 'limit-rate')}`;
}

export async function queuePage(ctx: PageContext, queue: string): Promise<PageResult> {
  const url = ctx.url;
  const stateParam = url.searchParams.get('state');
  const search = (url.searchParams.get('search') ?? '').trim();

  // A search that is a task id of this queue opens the task.
  if (search !== '' && /^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$/.test(search)) {
    try {
      // Only the task's facts: a redirect needs no payload (a task's can be megabytes).
      const t = await taskPageInfo(ctx.inspector, queue, search, true);
      return { redirect: taskPath(t.queue, t.id) };
    } catch (err) {
      if (!isTaskNotFound(err) && !isValidationError(err)) throw err;
    }
  }

  const info = await ctx.inspector.getQueueInfo(queue);
  const state: TaskState = (TAB_STATES as readonly string[]).includes(stateParam ?? '') ? (stateParam as TaskState) : info.active > 0 ? 'active' : 'pending';
  const pageSize = intParam(url, 'size', DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE);
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
    groupsNav =
      groups.length === 0
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

  let tasks: TaskPreview[];
  let searchNote: Html = html``;
  if (search !== '') {
    const r = await searchByType(ctx, queue, state, group, search, stateCount);
    tasks = r.tasks;
    searchNote = html`<p class="note" data-search-result>${num(tasks.length)}${tasks.length === 500 ? '+' : ''} ${state} task(s) whose type contains “${search}”${
      r.scanned < stateCount ? html` among the first ${num(r.scanned)} of ${num(stateCount)}` : ''
    }. No task has this id. <a href="${href(ctx, queuePath(queue), { state, group })}">Clear</a></p>`;
  } else {
    tasks = await listOf(ctx, state, queue, group, page, pageSize);
  }
  const workers = state === 'active' ? await workersByTask(ctx.inspector) : new Map<string, Worker>();

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
<td class="payload">${previewCell(ctx, t.payload)}</td>
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
  const head = html`<tr>${canAct ? html`<th class="check"><input type="checkbox" data-select-all aria-label="select all on this page"></th>` : ''}<th>ID</th><th>Type</th><th>Payload</th>${stateColumns(state).map((c) => html`<th${c === 'retried' || c === 'waiting for' ? html` class="num"` : ''}>${c}</th>`)}${canAct ? html`<th></th>` : ''}</tr>`;
  const tableBody =
    tasks.length === 0
      ? html`<p class="empty">No ${state} tasks${state === 'aggregating' && group !== undefined ? html` in group ${group}` : ''}.</p>`
      : html`<div class="table-wrap"><table class="tasks" data-state="${state}"><thead>${head}</thead><tbody>${rows}</tbody></table></div>`;
  const list = canAct && stateCount > 0 ? actionForm(ctx, { queue, state, group }, [bulk, tableBody], 'task-form') : tableBody;
  const pageLinks =
    search === ''
      ? pager(page, pages, (p) => href(ctx, queuePath(queue), { state, group, page: p, size: pageSize === DEFAULT_PAGE_SIZE ? undefined : pageSize }))
      : html``;
  const sizes = html`<span class="page-sizes muted">Per page: ${PAGE_SIZES.map((s) =>
    s === pageSize
      ? html`<span class="seg current">${s}</span>`
      : html`<a class="seg" href="${href(ctx, queuePath(queue), { state, group, size: s === DEFAULT_PAGE_SIZE ? undefined : s })}">${s}</a>`,
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
${tile('size', num(info.size), '', 'size')}${tile('latency', duration(info.latency), '', 'latency')}${tile('processed today', num(info.processed), '', 'processed')}${tile('failed today', num(info.failed), info.failed > 0 ? 'tile-bad' : '', 'failed')}${tile('error rate today', errorRate(info.failed, info.processed), '', 'error-rate')}${tile('processed, all time', num(info.processedTotal), '', 'processed-total')}${tile('failed, all time', num(info.failedTotal), '', 'failed-total')}${tile('groups', num(info.groups), '', 'groups')}${limitTiles(info.limits)}
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
