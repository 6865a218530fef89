/**
 * Text the pages show: numbers, durations, instants, payload previews and
 * dumps. Plain strings only: the `html` template escapes them where they land.
 */
import { formatDuration } from '../model/cron.js';
import type { QueueLimits } from '../model/inspector-types.js';
import { inInstantRange } from '../model/validate.js';

/** 1234567 → "1,234,567". */
export function num(n: number): string {
  return Math.round(n).toLocaleString('en-US');
}

/** Shown for an instant or a duration no Date or clock can show: invalid, or outside years 0001–9999. */
export const UNSHOWABLE = '—';

/** ms → "850 ms", "12.5 s", "3m 20s", "2h 5m", "3d 4h"; "—" when not a finite number. */
export function duration(ms: number): string {
  if (!Number.isFinite(ms)) return UNSHOWABLE;
  const a = Math.abs(ms);
  if (a < 1000) return `${Math.round(ms)} ms`;
  if (a < 60_000) return `${(ms / 1000).toFixed(a < 10_000 ? 2 : 1)} s`;
  const s = Math.floor(a / 1000);
  const sign = ms < 0 ? '-' : '';
  if (s < 3600) return `${sign}${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86_400) return `${sign}${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${sign}${Math.floor(s / 86_400)}d ${Math.floor((s % 86_400) / 3600)}h`;
}

/**
 * An instant relative to `now`: "in 3m 20s", "12.5 s ago", "now"; "—" for one
 * that cannot be shown (a row written by hand or by SQL can hold year 280000).
 */
export function relative(d: Date, now: number): string {
  if (!inInstantRange(d)) return UNSHOWABLE;
  const diff = d.getTime() - now;
  if (Math.abs(diff) < 1000) return 'now';
  return diff > 0 ? `in ${duration(diff)}` : `${duration(-diff)} ago`;
}

/** "2026-05-01 12:00:03Z" (UTC, to the second); "—" when it cannot be shown. */
export function instant(d: Date): string {
  if (!inInstantRange(d)) return UNSHOWABLE;
  return `${d.toISOString().slice(0, 19).replace('T', ' ')}Z`;
}

/** A `<time datetime>` value: ISO 8601, or '' for an instant that cannot be shown. */
export function datetime(d: Date): string {
  return inInstantRange(d) ? d.toISOString() : '';
}

/** Text cut to at most `max` characters, the last one "…" when it was longer. */
export function clip(text: string, max = PREVIEW_MAX): string {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** Characters of a preview in a list (the broker's previews carry one more, so clip() knows to add "…"). */
export const PREVIEW_MAX = 200;

/**
 * A one-line preview of a payload or result held whole (a scheduler entry's):
 * compact JSON or "<n bytes> 0a1b…", at most `max` characters. Task lists get
 * theirs cut by PostgreSQL instead (broker/rows.ts previewColumns).
 */
export function preview(value: unknown, max = PREVIEW_MAX): string {
  let text: string;
  if (Buffer.isBuffer(value)) {
    text = `<${value.length} bytes> ${value.subarray(0, 48).toString('hex')}${value.length > 48 ? '…' : ''}`;
  } else if (value === null || value === undefined) {
    text = '';
  } else {
    text = JSON.stringify(value) ?? String(value);
  }
  return clip(text, max);
}

/** Pretty JSON for a JSON value; a hex dump (offset, hex, ASCII) for bytes, the first `maxBytes` of them. */
export function pretty(value: unknown, maxBytes = 65_536): { kind: 'json' | 'bytes' | 'none'; text: string } {
  if (value === null || value === undefined) return { kind: 'none', text: '' };
  if (!Buffer.isBuffer(value)) return { kind: 'json', text: JSON.stringify(value, null, 2) ?? String(value) };
  const lines: string[] = [];
  const shown = value.subarray(0, maxBytes);
  for (let off = 0; off < shown.length; off += 16) {
    const row = shown.subarray(off, off + 16);
    const hex = [...row].map((b) => b.toString(16).padStart(2, '0')).join(' ');
    const ascii = [...row].map((b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : '.')).join('');
    lines.push(`${off.toString(16).padStart(8, '0')}  ${hex.padEnd(47)}  ${ascii}`);
  }
  if (value.length > maxBytes) lines.push(`… ${value.length - maxBytes} more bytes`);
  return { kind: 'bytes', text: lines.join('\n') };
}

/** failed / processed as "1.5 %", or "–" when nothing was processed. */
export function errorRate(failed: number, processed: number): string {
  return processed === 0 ? '–' : `${((100 * failed) / processed).toFixed(processed < 1000 ? 1 : 2)} %`;
}

/** A rate limit as "100 / 1s" (the interval exact, as `pgasynq queue limit --rate` takes it). */
export function rateText(rate: NonNullable<QueueLimits['rateLimit']>): string {
  return `${num(rate.limit)} / ${formatDuration(rate.interval)}`;
}

/** A queue's limits in one line, "concurrency 5 · per key 2 · rate 100 / 1s"; '' when it has none. */
export function limitsText(l: QueueLimits): string {
  const parts: string[] = [];
  if (l.concurrency !== null) parts.push(`concurrency ${num(l.concurrency)}`);
  if (l.keyConcurrency !== null) parts.push(`per key ${num(l.keyConcurrency)}`);
  if (l.rateLimit !== null) parts.push(`rate ${rateText(l.rateLimit)}`);
  return parts.join(' · ');
}
