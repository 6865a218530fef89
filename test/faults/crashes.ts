/**
 * The faults the workflow and limit tests (F32, F32b, F33, F33b) inflict
 * mid-run, and the oracle they share: a worker killed -9 and respawned, a
 * PostgreSQL crash (immediate stop, down a while, start), the same crash with
 * the WAL writer held so that what committed asynchronously is lost with it,
 * and the triggers that log every completion and release in the transaction
 * that makes it.
 */
import { sleep, waitFor, type Child, type Harness } from './harness.js';

/**
 * wf_done: every completion; wf_rel: every way out of `waiting`. Each row is
 * written by the transaction that makes the change (its id in `xid`), so a
 * change lost with a crashed transaction is lost with its row, and one that
 * commits twice shows as two rows.
 */
export const WORKFLOW_LOG_SQL = `
CREATE TABLE {{schema}}.wf_done (seq bigint NOT NULL, xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
  at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE {{schema}}.wf_rel (seq bigint NOT NULL, state text NOT NULL, xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
  at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION {{schema}}.wf_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_ARGV[0] = 'done' THEN
    INSERT INTO {{schema}}.wf_done (seq) VALUES (NEW.seq);
  ELSE
    INSERT INTO {{schema}}.wf_rel (seq, state) VALUES (NEW.seq, NEW.state);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER wf_done AFTER UPDATE OF state ON {{schema}}.task_states FOR EACH ROW
  WHEN (NEW.state = 'completed' AND OLD.state IS DISTINCT FROM 'completed') EXECUTE FUNCTION {{schema}}.wf_log('done');
CREATE TRIGGER wf_rel AFTER UPDATE OF state ON {{schema}}.task_states FOR EACH ROW
  WHEN (OLD.state = 'waiting' AND NEW.state IS DISTINCT FROM 'waiting') EXECUTE FUNCTION {{schema}}.wf_log('rel');`;

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
