/**
 * WAL — what a task costs in write-ahead log, per phase of its life, black
 * box, on the throwaway cluster with nothing else running:
 *
 *   idle      the client connected, nothing happening, `idleMs` in two halves: baseline of (a)
 *   (a)       `n` tasks enqueued in ONE bulk call (enqueueMany / addJobs / …)
 *   (b)       a worker with concurrency `n` whose handler blocks until released:
 *             from its start until every one of the `n` handlers has started
 *             (every task claimed and marked running, however the system does it)
 *   hold      the `n` handlers kept blocked for `holdMs`: what running tasks
 *             cost while nothing else happens (lease heartbeats, …)
 *   (c)       the handlers released, until the system's tables hold nothing
 *             unfinished (every completion recorded)
 *   idle-w    the worker running with nothing to do, `idleMs` in two halves: baseline of (b), hold, (c)
 *
 * Each phase ends with `settleMs` of quiet, counted in it. Phase boundaries
 * are WAL positions (pg_current_wal_insert_lsn(), exact at the instant it is
 * read); what lies between two boundaries is counted by pg_waldump --stats on
 * the server's pg_wal (records, bytes, full-page-image bytes, by resource
 * manager). pg_stat_wal is read too, but a backend reports its WAL counts at
 * most once a second and an idle one up to 10 s later, so per-phase deltas of
 * pg_stat_wal land in the wrong phase; they serve as a check over the whole
 * measurement (`verifyMs` of quiet first). When pg_wal cannot be read (a
 * server given with --database-url on another machine, or no superuser),
 * the phases fall back to pg_stat_wal deltas with 11 s of quiet after each.
 *
 * Net figure of a phase = its WAL − the baseline's rate × the phase's
 * duration; ÷ n for per task. A baseline's rate is that of the quieter of its
 * two halves, so that an autovacuum which happened to run in one half is not
 * subtracted as if it were steady. Counted: everything any backend of the cluster
 * wrote meanwhile — the system's statements and commits, its own maintenance
 * (heartbeats of a server or worker registry, janitors), and autovacuum or
 * autoanalyze if they ran (their counts for the schema are recorded per
 * phase). A CHECKPOINT before the fresh schema is created means its pages are
 * new since the last checkpoint, so no full-page images are due in the phases
 * (their bytes are recorded to show it): the figures are the cost between
 * checkpoints, not the first touch of a page after one.
 */
import { execFileSync } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { join } from 'node:path';
import type pg from 'pg';
import type { Adapter } from '../adapters/types.js';
import { adminPool, log, now, sleep } from '../lib/common.js';
import { payload } from '../lib/payload.js';

export interface WalParams {
  n: number;
  /** Bytes of JSON per task (lib/payload.ts); 0: `{ i }` alone. */
  payload: number;
  idleMs: number;
  holdMs: number;
  settleMs: number;
  /** Quiet before the final pg_stat_wal read that checks pg_waldump's total; 0: no check. */
  verifyMs: number;
}

interface Reading {
  t: number;
  lsn: string;
  /** pg_stat_wal, as reported so far. */
  records: number;
  bytes: number;
  /** autovacuum_count + autoanalyze_count over the schema's tables. */
  auto: number;
}

async function read(pool: pg.Pool, schema: string): Promise<Reading> {
  const { rows } = await pool.query(
    `SELECT pg_current_wal_insert_lsn()::text AS lsn, w.wal_records::float8 AS records, w.wal_bytes::float8 AS bytes,
            (SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0)::float8 FROM pg_stat_user_tables WHERE schemaname = $1) AS auto
     FROM pg_stat_wal w`,
    [schema],
  );
  const r = rows[0] as Omit<Reading, 't'>;
  return { t: now(), ...r };
}

interface Wal {
  records: number;
  bytes: number;
  fpiBytes: number;
  /** Records and bytes by resource manager (Heap, Heap2, Btree, Transaction, …), non-zero ones. */
  byRmgr: Record<string, { records: number; bytes: number }>;
}

/** An LSN ('16/B374D848') as a byte position. */
const lsn = (text: string): bigint => {
  const [hi, lo] = text.split('/');
  return (BigInt(`0x${hi}`) << 32n) + BigInt(`0x${lo}`);
};

/** Waits until the server has flushed its WAL up to `to` (at most 10 s). */
async function flushedTo(pool: pg.Pool, to: string): Promise<void> {
  const deadline = now() + 10_000;
  while (now() < deadline) {
    const { rows } = await pool.query<{ flushed: string }>('SELECT pg_current_wal_flush_lsn()::text AS flushed');
    if (lsn(rows[0]!.flushed) >= lsn(to)) return;
    await sleep(50);
  }
  throw new Error(`WAL not flushed up to ${to} within 10 s`);
}

/** pg_waldump, when the server's pg_wal is on this machine and readable. */
function waldumpFor(pool: pg.Pool): Promise<((from: string, to: string) => Wal) | undefined> {
  return (async () => {
    try {
      const dir = (await pool.query<{ d: string }>(`SELECT current_setting('data_directory') AS d`)).rows[0]!.d;
      const tli = (await pool.query<{ t: number }>('SELECT timeline_id AS t FROM pg_control_checkpoint()')).rows[0]!.t;
      const wal = join(dir, 'pg_wal');
      accessSync(wal, constants.R_OK);
      const bin = join(execFileSync('pg_config', ['--bindir'], { encoding: 'utf8' }).trim(), 'pg_waldump');
      return (from: string, to: string): Wal => {
        const res: Wal = { records: 0, bytes: 0, fpiBytes: 0, byRmgr: {} };
        if (lsn(to) - lsn(from) <= 0n) return res;
        let out: string;
        try {
          out = execFileSync(bin, ['-p', wal, '-t', String(tli), '-s', from, '-e', to, '--stats'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
        } catch (e) {
          // Nothing but the tail of a record that began before `from`: no record starts in the range.
          if (/could not find a valid record/.test(String((e as { stderr?: string }).stderr)) && lsn(to) - lsn(from) < 8192n) return res;
          throw e;
        }
        for (const line of out.split('\n')) {
          const total = /^Total\s+(\d+)\s+(\d+)\s+\[[^\]]*\]\s+(\d+)\s+\[[^\]]*\]\s+(\d+)/.exec(line);
          if (total) {
            res.records = Number(total[1]);
            res.fpiBytes = Number(total[3]);
            res.bytes = Number(total[4]);
            continue;
          }
          const row = /^(\w+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)/.exec(line);
          if (row && Number(row[2]) > 0) res.byRmgr[row[1]!] = { records: Number(row[2]), bytes: Number(row[5]) };
        }
        return res;
      };
    } catch (e) {
      log(`WAL: pg_waldump unavailable (${(e as Error).message.split('\n')[0]}); per-phase figures from pg_stat_wal, with 11 s of quiet after each phase`);
      return undefined;
    }
  })();
}

export async function measure(a: Adapter, p: WalParams): Promise<Record<string, number>> {
  if (!a.schema) throw new Error(`${a.name}: WAL is measured on PostgreSQL systems`);
  const schema = a.schema;
  const pool = adminPool(1);
  const waldump = await waldumpFor(pool);
  // Without pg_waldump, pg_stat_wal must have caught up at every boundary: an idle backend reports within 10 s.
  const settleMs = waldump ? p.settleMs : Math.max(p.settleMs, 11_000);
  let checkpoint = 1;
  try {
    await pool.query('CHECKPOINT');
  } catch (e) {
    checkpoint = 0; // not a superuser: full-page images may show up
    log(`WAL: CHECKPOINT failed (${(e as Error).message}); continuing without`);
  }
  await a.setup({ fresh: true });
  await sleep(settleMs);
  const tasks = Array.from({ length: p.n }, (_, i) => payload(i, p.payload));
  let tornDown = false;
  try {
    const r0 = await read(pool, schema);
    await sleep(p.idleMs / 2);
    const r0b = await read(pool, schema);
    await sleep(p.idleMs / 2);
    const r1 = await read(pool, schema);

    // (a) one bulk call
    await a.enqueueMany(tasks);
    await sleep(settleMs);
    const r2 = await read(pool, schema);

    // (b) every task claimed and its handler started
    let started = 0;
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const workers = await a.startWorkers({
      concurrency: p.n,
      handler: async () => {
        started++;
        await gate;
      },
    });
    const deadline = now() + 120_000;
    while (started < p.n && now() < deadline) await sleep(10);
    if (started < p.n) {
      release();
      await workers.stop();
      throw new Error(`only ${started} of ${p.n} handlers started within 120 s`);
    }
    const claimedMs = now() - r2.t;
    await sleep(settleMs);
    const r3 = await read(pool, schema);

    // hold: n running tasks, nothing else
    await sleep(p.holdMs);
    const r4 = await read(pool, schema);

    // (c) released: until nothing unfinished is left
    release();
    const until = now() + 120_000;
    while ((await a.remaining()) > 0 && now() < until) await sleep(20);
    const completedMs = now() - r4.t;
    await sleep(settleMs);
    const r5 = await read(pool, schema);

    // idle worker: baseline of (b), hold and (c)
    await sleep(p.idleMs / 2);
    const r5b = await read(pool, schema);
    await sleep(p.idleMs / 2);
    const r6 = await read(pool, schema);
    await workers.stop();
    await a.teardown();
    tornDown = true;

    // The check: pg_stat_wal over the whole measurement, once every backend has reported.
    let statRecords = Number.NaN;
    let statBytes = Number.NaN;
    // pg_waldump reads pg_wal on disk: the last boundary read (an insert position) must be
    // flushed first, or the dump ends in a record not yet written (sessions that commit
    // asynchronously leave their WAL to the WAL writer).
    if (waldump) await flushedTo(pool, r6.lsn);
    if (waldump && p.verifyMs > 0) {
      await sleep(p.verifyMs);
      const rEnd = await read(pool, schema);
      await flushedTo(pool, rEnd.lsn);
      const whole = waldump(r0.lsn, rEnd.lsn);
      statRecords = (rEnd.records - r0.records) / whole.records;
      statBytes = (rEnd.bytes - r0.bytes) / whole.bytes;
    }

    const phases = {
      idle1: [r0, r0b],
      idle2: [r0b, r1],
      enqueue: [r1, r2],
      claim: [r2, r3],
      hold: [r3, r4],
      complete: [r4, r5],
      idleWorker1: [r5, r5b],
      idleWorker2: [r5b, r6],
    } as const;
    type Phase = keyof typeof phases;
    const measured = {} as Record<Phase, Wal & { seconds: number; autovacuums: number }>;
    for (const [name, [from, to]] of Object.entries(phases) as [Phase, readonly [Reading, Reading]][]) {
      const w: Wal = waldump
        ? waldump(from.lsn, to.lsn)
        : { records: to.records - from.records, bytes: to.bytes - from.bytes, fpiBytes: Number.NaN, byRmgr: {} };
      measured[name] = { ...w, seconds: (to.t - from.t) / 1000, autovacuums: to.auto - from.auto };
    }
    // Each baseline is the quieter of its two halves: an autovacuum that ran in one half is not a steady rate to subtract.
    const quieter = (x: Phase, y: Phase): Phase => (measured[x].bytes / measured[x].seconds <= measured[y].bytes / measured[y].seconds ? x : y);
    const idle = quieter('idle1', 'idle2');
    const idleWorker = quieter('idleWorker1', 'idleWorker2');
    const net = (phase: Phase, base: Phase, k: 'records' | 'bytes' | 'fpiBytes') => {
      const d = measured[phase];
      const b = measured[base];
      return (d[k] - (b[k] / b.seconds) * d.seconds) / p.n;
    };
    const out: Record<string, number> = {
      n: p.n,
      payloadBytes: JSON.stringify(tasks[0]).length,
      source: waldump ? 1 : 0,
      checkpoint,
      enqueueBytes: net('enqueue', idle, 'bytes'),
      enqueueRecords: net('enqueue', idle, 'records'),
      claimBytes: net('claim', idleWorker, 'bytes'),
      claimRecords: net('claim', idleWorker, 'records'),
      completeBytes: net('complete', idleWorker, 'bytes'),
      completeRecords: net('complete', idleWorker, 'records'),
      // While running: per running task per second, over the idle worker.
      holdBytesPerTaskSec: net('hold', idleWorker, 'bytes') / measured.hold.seconds,
      holdRecordsPerTaskSec: net('hold', idleWorker, 'records') / measured.hold.seconds,
      idleBytesPerSec: measured[idle].bytes / measured[idle].seconds,
      idleWorkerBytesPerSec: measured[idleWorker].bytes / measured[idleWorker].seconds,
      idleWorkerRecordsPerSec: measured[idleWorker].records / measured[idleWorker].seconds,
      claimedMs,
      completedMs,
      pgStatWalRecordsOverWaldump: statRecords,
      pgStatWalBytesOverWaldump: statBytes,
    };
    // Autovacuum or autoanalyze runs on the schema's tables that ended inside (a), (b), hold or (c): their WAL is in those figures.
    out.autovacuumsInPhases = (['enqueue', 'claim', 'hold', 'complete'] as const).reduce((sum, ph) => sum + measured[ph].autovacuums, 0);
    out.totalBytes = out.enqueueBytes! + out.claimBytes! + out.completeBytes!;
    out.totalRecords = out.enqueueRecords! + out.claimRecords! + out.completeRecords!;
    for (const [name, m] of Object.entries(measured)) {
      for (const k of ['seconds', 'records', 'bytes', 'fpiBytes', 'autovacuums'] as const) out[`raw.${name}.${k}`] = m[k];
      for (const [rmgr, v] of Object.entries(m.byRmgr)) {
        out[`raw.${name}.${rmgr}.records`] = v.records;
        out[`raw.${name}.${rmgr}.bytes`] = v.bytes;
      }
    }
    return out;
  } finally {
    if (!tornDown) await a.teardown().catch(() => {});
    await pool.end();
  }
}
