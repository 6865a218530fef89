/**
 * What the task page shows of following a task: its progress as a bar, its
 * runs as entries of its timeline, and its log lines (Inspector.listAttempts
 * and getTaskLogs; the progress is TaskInfo's). Errors, log lines and a
 * progress object are text the handler wrote: escaped by the `html`
 * template like every value, and, as payloads are, kept on the server with
 * hidePayloads (a number's progress and a run's outcome, server and times
 * are no content, and stay).
 */
import { maxAttemptsOf } from '../model/attempt.js';
import type { AttemptInfo, AttemptOutcome, TaskLogLine, TaskProgress } from '../model/following.js';
import { clip, datetime, duration, instant, num, relative } from './format.js';
import { html, type Html } from './html.js';
import { badge } from './pages.js';

/** The newest log lines a task page shows (a task keeps up to MAX_LOG_LINES). */
export const LOG_LINES_SHOWN = 200;
/** The longest error an attempt's entry shows. */
const ATTEMPT_ERROR_CHARS = 2000;

const hiddenNote = html`<p class="muted">Hidden: the dashboard runs with --hide-payloads.</p>`;

/** Each outcome's badge colour (the badge classes of the states). */
const OUTCOME_KIND: Record<AttemptOutcome, string> = {
  running: 'active',
  completed: 'completed',
  failed: 'bad',
  timeout: 'bad',
  lost: 'bad',
  canceled: 'warn',
  snoozed: 'scheduled',
  shutdown: 'pending',
};

/** A percentage as shown: cut (not rounded) to one decimal, so 99.96 is not yet "100 %". */
const percent = (n: number): string => `${Math.floor(n * 10) / 10} %`;

/** The bar a progress draws: a number as it is; an object with numeric `done` and `total` (> 0) as done/total; none otherwise. */
export function progressBar(p: TaskProgress): { value: number; text: string } | null {
  if (typeof p === 'number') return { value: p, text: percent(p) };
  const { done, total } = p;
  if (typeof done !== 'number' || typeof total !== 'number' || !Number.isFinite(done) || !Number.isFinite(total) || total <= 0 || done < 0) return null;
  const value = Math.min(100, (100 * done) / total);
  return { value, text: `${num(done)} of ${num(total)} (${percent(value)})` };
}

/**
 * The progress card, nothing before the handler reported any. The bar is an
 * SVG sized by attributes (the CSP forbids style attributes), announced as a
 * progressbar with its value; an object's JSON is shown under it.
 */
export function progressCard(p: TaskProgress | null, hide: boolean): Html {
  if (p === null) return html``;
  const bar = progressBar(p);
  const meter =
    bar === null
      ? html``
      : html`<div class="progress-row"><div class="progress" role="progressbar" aria-label="Progress" aria-valuemin="0" aria-valuemax="100" aria-valuenow="${Math.floor(bar.value * 10) / 10}" aria-valuetext="${bar.text}"><svg viewBox="0 0 100 10" class="progress-svg" preserveAspectRatio="none" aria-hidden="true"><rect class="meter-bg" x="0" y="0" width="100" height="10"></rect><rect class="meter-fg" x="0" y="0" width="${bar.value.toFixed(2)}" height="10"></rect></svg></div><span class="progress-value" data-field="progress">${bar.text}</span></div>`;
  const details =
    typeof p === 'number' ? html`` : hide ? hiddenNote : html`<pre class="code progress-json" data-block="progress">${JSON.stringify(p, null, 2)}</pre>`;
  return html`<section class="card" data-card="progress"><h2>Progress</h2>${meter}${details}</section>`;
}

/** A run's server: the live one's host and pid when the page knows them, else the start of its id (whole on hover). */
function serverText(id: string | null, live: { id: string; host: string; pid: number } | undefined): Html {
  if (id === null) return html`server unknown`;
  if (live?.id === id) return html`on ${live.host}:${live.pid}`;
  return html`server <code title="${id}">${id.slice(0, 8)}</code>`;
}

/**
 * The task's runs as timeline entries, each at its start: `attempt N of M`,
 * its outcome, how long it ran and until when (or for how long so far), its
 * server, and its error.
 */
export function attemptEntries(
  attempts: readonly AttemptInfo[],
  t: { maxRetry: number; enqueuedAt: Date },
  opts: { hide: boolean; now: number; live?: { id: string; host: string; pid: number } | undefined },
): { at: Date; li: Html }[] {
  const { hide, now, live } = opts;
  return attempts.map((a) => {
    const at = a.startedAt ?? a.finishedAt ?? t.enqueuedAt;
    const start =
      a.startedAt === null ? html`<span class="muted">start unknown</span>` : html`<time datetime="${datetime(a.startedAt)}">${instant(a.startedAt)}</time>`;
    const ran =
      a.finishedAt === null
        ? html`running${a.startedAt === null ? '' : ` for ${duration(now - a.startedAt.getTime())}`}`
        : html`ended <time datetime="${datetime(a.finishedAt)}">${instant(a.finishedAt)}</time>${a.startedAt === null ? '' : ` after ${duration(a.finishedAt.getTime() - a.startedAt.getTime())}`}`;
    const error =
      a.error === null
        ? html``
        : hide
          ? html`<span class="muted small"> · error hidden</span>`
          : html`<pre class="code error-text attempt-error" data-block="attempt-error">${clip(a.error, ATTEMPT_ERROR_CHARS)}</pre>`;
    const li = html`<li class="attempt" data-attempt="${a.attempt}" data-outcome="${a.outcome}">${start} <strong>attempt ${a.attempt} of ${maxAttemptsOf(t.maxRetry)}</strong> ${badge(a.outcome, OUTCOME_KIND[a.outcome])} <span class="muted">${a.startedAt === null ? '' : `${relative(a.startedAt, now)} · `}${ran} · ${serverText(a.serverId, live)}</span>${error}</li>`;
    return { at, li };
  });
}

/**
 * The log card: the newest LOG_LINES_SHOWN lines (saying so when there are
 * more), each with its time and attempt; nothing when the handler logged
 * none; with hidePayloads, that they are hidden (they were not read).
 */
export function logsCard(lines: readonly TaskLogLine[] | 'hidden'): Html {
  if (lines === 'hidden') return html`<section class="card" data-card="logs"><h2>Log</h2>${hiddenNote}</section>`;
  if (lines.length === 0) return html``;
  const shown = lines.slice(-LOG_LINES_SHOWN);
  const cut =
    shown.length < lines.length
      ? html`<p class="muted small" data-truncated="logs">Showing the last ${num(shown.length)} of ${num(lines.length)} lines.</p>`
      : html``;
  const rows = shown.map(
    (l) =>
      html`<tr data-attempt="${l.attempt}"><td><time datetime="${datetime(l.at)}" title="${datetime(l.at)}">${instant(l.at)}</time></td><td class="num">${l.attempt}</td><td class="log-msg">${l.message}</td></tr>`,
  );
  return html`<section class="card" data-card="logs"><h2>Log <span class="muted small">${num(lines.length)} line${lines.length === 1 ? '' : 's'}</span></h2>${cut}
<div class="table-wrap log-wrap"><table class="logs"><thead><tr><th>time</th><th class="num">attempt</th><th>message</th></tr></thead><tbody>${rows}</tbody></table></div></section>`;
}
