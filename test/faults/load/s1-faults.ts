/**
 * S1's faults (s1.ts): every 3–5 min (first after --first-fault s) one of
 * kill -9 a worker (respawned 2 s later), SIGSTOP one past its lease then
 * SIGCONT, terminate one worker's sessions, terminate the listeners, crash
 * PostgreSQL, pause it; each logged with when it was injected and healed,
 * how long until its tasks were rescued and until throughput was back.
 */
import { sleep, type Child, type Harness } from '../harness.js';
import { log, respawnLoadChild, round, type LoadRun } from './common.js';
import { BOUND_MS, DURATION_S, FAULT_GAP, FIRST_FAULT_S, ORDER, PAUSE_MS, STOP_MS, type FaultRecord, type Kind } from './s1-config.js';

export interface FaultContext {
  run: LoadRun;
  H: Harness;
  /** The worker slots (a respawn takes its slot). */
  workers: Child[];
  producer: Child;
  /** Seconds since the load started. */
  el: () => number;
  /** Completions per second between two instants (el() seconds), null before there are two samples. */
  rateBetween: (a: number, b: number) => number | null;
}

/**
 * Injects the faults in ORDER until the producer is done (or 30 s before the end): `faults` fills as they come,
 * `pending` holds the recovery measurements still running, `loop` resolves once no fault is left to inject.
 */
export function startFaults({ run, H, workers, producer, el, rateBetween }: FaultContext): {
  faults: FaultRecord[];
  pending: Promise<unknown>[];
  loop: Promise<void>;
} {
  const faults: FaultRecord[] = [];
  const pending: Promise<unknown>[] = [];
  const pick = () => {
    const alive = workers.filter((w) => w.alive);
    return alive[Math.floor(Math.random() * alive.length)]!;
  };
  const throughputRecovery = async (f: FaultRecord, injectedAt: number, healedAt: number) => {
    const before = rateBetween(injectedAt - 60, injectedAt);
    if (!before) return;
    for (let end = healedAt + 5; end < healedAt + 180; end += 1) {
      while (el() < end + 1.5) await sleep(500);
      const r = rateBetween(end - 5, end);
      if (r !== null && r >= 0.9 * before) {
        f.throughput_recovery_s = round(end - healedAt, 1);
        return;
      }
    }
    f.throughput_recovery_s = null;
  };
  const inject = async (kind: Kind) => {
    const tInj = el();
    const f: FaultRecord = { at: new Date().toISOString(), t_s: round(tInj)!, kind, target: '' };
    faults.push(f);
    const track = (w: Child) => {
      const sid = w.serverId!;
      pending.push(
        H.trackRecovery(sid, 120_000).then(
          (s) => (f.recovery_s = s),
          () => (f.recovery_s = null),
        ),
      );
    };
    switch (kind) {
      case 'kill9': {
        const w = pick();
        f.target = w.tag;
        track(w);
        H.signal(w, 'SIGKILL');
        await sleep(2000);
        const slot = workers.indexOf(w);
        const c = await respawnLoadChild(H, w);
        workers[slot] = c;
        f.detail = `respawned as ${c.tag}`;
        break;
      }
      case 'sigstop': {
        const w = pick();
        f.target = w.tag;
        track(w);
        H.signal(w, 'SIGSTOP');
        // At B = L + C + R + 1 s into the stop: which of its tasks are still active, and is a
        // session of the frozen process holding a transaction open (ctx.transaction's row lock)?
        await sleep(BOUND_MS);
        const still = (
          await H.query<{ id: string }>("SELECT id FROM {{schema}}.tasks WHERE state = 'active' AND lease_owner = $1", [w.serverId]).catch(() => [])
        ).map((r) => r.id);
        const tx = await H.one<{ n: number; total: number }>(
          "SELECT count(*) FILTER (WHERE state LIKE 'idle in transaction%')::int AS n, count(*)::int AS total FROM pg_stat_activity WHERE application_name = $1",
          [`pgasynq:server:${w.pid}`],
        ).catch(() => ({ n: -1, total: -1 }));
        await sleep(STOP_MS - BOUND_MS);
        H.signal(w, 'SIGCONT');
        f.detail = `stopped ${STOP_MS} ms; at +${BOUND_MS / 1000} s ${still.length} of its tasks still active, ${tx.n} of its ${tx.total} sessions idle in transaction`;
        if (still.length > 0) {
          pending.push(
            sleep(3000)
              .then(() =>
                H.query<{ worker: string; n: number }>('SELECT worker, count(*)::int AS n FROM {{schema}}.h_effects WHERE task_id = ANY($1) GROUP BY 1', [
                  still,
                ]),
              )
              .then((r) => void (f.detail += `; their effects were then written by ${r.map((x) => `${x.worker} (${x.n})`).join(', ') || 'nobody yet'}`))
              .catch(() => {}),
          );
        }
        break;
      }
      case 'term-sessions': {
        const w = pick();
        f.target = `pgasynq:server:${w.pid} (${w.tag})`;
        f.detail = `${await H.terminate(`pgasynq:server:${w.pid}`)} sessions terminated`;
        break;
      }
      case 'term-listener': {
        f.target = 'pgasynq:listener (all)';
        f.detail = `${await H.terminate('pgasynq:listener')} listeners terminated`;
        break;
      }
      case 'pg-crash': {
        f.target = 'postgres';
        H.cluster.crash();
        await sleep(1000);
        const s = performance.now();
        H.cluster.start();
        f.detail = `down 1 s, start took ${Math.round(performance.now() - s)} ms`;
        break;
      }
      case 'pg-pause': {
        f.target = 'postgres';
        H.cluster.pause();
        await sleep(PAUSE_MS);
        H.cluster.resume();
        f.detail = `paused ${PAUSE_MS} ms`;
        break;
      }
    }
    f.heal_at = new Date().toISOString();
    log(`fault ${kind} on ${f.target}: ${f.detail ?? ''}`);
    pending.push(throughputRecovery(f, tInj, el()));
  };
  const loop = (async () => {
    let next = FIRST_FAULT_S;
    let i = 0;
    while (!run.stopping) {
      while (el() < next && !run.stopping && producer.alive) await sleep(250);
      if (run.stopping || !producer.alive || el() > DURATION_S - 30) break;
      await inject(ORDER[i++ % ORDER.length]!).catch((err) => log(`fault failed: ${err}`));
      next = el() + (FAULT_GAP ?? 180 + Math.random() * 120);
    }
  })();
  return { faults, pending, loop };
}
