/**
 * The table of a run, from its raw figures: medians, spreads and the ratios
 * pgasynq ÷ peer paired run by run, as Markdown (and W8's per-window table).
 * run.ts rebuilds it after every measurement, so that a run stopped midway
 * still leaves its table in the results file.
 */
import type { SystemName } from '../adapters/index.js';
import { median } from './common.js';
import { fmt, type Case, type Row, type Workload } from './plan.js';

/** One measurement of one system in one case and repetition, as the results file keeps it. */
export interface Measurement {
  workload: Workload;
  case: string;
  system: SystemName;
  rep: number;
  params: Record<string, number | string>;
  startedAt: string;
  seconds: number;
  loadavg1: number;
  result?: Record<string, number | string>;
  error?: string;
}

function value(ms: Measurement[], c: Case, system: SystemName, rep: number, metric: string): number | undefined {
  const m = ms.find((x) => x.case === c.key && x.system === system && x.rep === rep);
  const v = m?.result?.[metric];
  return typeof v === 'number' && Number.isFinite(v) ? v : undefined;
}

export function formatValue(v: number | undefined, unit: Row['unit']): string {
  if (typeof v !== 'number' || Number.isNaN(v)) return '–';
  switch (unit) {
    case 'rate':
      return fmt(Math.round(v));
    case 'ms':
      return v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : fmt(Math.round(v));
    case 'bytes':
      return (v / 1024 / 1024).toFixed(1);
    case 'count':
      if (Math.abs(v) < 0.05) return '0';
      return Math.abs(v) < 100 && !Number.isInteger(v) ? v.toFixed(1) : fmt(Math.round(v));
    case 'ratio':
      return `${v.toFixed(2)}×`;
  }
}

export interface TableRow {
  label: string;
  better: Row['better'];
  unit: Row['unit'];
  medians: Partial<Record<SystemName, number>>;
  ratios: Partial<Record<SystemName, number>>;
  spread: Partial<Record<SystemName, [number, number]>>;
  /** Some repetition stopped at the drain cap: its figure is the rate over the first capMs. */
  capped: Partial<Record<SystemName, boolean>>;
}

/** `reps`: how many repetitions a case that does not set its own ran (--reps). */
export function tabulate(cases: Case[], ms: Measurement[], reps: number): TableRow[] {
  const rows: TableRow[] = [];
  const repsOf = (c: Case) => Array.from({ length: c.reps ?? reps }, (_, i) => i + 1);
  const summarize = (
    label: string,
    better: Row['better'],
    unit: Row['unit'],
    systems: SystemName[],
    get: (s: SystemName, rep: number) => number | undefined,
    repList: number[],
    capped: (s: SystemName, rep: number) => boolean = () => false,
  ) => {
    const row: TableRow = { label, better, unit, medians: {}, ratios: {}, spread: {}, capped: {} };
    for (const s of systems) {
      if (repList.some((r) => capped(s, r))) row.capped[s] = true;
      const vs = repList.map((r) => get(s, r)).filter((v): v is number => v !== undefined);
      if (vs.length) {
        row.medians[s] = median(vs);
        row.spread[s] = [Math.min(...vs), Math.max(...vs)];
      }
      if (s !== 'pgasynq') {
        const paired = repList
          .map((r) => [get('pgasynq', r), get(s, r)] as const)
          // A ratio means something only between two positive figures (WAL's net figures may be 0 or, within noise, below).
          .filter((p): p is readonly [number, number] => p[0] !== undefined && p[1] !== undefined && p[0] > 0 && p[1] > 0)
          .map(([a, b]) => a / b);
        if (paired.length) row.ratios[s] = median(paired);
      }
    }
    rows.push(row);
  };
  // W5: claim cost at the larger size ÷ at the smaller, paired by repetition; right after W5's own rows.
  const w5 = cases.filter((c) => c.workload === 'W5');
  const w5Ratios = () => {
    const [small, large] = w5 as [Case, Case];
    for (const [metric, what] of [
      ['claimMs', 'claim round trip'],
      ['explainMs', 'claim execution'],
    ] as const) {
      summarize(
        `W5 ${what} with ${fmt(Number(large.params.finished))} ÷ with ${fmt(Number(small.params.finished))} finished rows`,
        'lower',
        'ratio',
        small.systems,
        (s, rep) => {
          const a = value(ms, large, s, rep, metric);
          const b = value(ms, small, s, rep, metric);
          return a !== undefined && b !== undefined ? a / b : undefined;
        },
        repsOf(small),
      );
    }
  };
  for (const c of cases) {
    for (const r of c.rows) {
      const capped = (s: SystemName, rep: number) => r.unit === 'rate' && value(ms, c, s, rep, 'capped') === 1;
      summarize(r.label, r.better, r.unit, c.systems, (s, rep) => value(ms, c, s, rep, r.metric), repsOf(c), capped);
    }
    if (w5.length === 2 && c === w5[1]) w5Ratios();
  }
  return rows;
}

export function markdown(rows: TableRow[], systems: SystemName[]): string {
  const head = `| figure | ${systems.join(' | ')} |\n|---|${systems.map(() => '---:').join('|')}|`;
  const body = rows.map((r) => {
    const arrow = r.better === 'higher' ? ' ↑' : ' ↓';
    const cells = systems.map((s) => {
      const v = formatValue(r.medians[s], r.unit) + (r.capped[s] ? '†' : '');
      const ratio = r.ratios[s];
      return s === 'pgasynq' || ratio === undefined || r.unit === 'ratio' ? v : `${v} (${ratio.toFixed(2)}×)`;
    });
    return `| ${r.label}${arrow} | ${cells.join(' | ')} |`;
  });
  return [head, ...body].join('\n');
}

/** W8 per window, one table per hold: p50 / p99 ms (backlog at the window's end), median over W8's repetitions. */
export function w8Windows(cs: Case[], ms: Measurement[]): string | undefined {
  const tables = cs.filter((x) => x.workload === 'W8').map((c) => w8Table(c, ms));
  return tables.length > 0 ? tables.join('\n\n') : undefined;
}

function w8Table(c: Case, ms: Measurement[]): string {
  const { seconds, window, snapshotAt } = c.params as { seconds: number; window: number; snapshotAt: number };
  const n = Math.ceil(seconds / window);
  const systems = c.systems;
  const cell = (s: SystemName, key: string) => {
    const get = (m: string) =>
      median(
        ms
          .filter((x) => x.case === c.key && x.system === s)
          .map((x) => x.result?.[`${key}.${m}`])
          .filter((v): v is number => typeof v === 'number'),
      );
    const p50 = get('p50');
    if (Number.isNaN(p50)) return '–';
    return `${formatValue(p50, 'ms')} / ${formatValue(get('p99'), 'ms')} (${formatValue(get('backlog'), 'count')})`;
  };
  const head = `| ${c.key} enqueued during (s) | ${systems.join(' | ')} |\n|---|${systems.map(() => '---:').join('|')}|`;
  const body = Array.from({ length: n }, (_, w) => {
    const key = `w${String(w).padStart(2, '0')}`;
    const from = w * window;
    const mark = from <= snapshotAt && snapshotAt < from + window ? ' ◆' : '';
    return `| ${from}–${Math.min(from + window, seconds)}${mark} | ${systems.map((s) => cell(s, key)).join(' | ')} |`;
  });
  return [
    `${c.key} enqueue→start per ${window} s window: p50 / p99 ms (backlog at the window's end); ◆ the hold begins at ${snapshotAt} s.`,
    '',
    head,
    ...body,
  ].join('\n');
}
