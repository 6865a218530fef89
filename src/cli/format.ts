/**
 * Plain-text helpers for human-readable CLI output.
 *
 * Text from the database (types, ids, queues, errors, headers, payloads)
 * reaches the terminal only escaped: control, format and separator
 * characters are shown as `\u001b` (escapeInvisible), so an error holding
 * "ESC]0;…BEL" cannot retitle the window nor a newline break a table row.
 * table(), fields() and the colours escape what they are given; emit()
 * escapes every line that did not come from them (see printable()).
 */
import { escapeInvisible } from '../internal/printable.js';
import { inInstantRange } from '../model/validate.js';

// eslint-disable-next-line no-control-regex
const ANSI = /\x1b\[[0-9;]*m/g;

/**
 * Strings this module built for the terminal: escaped text, with only our own
 * colour codes raw in them. Kept by value, so a line or a cell that is one of
 * them is printed as it is, however it was passed along; anything else goes
 * through escapeInvisible. A CLI run is short: the set lives as long as it.
 */
const built = new Set<string>();

function mark(s: string): string {
  built.add(s);
  return s;
}

/** `s` as it may reach the terminal: as it is when this module built it, escaped otherwise. */
export function printable(s: string): string {
  return built.has(s) ? s : escapeInvisible(s);
}

/** The width a cell takes on screen: its length without colour escapes. */
function visible(s: string): number {
  return s.replace(ANSI, '').length;
}

export interface TableOptions {
  /** Columns (by index) whose cells are right-aligned, e.g. counts. */
  right?: readonly number[];
}

/**
 * Columns separated by two spaces, with a header row and a rule under it.
 * Cells are left-aligned unless `opts.right` names their column; colour
 * escapes in cells do not count towards the widths.
 */
export function table(headers: string[], rows: string[][], opts: TableOptions = {}): string[] {
  headers = headers.map(printable);
  rows = rows.map((r) => r.map(printable));
  const right = new Set(opts.right ?? []);
  const widths = headers.map((h, i) => Math.max(visible(h), ...rows.map((r) => visible(r[i] ?? ''))));
  const pad = (c: string, i: number) => {
    const fill = ' '.repeat(Math.max(0, (widths[i] ?? 0) - visible(c)));
    return right.has(i) ? fill + c : c + fill;
  };
  const line = (cells: string[]) => cells.map(pad).join('  ').trimEnd();
  return [line(headers), line(widths.map((w) => '-'.repeat(w))), ...rows.map(line)].map(mark);
}

/** Shown for an instant or a duration no Date or clock can show: invalid, or outside years 0001–9999. */
export const UNSHOWABLE = '—';

/** An instant for a table cell: ISO 8601 in UTC, "-" when there is none, "—" when it cannot be shown. */
export function instant(d: Date | null | undefined): string {
  if (!d) return '-';
  return inInstantRange(d) ? d.toISOString() : UNSHOWABLE;
}

/** A duration in ms, short and rounded: "0s", "850ms", "4.2s", "12s", "3m4s", "2h5m", "3d4h"; "—" when not a finite number. */
export function duration(ms: number): string {
  if (!Number.isFinite(ms)) return UNSHOWABLE;
  const abs = Math.abs(ms);
  const sign = ms < 0 ? '-' : '';
  if (abs === 0) return '0s';
  if (abs < 1000) return `${sign}${Math.round(abs)}ms`;
  if (abs < 10_000) return `${sign}${(Math.floor(abs / 100) / 10).toFixed(1)}s`;
  const s = Math.floor(abs / 1000);
  if (s < 60) return `${sign}${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${sign}${m}m${s % 60}s`;
  const h = Math.floor(m / 60);
  if (h < 24) return `${sign}${h}h${m % 60}m`;
  return `${sign}${Math.floor(h / 24)}d${h % 24}h`;
}

/** An instant relative to `now`: "3m4s ago", "in 25s", "just now"; "-" when there is none, "—" when it cannot be shown. */
export function relative(d: Date | null | undefined, now: number = Date.now()): string {
  if (!d) return '-';
  if (!inInstantRange(d)) return UNSHOWABLE;
  const diff = d.getTime() - now;
  if (Math.abs(diff) < 1000) return 'just now';
  return diff < 0 ? `${duration(-diff)} ago` : `in ${duration(diff)}`;
}

/** An instant with its relative form: "2026-05-01T10:00:00.000Z (3m4s ago)"; "-" when there is none, "—" when it cannot be shown. */
export function when(d: Date | null | undefined, now: number = Date.now()): string {
  if (!d) return '-';
  return inInstantRange(d) ? `${instant(d)} (${relative(d, now)})` : UNSHOWABLE;
}

/** A UTC day, "2026-05-01", or "—" when it cannot be shown. */
export function day(d: Date): string {
  return inInstantRange(d) ? d.toISOString().slice(0, 10) : UNSHOWABLE;
}

/** `s` cut to `max` characters, with "…" when cut; newlines become spaces. */
export function truncate(s: string, max: number): string {
  const flat = s.replace(/\s*\n\s*/g, ' ');
  return flat.length <= max ? flat : `${flat.slice(0, Math.max(0, max - 1))}…`;
}

/** A payload or result for display: its JSON, or "<N bytes>" for binary data; "-" for none. */
export function jsonText(value: unknown, max = Infinity): string {
  if (value === null || value === undefined) return '-';
  if (value instanceof Uint8Array) return `<${value.byteLength} bytes>`;
  const text = JSON.stringify(value) ?? String(value);
  return max === Infinity ? text : truncate(text, max);
}

/** "12.50%", or "N/A" when nothing was processed (as asynq prints it). */
export function errorRate(failed: number, processed: number): string {
  return processed === 0 ? 'N/A' : `${((100 * failed) / processed).toFixed(2)}%`;
}

/** A horizontal bar `width` cells long at most, for `value` out of `max`; at least one cell when value > 0. */
export function bar(value: number, max: number, width = 30): string {
  if (value <= 0 || max <= 0) return '';
  return '█'.repeat(Math.max(1, Math.round((value / max) * width)));
}

/** "key:   value" lines with the values aligned. */
export function fields(pairs: readonly (readonly [string, string])[]): string[] {
  const w = Math.max(0, ...pairs.map(([k]) => k.length)) + 1;
  return pairs.map(([k, v]) => mark(`${`${printable(k)}:`.padEnd(w)}  ${printable(v)}`));
}

export interface Style {
  bold(s: string): string;
  dim(s: string): string;
  red(s: string): string;
  green(s: string): string;
  yellow(s: string): string;
  cyan(s: string): string;
}

const sgr = (open: number, close: number) => (s: string) => (s === '' ? s : mark(`\x1b[${open}m${printable(s)}\x1b[${close}m`));
const plain = (s: string) => s;

/** ANSI colours when `enabled`, identity functions otherwise. */
export function style(enabled: boolean): Style {
  if (!enabled) return { bold: plain, dim: plain, red: plain, green: plain, yellow: plain, cyan: plain };
  return { bold: sgr(1, 22), dim: sgr(2, 22), red: sgr(31, 39), green: sgr(32, 39), yellow: sgr(33, 39), cyan: sgr(36, 39) };
}
