/**
 * A throwaway PostgreSQL cluster for the fault suite: its own data directory,
 * port and socket directory, so a test may crash, pause and restart it without
 * touching the machine's server (or another suite's cluster).
 *
 * initdb refuses to run as root, so every server binary runs as the `postgres`
 * user (runuser); the directory is handed to that user first.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { chownSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { freePort } from '../../src/testing/test-database.js';

export { freePort };

export interface ClusterOptions {
  /** Extra `-c name=value` server settings (max_connections, log_statement, ...). */
  settings?: Record<string, string | number>;
}

export interface Cluster {
  /** postgres://postgres@127.0.0.1:PORT/postgres */
  connectionString: string;
  port: number;
  dir: string;
  /** The server's log file (log_line_prefix shows application_name). */
  logFile: string;
  /** `pg_ctl -m immediate stop`: a crash, recovered at the next start. */
  crash(): void;
  start(): void;
  /** `pg_ctl -m fast restart`. */
  restart(): void;
  /** SIGSTOP / SIGCONT to the postmaster and all its children. */
  pause(): void;
  resume(): void;
  /** Terminates the backends whose application_name matches a LIKE pattern; returns how many. */
  terminate(applicationNameLike: string): Promise<number>;
  /** Stops the server and removes its directory. */
  destroy(): void;
}

const PGBIN = execFileSync('pg_config', ['--bindir'], { encoding: 'utf8' }).trim();

function asPostgres(bin: string, args: string[]): void {
  const root = userInfo().uid === 0;
  const [cmd, argv] = root ? ['runuser', ['-u', 'postgres', '--', join(PGBIN, bin), ...args]] : [join(PGBIN, bin), args];
  const run = spawnSync(cmd, argv, { encoding: 'utf8' });
  if (run.status !== 0) throw new Error(`${bin} ${args.join(' ')} failed (${run.status}): ${run.stderr || run.stdout}`);
}

/** Creates, configures and starts a cluster; `destroy()` it when done. */
export async function startCluster(opts: ClusterOptions = {}): Promise<Cluster> {
  const dir = mkdtempSync(join(tmpdir(), 'pgasynq-faults-'));
  if (userInfo().uid === 0) {
    const pgUser = execFileSync('id', ['-u', 'postgres'], { encoding: 'utf8' }).trim();
    const pgGroup = execFileSync('id', ['-g', 'postgres'], { encoding: 'utf8' }).trim();
    chownSync(dir, Number(pgUser), Number(pgGroup));
  }
  const data = join(dir, 'data');
  const logFile = join(dir, 'server.log');
  const port = await freePort();
  asPostgres('initdb', ['-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync', '-E', 'UTF8', '--locale=C']);
  const settings: Record<string, string | number> = {
    port,
    listen_addresses: "'127.0.0.1'",
    unix_socket_directories: `'${dir}'`,
    max_connections: 200,
    shared_buffers: "'128MB'",
    fsync: 'on', // F09 crashes the server: acknowledged commits must survive it
    synchronous_commit: 'on',
    log_line_prefix: "'%m [%p] %a '",
    idle_in_transaction_session_timeout: "'10s'",
    tcp_keepalives_idle: 5,
    tcp_keepalives_interval: 2,
    tcp_keepalives_count: 3,
    ...opts.settings,
  };
  const conf = Object.entries(settings)
    .map(([k, v]) => `${k} = ${v}`)
    .join('\n');
  writeFileSync(join(data, 'postgresql.auto.conf'), `${conf}\n`);
  const start = (): void => asPostgres('pg_ctl', ['-D', data, '-l', logFile, '-w', '-t', '60', 'start']);
  const stop = (mode: string): void => asPostgres('pg_ctl', ['-D', data, '-m', mode, '-w', 'stop']);
  const postmasterPid = (): number => Number(readFileSync(join(data, 'postmaster.pid'), 'utf8').split('\n')[0]);
  const signalAll = (signal: string): void => {
    const pid = postmasterPid();
    const children = spawnSync('pgrep', ['-P', String(pid)], { encoding: 'utf8' })
      .stdout.split('\n')
      .filter(Boolean);
    // Children first on STOP (nothing runs half-paused for long), the postmaster first on CONT.
    const order = signal === 'STOP' ? [...children, String(pid)] : [String(pid), ...children];
    spawnSync('kill', [`-${signal}`, ...order]);
  };
  start();
  const connectionString = `postgres://postgres@127.0.0.1:${port}/postgres`;
  let destroyed = false;
  return {
    connectionString,
    port,
    dir,
    logFile,
    crash: () => stop('immediate'),
    start,
    restart: () => asPostgres('pg_ctl', ['-D', data, '-l', logFile, '-m', 'fast', '-w', 'restart']),
    pause: () => signalAll('STOP'),
    resume: () => signalAll('CONT'),
    async terminate(like) {
      const client = new pg.Client({ connectionString, application_name: 'harness' });
      await client.connect();
      try {
        const { rows } = await client.query<{ ok: boolean }>(
          'SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity WHERE application_name LIKE $1 AND pid <> pg_backend_pid()',
          [like],
        );
        return rows.filter((r) => r.ok).length;
      } finally {
        await client.end();
      }
    },
    destroy() {
      if (destroyed) return;
      destroyed = true;
      try {
        signalAll('CONT');
        stop('immediate');
      } catch {
        // already stopped
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
