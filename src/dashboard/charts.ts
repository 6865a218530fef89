/**
 * Server-rendered SVG: processed and failed attempts per day. Colours come
 * from classes in the stylesheet (no style attributes: the CSP forbids
 * them), so the dark theme applies to charts too. The live queue-size chart
 * is drawn in the browser by app.js from /api/overview.
 */
import { html, type Html } from './html.js';
import { num } from './format.js';

export interface DayCounts {
  date: Date;
  processed: number;
  failed: number;
}

/** A round upper bound for an axis: 1, 2, 5 × 10^k. */
export function niceMax(v: number): number {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

/** An axis label: whole numbers with separators, else one decimal. */
function tick(v: number): string {
  return Number.isInteger(v) ? num(v) : v.toFixed(1);
}

/**
 * Bars per day (processed: succeeded + failed; failed overlaid), oldest on
 * the left, with a <title> per day for the exact numbers.
 */
export function historyChart(days: readonly DayCounts[], label: string, size: { width: number; height: number } = { width: 720, height: 180 }): Html {
  const W = size.width;
  const H = size.height;
  const left = 48;
  const bottom = 22;
  const top = 8;
  const plotW = W - left - 8;
  const plotH = H - top - bottom;
  const max = niceMax(Math.max(0, ...days.map((d) => d.processed)));
  const slot = plotW / Math.max(1, days.length);
  const barW = Math.max(1, Math.min(28, slot * 0.7));
  const y = (v: number) => top + plotH - (v / max) * plotH;
  const every = Math.ceil(days.length / 10);
  const grid = [0, 0.5, 1].map(
    (f) => html`<line class="grid" x1="${left}" x2="${W - 8}" y1="${y(max * f).toFixed(1)}" y2="${y(max * f).toFixed(1)}"></line>
<text class="axis" x="${left - 6}" y="${(y(max * f) + 4).toFixed(1)}" text-anchor="end">${tick(max * f)}</text>`,
  );
  const bars = days.map((d, i) => {
    const x = left + i * slot + (slot - barW) / 2;
    const day = d.date.toISOString().slice(0, 10);
    const succeeded = Math.max(0, d.processed - d.failed);
    return html`<g><title>${day}: ${num(d.processed)} processed, ${num(succeeded)} succeeded, ${num(d.failed)} failed</title>
<rect class="bar-ok" x="${x.toFixed(1)}" y="${y(d.processed).toFixed(1)}" width="${barW.toFixed(1)}" height="${(plotH - (y(d.processed) - top)).toFixed(1)}"></rect>
<rect class="bar-fail" x="${x.toFixed(1)}" y="${y(d.failed).toFixed(1)}" width="${barW.toFixed(1)}" height="${(plotH - (y(d.failed) - top)).toFixed(1)}"></rect>
${i % every === 0 || i === days.length - 1 ? html`<text class="axis" x="${(x + barW / 2).toFixed(1)}" y="${H - 6}" text-anchor="middle">${day.slice(5)}</text>` : ''}</g>`;
  });
  return html`<svg class="chart-svg" viewBox="0 0 ${W} ${H}" role="img" aria-label="${label}">${grid}${bars}</svg>
<p class="legend"><span class="key key-ok"></span>succeeded <span class="key key-fail"></span>failed</p>`;
}
