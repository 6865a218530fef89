/**
 * The faults the tests inflict mid-run: a worker killed -9 and respawned
 * (the victim picked among the live workers by what it holds), a PostgreSQL
 * crash (immediate stop, down a while, start), the same crash with the WAL
 * writer held so that what committed asynchronously is lost with it, and the
 * two in turns (F32, F33) or one after another at handler starts (F32b, F33b).
 */
import { sleep, waitFor, type Child, type Harness } from './harness.js';

/**
 * A live worker holding at least `min` of what `held` counts (random among
 * them), never the last live one: someone must be left to rescue its tasks.
 * `held` reads the counts once per try; waits up to 30 s.
 */
export function pickVictim(
  live: () => Iterable<Child>,
  held: () => Promise<(w: Child) => number>,
  o: { min: number; what: string; everyMs: number },
): Promise<{ victim: Child; held: number }> {
  return waitFor(
    async () => {
      const candidates = [...live()];
      if (candidates.length < 2) return undefined;
      const count = await held();
      const busy = candidates.flatMap((w) => (count(w) >= o.min ? [{ victim: w, held: count(w) }] : []));
      return busy[Math.floor(Math.random() * busy.length)];
    },
    30_000,
    o.what,
    o.everyMs,
  );
}

/** `held` for pickVictim(): per worker, a count by lease_owner (`owner`, `held` columns) that `sql` returns; none while the database refuses. */
export function heldByOwner(h: Harness, sql: string, values?: unknown[]): () => Promise<(w: Child) => number> {
  return async () => {
    const rows = await h.query<{ owner: string; held: number }>(sql, values).catch(() => []);
    return (w) => rows.find((r) => r.owner === w.serverId)?.held ?? 0;
  };
}

/**
 * Kills `victim` with SIGKILL and takes it out of `live`; resolves once a
 * new process with its spec runs, `afterMs` later, and is back in `live`.
 */
export async function killAndRespawn(h: Harness, victim: Child, live: Map<string, Child>, afterMs = 2000): Promise<void> {
  live.delete(victim.name);
  h.signal(victim, 'SIGKILL');
  await sleep(afterMs);
  const again = await h.respawn(victim);
  live.set(again.name, again);
}

/** Crashes PostgreSQL (immediate stop), leaves it down `downMs`, starts it; resolves with the start's ms once the harness reconnects. */
export async function crashAndRestart(h: Harness, downMs: number): Promise<number> {
  h.cluster.crash();
  await sleep(downMs);
  const t0 = performance.now();
  h.cluster.start();
  const restartMs = Math.round(performance.now() - t0);
  await waitFor(() => h.dbNow().catch(() => undefined), 20_000, 'the harness to reconnect');
  return restartMs;
}

/** The pid of PostgreSQL's WAL writer (a new one after each restart). */
async function walWriterPid(h: Harness): Promise<number> {
  return (await h.one<{ pid: number }>("SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'")).pid;
}

/**
 * A crash that loses what committed asynchronously since `trigger` was
 * armed: the WAL writer is stopped (SIGSTOP), so that such commits stay in
 * the shared WAL buffers (a window wal_writer_delay otherwise closes by
 * itself); once `trigger` resolves (or rejects: `targeted` is then false) it
 * is killed -9, which the postmaster takes for a crash (as when the OOM
 * killer takes a server process), and the cluster is crashed and restarted.
 */
export async function crashWithWalHeld(
  h: Harness,
  downMs: number,
  trigger: () => Promise<unknown>,
): Promise<{ crashedAt: number; restartMs: number; targeted: boolean }> {
  const walWriter = await walWriterPid(h);
  process.kill(walWriter, 'SIGSTOP');
  const targeted = await trigger().then(
    () => true,
    () => false,
  );
  const crashedAt = Date.now();
  process.kill(walWriter, 'SIGKILL');
  return { crashedAt, restartMs: await crashAndRestart(h, downMs), targeted };
}

/** The next handler start (after now) of a task `match` accepts, as a live worker says it (REPORT_EXEC): its claim committed just before. */
export function nextHandlerStart(h: Harness, match: (taskId: string) => boolean, timeoutMs: number): Promise<unknown> {
  const armed = Date.now();
  const workers = h.children.filter((w) => w.role === 'worker' && w.alive);
  return Promise.any(workers.map((w) => w.waitEvent((e) => e.event === 'started' && e.at >= armed && match(String(e.taskId)), timeoutMs, 'a handler start')));
}

export interface TurnsOptions {
  kills: number;
  crashes: number;
  /** Before each fault: a wait of gapMs[0] + a random share of gapMs[1]. */
  gapMs: [number, number];
  downMs: number;
  /** Whom to kill: pickVictim()'s `held` and options. */
  held: () => Promise<(w: Child) => number>;
  victim: { min: number; what: string; everyMs: number };
  /** What a crash is noted with, just before it (releases in flight, tasks active: it may wait for its moment). */
  beforeCrash: () => Promise<number>;
}

export interface Turns {
  /** What each victim held when killed. */
  heldAtKill: number[];
  /** What beforeCrash() said before each crash. */
  atCrash: number[];
  restartMs: number[];
  /** performance.now() once the harness had reconnected after each crash. */
  reconnectedAt: number[];
  /** Resolves once every killed worker runs again. */
  respawned: Promise<unknown>;
}

/**
 * Kill -9 and crash in turns, a kill first (kill, crash, kill, … while both are left), the victims
 * among `workers` (and their respawns), each respawned 2 s after its kill, each crash down `downMs`.
 */
export async function killsAndCrashes(h: Harness, workers: Child[], o: TurnsOptions): Promise<Turns> {
  const live = new Map<string, Child>(workers.map((w) => [w.name, w]));
  const t: Turns = { heldAtKill: [], atCrash: [], restartMs: [], reconnectedAt: [], respawned: Promise.resolve() };
  const respawns: Promise<void>[] = [];
  for (let i = 0; i < o.kills + o.crashes; i++) {
    await sleep(o.gapMs[0] + Math.random() * o.gapMs[1]);
    const kill = t.restartMs.length >= o.crashes || (t.heldAtKill.length < o.kills && t.heldAtKill.length <= t.restartMs.length);
    if (kill) {
      const { victim, held } = await pickVictim(() => live.values(), o.held, o.victim);
      t.heldAtKill.push(held);
      respawns.push(killAndRespawn(h, victim, live));
    } else {
      t.atCrash.push(await o.beforeCrash());
      t.restartMs.push(await crashAndRestart(h, o.downMs));
      t.reconnectedAt.push(performance.now());
    }
  }
  t.respawned = Promise.all(respawns);
  return t;
}

/**
 * `crashes` crashes with the WAL writer held (crashWithWalHeld), each as soon as `trigger(i)`
 * resolves (a handler's start), after a wait of gapMs[0] + a random share of gapMs[1].
 */
export async function walHeldCrashes(
  h: Harness,
  o: { crashes: number; downMs: number; gapMs: [number, number]; trigger: (i: number) => Promise<unknown> },
): Promise<{ restartMs: number[]; crashedAt: number[]; untargeted: number }> {
  const r = { restartMs: [] as number[], crashedAt: [] as number[], untargeted: 0 };
  for (let i = 0; i < o.crashes; i++) {
    await sleep(o.gapMs[0] + Math.random() * o.gapMs[1]);
    const crash = await crashWithWalHeld(h, o.downMs, () => o.trigger(i));
    r.crashedAt.push(crash.crashedAt);
    r.restartMs.push(crash.restartMs);
    if (!crash.targeted) r.untargeted++;
  }
  return r;
}
