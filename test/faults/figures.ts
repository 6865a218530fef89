/**
 * The suite's figures (reliability plan §5.1): one JSON line per test in
 * results/reliability-results.jsonl, the plan's fields first, in its order,
 * then whatever the test adds. run.ts prints them as a table.
 */
import { appendFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = fileURLToPath(new URL('.', import.meta.url));
export const RESULTS_DIR = join(HERE, 'results');
export const RESULTS_FILE = join(RESULTS_DIR, 'reliability-results.jsonl');

/** The plan's figure fields, in order; tests may add their own after them. */
export interface Figures {
  test: string;
  profile: string;
  tasks: number;
  lost: number;
  dup_effects: number;
  orphan_effects: number;
  dup_external: number;
  max_attempts_seen: number;
  stuck_max_s: number | null;
  recovery_s: number | number[] | null;
  leases_lost: number | null;
  fenced_rejections: number | null;
  deadlocks: number | null;
  p50_ms: number | null;
  p99_ms: number | null;
  notes: string;
  [extra: string]: unknown;
}

const FIELDS = [
  'test',
  'profile',
  'tasks',
  'lost',
  'dup_effects',
  'orphan_effects',
  'dup_external',
  'max_attempts_seen',
  'stuck_max_s',
  'recovery_s',
  'leases_lost',
  'fenced_rejections',
  'deadlocks',
  'p50_ms',
  'p99_ms',
  'notes',
] as const;

/** Appends one JSON line per test to results/reliability-results.jsonl, plan fields first. */
export function recordFigures(obj: Partial<Figures> & { test: string }): void {
  mkdirSync(RESULTS_DIR, { recursive: true });
  const line: Record<string, unknown> = {};
  for (const f of FIELDS) line[f] = obj[f] ?? (f === 'notes' ? '' : f === 'profile' ? 'fast' : null);
  for (const [k, v] of Object.entries(obj)) if (!(k in line)) line[k] = v;
  appendFileSync(RESULTS_FILE, `${JSON.stringify(line)}\n`);
}
