/**
 * L1's configuration (l1.ts): the command's flags, the profiles and the
 * cluster's settings, read once for the phases (l1-phases.ts) and the checks
 * (l1-checks.ts).
 */
import { parseArgs } from 'node:util';

const { values: args } = parseArgs({
  options: {
    tasks: { type: 'string' },
    small: { type: 'boolean', default: false },
    chaos: { type: 'boolean', default: false },
    'phase-c': { type: 'string', default: '120' },
    workers: { type: 'string', default: '8' },
    concurrency: { type: 'string', default: '16' },
    prefetch: { type: 'string', default: '16' },
    batch: { type: 'string', default: '1000' },
    'drain-timeout': { type: 'string' },
  },
});
export const N = Number(args.tasks ?? (args.small ? 100_000 : 1_000_000));
export const CHAOS = args.chaos;
export const PHASE_C_S = CHAOS ? 0 : Number(args['phase-c']);
export const WORKERS = Number(args.workers);
export const CONCURRENCY = Number(args.concurrency);
export const PREFETCH = Number(args.prefetch);
export const BATCH = Number(args.batch);
export const NAME = CHAOS ? 'l1b' : 'l1';
export const TEST = CHAOS ? 'L1b chaos drain' : N === 100_000 ? 'L1-small' : 'L1';
export const MAX_RETRY = CHAOS ? 25 : 5;
/**
 * Phase B stops here if it has not drained: the workers are shut down and the figures say how far it got.
 * Room for 200 tasks/s: this two-core machine drained 1,000,000 at 933/s on one day and 340/s on another.
 */
export const DRAIN_TIMEOUT_S = Number(args['drain-timeout'] ?? Math.max(1200, N / 200));

const PRODUCTION = {
  leaseDuration: 30_000,
  heartbeatInterval: 5_000,
  recoverCutoff: 30_000,
  recoverInterval: 60_000,
  taskCheckInterval: 1_000,
  shutdownTimeout: 8_000,
};
const CHAOS_PROFILE = {
  leaseDuration: 10_000,
  heartbeatInterval: 2_000,
  recoverCutoff: 5_000,
  recoverInterval: 5_000,
  taskCheckInterval: 1_000,
  shutdownTimeout: 8_000,
};
export const PROFILE = CHAOS ? CHAOS_PROFILE : PRODUCTION;
/** I4's bound B = L + C + R + 1 s, plus 1 s of jitter for the oracle. */
export const BOUND_S = (PROFILE.leaseDuration + PROFILE.recoverCutoff + PROFILE.recoverInterval) / 1000 + 2;

export const SETTINGS = {
  shared_buffers: "'1GB'",
  max_wal_size: "'8GB'",
  checkpoint_timeout: "'15min'",
  synchronous_commit: 'on',
  autovacuum: 'on',
  max_connections: 250,
  log_autovacuum_min_duration: 0,
};
