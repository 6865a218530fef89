/**
 * S1's configuration (s1.ts): the command's flags, the fault order, the
 * profile and bounds, and the oracle tables S1 adds to the harness's.
 */
import { parseArgs } from 'node:util';
import { FAST } from '../harness.js';
import { logTrigger } from '../kit.js';

const { values: args } = parseArgs({
  options: {
    minutes: { type: 'string', default: '20' },
    rate: { type: 'string', default: '100' },
    workers: { type: 'string', default: '4' },
    concurrency: { type: 'string', default: '24' },
    'fault-gap': { type: 'string' },
    'first-fault': { type: 'string', default: '120' },
    faults: { type: 'string' },
  },
});
export const MINUTES = Number(args.minutes);
export const DURATION_S = MINUTES * 60;
export const RATE = Number(args.rate);
export const WORKERS = Number(args.workers);
export const CONCURRENCY = Number(args.concurrency);
export const FAULT_GAP = args['fault-gap'] === undefined ? undefined : Number(args['fault-gap']);
export const FIRST_FAULT_S = Number(args['first-fault']);
export const KINDS = ['kill9', 'sigstop', 'term-sessions', 'term-listener', 'pg-crash', 'pg-pause'] as const;
export type Kind = (typeof KINDS)[number];
const shuffle = <T>(xs: T[]): T[] =>
  xs
    .map((x) => [Math.random(), x] as const)
    .sort((a, b) => a[0] - b[0])
    .map(([, x]) => x);
// Random order, but the three that exercise recovery hardest come first: 20 min at 3–5 min gaps fit about 5 faults.
export const ORDER: Kind[] = args.faults
  ? (args.faults.split(',') as Kind[])
  : [...shuffle<Kind>(['kill9', 'sigstop', 'pg-crash']), ...shuffle<Kind>(['term-sessions', 'term-listener', 'pg-pause'])];
for (const k of ORDER) if (!KINDS.includes(k)) throw new Error(`unknown fault ${k}; one of ${KINDS.join(', ')}`);
export const PROFILE = { ...FAST };
export const L = PROFILE.leaseDuration;
export const BOUND_MS = PROFILE.leaseDuration + PROFILE.recoverCutoff + PROFILE.recoverInterval + 1000;
export const STOP_MS = BOUND_MS + 2000;
export const PAUSE_MS = 4000;
export const RETENTION = 60_000;
/** The schedulers' entries: label → `@every` interval. */
export const CRON_ENTRIES = { '1s': '1s', '10s': '10s', '1m': '1m', '5m': '5m' };
export const maxOf = (xs: number[]): number | null => (xs.length ? Math.max(...xs) : null);
export const MAX_RETRY: Record<string, number> = { q: 5, s: 5, f2: 5, long: 5, fa: 2, cron: 5 };

export interface FaultRecord {
  at: string;
  t_s: number;
  kind: Kind;
  target: string;
  detail?: string;
  heal_at?: string;
  recovery_s?: number | null;
  throughput_recovery_s?: number | null;
}

/** h_enq: every enqueue of the producer, in its transaction; h_cron: every scheduler_events insert (the I8 oracle; the library trims its own history). */
export const ORACLE_EXTRA = `
CREATE TABLE {{schema}}.h_enq (task_id text PRIMARY KEY, kind text NOT NULL, process_at timestamptz,
  at timestamptz NOT NULL DEFAULT clock_timestamp());
${logTrigger({
  name: 'h_cron_copy',
  table: '{{schema}}.h_cron (entry_id text NOT NULL, tick_at timestamptz NOT NULL, task_id text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())',
  insert: 'INSERT INTO {{schema}}.h_cron (entry_id, tick_at, task_id) VALUES (NEW.entry_id, NEW.tick_at, NEW.task_id)',
  on: 'AFTER INSERT ON {{schema}}.scheduler_events',
})}`;
