/** The systems under test, by the names --systems takes. Loaded lazily: each pulls in its own library. */
import type { Adapter } from './types.js';

export const SYSTEMS = [
  'pgasynq',
  'pgasynq-tuned',
  'pgasynq-watched',
  'pgasynq-durable',
  'pgasynq-unfollowed',
  'floor',
  'graphile',
  'graphile-default',
  'pgboss',
  'bullmq',
  'bullmq-pg',
  'floor-prefetch',
] as const;
/** Run only when named in --systems: diagnostics (what one watcher costs, what prefetch buys the floor), not BENCH.md's systems. */
export const EXTRA: readonly SystemName[] = ['floor-prefetch', 'pgasynq-watched', 'pgasynq-unfollowed'];
export type SystemName = (typeof SYSTEMS)[number];

/** Other spellings --systems accepts. */
export const ALIASES: Record<string, SystemName> = {
  'pgasynq-default': 'pgasynq',
  'pgasynq-prefetch': 'pgasynq-tuned',
  'graphile-worker': 'graphile',
  'graphile-tuned': 'graphile',
  'graphile-worker-default': 'graphile-default',
  'pg-boss': 'pgboss',
  'bullmq-redis': 'bullmq',
  bullmqpg: 'bullmq-pg',
  'bullmq-postgres': 'bullmq-pg',
  raw: 'floor',
  'raw-sql': 'floor',
};

export async function load(name: SystemName): Promise<Adapter> {
  switch (name) {
    case 'pgasynq':
      return await (await import('./pgasynq.js')).create();
    case 'pgasynq-tuned': {
      const m = await import('./pgasynq.js');
      return await m.create(m.TUNED_PREFETCH);
    }
    case 'pgasynq-watched':
      return await (await import('./pgasynq.js')).create(undefined, true);
    case 'pgasynq-durable':
      return await (await import('./pgasynq.js')).create(undefined, false, true);
    case 'pgasynq-unfollowed':
      return await (await import('./pgasynq.js')).create(undefined, false, false, true);
    case 'floor':
      return (await import('./floor.js')).create();
    case 'floor-prefetch':
      // graphile-worker's tuned localQueue size: what claims larger than the free slots buy.
      return (await import('./floor.js')).create(Number(process.env.FLOOR_PREFETCH ?? 500));
    case 'graphile':
      return (await import('./graphile.js')).create(true);
    case 'graphile-default':
      return (await import('./graphile.js')).create(false);
    case 'pgboss':
      return (await import('./pgboss.js')).create();
    case 'bullmq':
      return (await import('./bullmq.js')).create('redis');
    case 'bullmq-pg':
      return (await import('./bullmq.js')).create('pg');
  }
}
