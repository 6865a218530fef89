/**
 * Every queue's QueueInfo, read once per second at most however many
 * browsers poll, and the samples of queue sizes the live chart draws. The
 * dashboard samples only when something asks (a page or the JSON poll), so
 * an idle dashboard sends no query; the chart shows gaps for the minutes
 * nobody watched. Actions invalidate the cache, so a page rendered after an
 * action shows its effect.
 */
import { isQueueNotFound } from '../model/errors.js';
import type { Inspector } from '../inspector.js';
import type { QueueInfo } from '../model/inspector-types.js';

/** The counts of one queue at one instant, as the live chart needs them. */
export type QueueCounts = Pick<QueueInfo, 'size' | 'pending' | 'active' | 'scheduled' | 'retry' | 'archived' | 'completed' | 'aggregating' | 'waiting'>;

export interface Sample {
  /** ms since the epoch (database clock). */
  t: number;
  queues: Record<string, QueueCounts>;
}

/** How long a read of every queue is reused. */
const FRESH_MS = 1000;
/** How far back the live chart goes. */
export const WINDOW_MS = 10 * 60_000;
/** Fewest ms between two samples. */
const MIN_SAMPLE_GAP_MS = 1000;

export class QueueSampler {
  readonly #inspector: Inspector;
  #cached: { at: number; infos: Promise<QueueInfo[]> } | undefined;
  readonly #samples: Sample[] = [];

  constructor(inspector: Inspector) {
    this.#inspector = inspector;
  }

  /** Every queue's info, by name; reused for up to a second. */
  infos(): Promise<QueueInfo[]> {
    const now = performance.now();
    if (this.#cached && now - this.#cached.at < FRESH_MS) return this.#cached.infos;
    const infos = this.#read();
    this.#cached = { at: now, infos };
    infos.then(
      (list) => this.#record(list),
      () => {
        if (this.#cached?.infos === infos) this.#cached = undefined;
      },
    );
    return infos;
  }

  /** Forgets the cached read (after an action). */
  invalidate(): void {
    this.#cached = undefined;
  }

  /** The samples of the last WINDOW_MS, oldest first. */
  samples(): Sample[] {
    return [...this.#samples];
  }

  async #read(): Promise<QueueInfo[]> {
    const names = await this.#inspector.queues();
    const all = await Promise.all(
      names.map((q) => this.#inspector.getQueueInfo(q).catch((err: unknown) => (isQueueNotFound(err) ? null : Promise.reject(err)))),
    );
    return all.filter((q): q is QueueInfo => q !== null);
  }

  #record(infos: QueueInfo[]): void {
    const t = infos[0]?.timestamp.getTime() ?? Date.now();
    const last = this.#samples.at(-1);
    if (last && t - last.t < MIN_SAMPLE_GAP_MS) return;
    const queues: Record<string, QueueCounts> = {};
    for (const i of infos) {
      queues[i.queue] = {
        size: i.size,
        pending: i.pending,
        active: i.active,
        scheduled: i.scheduled,
        retry: i.retry,
        archived: i.archived,
        completed: i.completed,
        aggregating: i.aggregating,
        waiting: i.waiting,
      };
    }
    this.#samples.push({ t, queues });
    while (this.#samples.length > 0 && t - (this.#samples[0] as Sample).t > WINDOW_MS) this.#samples.shift();
  }
}
