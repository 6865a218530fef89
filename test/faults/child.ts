/**
 * A process the harness spawned (a worker, a producer, a load child): its
 * stdout event lines as they come, its latest metrics line, the signals the
 * harness sent it and how it exited; and the options a worker or a producer
 * is spawned with.
 */
import type { ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import type { Profile } from './profile.js';

export interface WorkerMetrics {
  claimed: number;
  fencedWrites: number;
  leasesLost: number;
  recovered: number;
  archivedByRecoverer: number;
  loopLagMaxMs: number;
}

export interface SpawnSpec {
  name: string;
  role: 'worker' | 'producer';
  env: Record<string, string>;
  /** A command put in front of node (`ip netns exec <ns>`, which execs in place: the pid stays node's). */
  wrap?: string[];
}

/** What h.spawnWorker() makes of a worker (children/worker.ts's environment). */
export interface WorkerOptions {
  concurrency?: number;
  profile?: Partial<Profile>;
  sleepMin?: number;
  sleepMax?: number;
  ignoreAbort?: boolean;
  /** Wait for the ready line (default true). */
  waitReady?: boolean;
  /** More environment for the process (a preloaded libfaketime, say). */
  env?: Record<string, string>;
  /** A command to run the worker under, one that execs it in place (netns.ts: `ip netns exec <ns>`). */
  wrap?: string[];
}

/** What h.spawnProducer() makes of a producer (children/producer.ts's environment). */
export interface ProducerOptions {
  count: number;
  /** Tasks per second; 0: as fast as `inflight` allows. */
  rate: number;
  inflight?: number;
  type?: string;
  maxRetry?: number;
  /** Share of tasks (0–1) enqueued 0.5–2 s ahead, their due time recorded for I6. */
  scheduled?: number;
  /** Each task's handler sleeps a duration drawn from [msMin, msMax] ms. */
  msMin?: number;
  msMax?: number;
  /** More environment for the process (CLIENT_POOL=user, say). */
  env?: Record<string, string>;
}

/** A process the harness spawned. */
export class Child {
  readonly events: Record<string, any>[] = [];
  /** The latest metrics line (workers print one every 500 ms and at exit). */
  metrics: WorkerMetrics | undefined;
  /** Set once it exited: its code and signal. */
  exitInfo: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  /** Signals the harness sent (a SIGKILL'd child is expected to die). */
  readonly signals: NodeJS.Signals[] = [];
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  readonly #waiters: { pred: (e: Record<string, any>) => boolean; resolve: (e: Record<string, any>) => void }[] = [];

  constructor(
    readonly name: string,
    readonly role: 'worker' | 'producer',
    readonly proc: ChildProcess,
    readonly spec: SpawnSpec,
  ) {
    this.exited = new Promise((resolve) => {
      proc.on('exit', (code, signal) => {
        this.exitInfo = { code, signal };
        resolve(this.exitInfo);
      });
    });
    createInterface({ input: proc.stdout! }).on('line', (line) => {
      let e: Record<string, any>;
      try {
        e = JSON.parse(line);
      } catch {
        return;
      }
      // When the harness read it, on its own clock: against a child's hostNow, the child's skew.
      e.receivedAt = Date.now();
      this.events.push(e);
      if (e.event === 'metrics') this.metrics = e as unknown as WorkerMetrics;
      for (const w of [...this.#waiters]) {
        if (w.pred(e)) {
          this.#waiters.splice(this.#waiters.indexOf(w), 1);
          w.resolve(e);
        }
      }
    });
  }

  get pid(): number {
    return this.proc.pid!;
  }

  /** The tag its rows carry in h_exec / h_effects. */
  get tag(): string {
    return `${this.name}:${this.pid}`;
  }

  get alive(): boolean {
    return this.exitInfo === undefined;
  }

  /** The server id (lease_owner) a worker reported when ready. */
  get serverId(): string | undefined {
    return this.events.find((e) => e.event === 'ready')?.serverId;
  }

  /** Resolves with the first event (already seen or to come) that matches; rejects after timeoutMs or if the child exits first. */
  waitEvent(pred: (e: Record<string, any>) => boolean, timeoutMs = 20_000, what = 'event'): Promise<Record<string, any>> {
    const seen = this.events.find(pred);
    if (seen) return Promise.resolve(seen);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${this.name}: no ${what} within ${timeoutMs} ms`)), timeoutMs);
      const entry = {
        pred,
        resolve: (e: Record<string, any>) => {
          clearTimeout(timer);
          resolve(e);
        },
      };
      this.#waiters.push(entry);
      void this.exited.then((x) => {
        clearTimeout(timer);
        reject(new Error(`${this.name} exited (${x.code ?? x.signal}) before ${what}`));
      });
    });
  }

  /** An exit the harness did not cause and the test did not allow for. */
  unexpectedExit(allowedCodes: readonly number[] = []): boolean {
    if (!this.exitInfo) return false;
    const { code, signal } = this.exitInfo;
    if (signal !== null) return !this.signals.includes(signal);
    if (code === 0) return !this.signals.includes('SIGTERM') && this.role !== 'producer';
    return !allowedCodes.includes(code!);
  }
}
