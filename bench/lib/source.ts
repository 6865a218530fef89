/**
 * What surrounds the measurements of a run: bench/'s own dependencies (the
 * peers), the copy of pgasynq's src/ that every measurement of the run
 * imports, and the versions the results record. Apart from run.ts so that it
 * reads as the run's sequence of steps; the directories come in as parameters
 * (`bench`: bench/, `project`: the project's root).
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { cpSync, existsSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { REDIS_URL } from './common.js';

/** The build of src/ a run measures: its dist/index.js, and what identifies it. */
export interface SourceSnapshot {
  index: string;
  commit: string;
  dirty: string;
}

/** npm install --prefix bench when bench/node_modules is missing or older than package.json / the lockfile. */
export function ensureDependencies(bench: string, project: string): void {
  const manifest = ['package.json', 'package-lock.json'].map((f) => join(bench, f)).filter(existsSync);
  const hash = createHash('sha256');
  for (const f of manifest) hash.update(readFileSync(f));
  const digest = hash.digest('hex');
  const stamp = join(bench, 'node_modules', '.bench-deps-stamp');
  if (existsSync(stamp) && readFileSync(stamp, 'utf8') === digest) return;
  console.log('Installing the peers into bench/node_modules (npm install --prefix bench) …');
  execFileSync('npm', ['install', '--prefix', bench, '--no-audit', '--no-fund'], { stdio: 'inherit', cwd: project });
  // The install may have written the lockfile: stamp what is there now.
  const after = createHash('sha256');
  for (const f of ['package.json', 'package-lock.json'].map((f) => join(bench, f)).filter(existsSync)) after.update(readFileSync(f));
  writeFileSync(stamp, after.digest('hex'));
}

/**
 * Copies src/ and migrations/ to bench/.snapshot/<stamp>/ (with a node_modules
 * link to the project's), so that every measurement of this run imports the
 * same pgasynq even if src/ is edited meanwhile, and compiles the copy with the
 * package's own build settings: a user runs the compiled dist/, and so do the
 * peers (run through tsx, every function the source creates is named at run
 * time, which cost the drain about a seventh). Returns the build's index.js
 * and what identifies it (HEAD, whether src/ differed from it). `created` is
 * told bench/.snapshot/ as soon as this run owns it, so that an exit removes
 * it even when the copy fails midway.
 */
export function snapshotSource(stamp: string, bench: string, project: string, created: (dir: string) => void): SourceSnapshot {
  const dir = join(bench, '.snapshot');
  rmSync(dir, { recursive: true, force: true });
  created(dir);
  const root = join(dir, stamp);
  mkdirSync(root, { recursive: true });
  cpSync(join(project, 'src'), join(root, 'src'), { recursive: true });
  cpSync(join(project, 'migrations'), join(root, 'migrations'), { recursive: true });
  symlinkSync(join(project, 'node_modules'), join(root, 'node_modules'), 'dir');
  for (const f of ['tsconfig.json', 'tsconfig.build.json', 'package.json']) cpSync(join(project, f), join(root, f));
  // No declarations or source maps: only the JavaScript runs.
  execFileSync(join(project, 'node_modules', '.bin', 'tsc'), ['-p', join(root, 'tsconfig.build.json'), '--declaration', 'false', '--sourceMap', 'false'], {
    cwd: root,
    stdio: 'inherit',
  });
  const git = (...a: string[]) => {
    try {
      return execFileSync('git', a, { cwd: project, encoding: 'utf8' }).trim();
    } catch {
      return '?';
    }
  };
  const dirty = git('status', '--porcelain', '--', 'src', 'migrations');
  return {
    index: join(root, 'dist', 'index.js'),
    commit: git('rev-parse', '--short', 'HEAD'),
    dirty: dirty ? dirty.split('\n').length + ' uncommitted file(s) in src/ or migrations/' : 'clean',
  };
}

/** `source`: the copy the run measures (undefined with --live); `serverSettings`: what the server reported (SHOW). */
export async function versions(
  bench: string,
  project: string,
  source: SourceSnapshot | undefined,
  serverSettings: Record<string, string>,
): Promise<Record<string, string>> {
  const v: Record<string, string> = { node: process.version };
  for (const p of ['graphile-worker', 'pg-boss', 'bullmq', 'ioredis', 'pg']) {
    try {
      v[p] = JSON.parse(readFileSync(join(bench, 'node_modules', p, 'package.json'), 'utf8')).version;
    } catch {
      v[p] = 'not installed';
    }
  }
  v.pgasynq = JSON.parse(readFileSync(join(project, 'package.json'), 'utf8')).version;
  v['pgasynq.source'] = source ? `src/ copied at the start of the run: HEAD ${source.commit}, ${source.dirty}` : 'src/ live (--live)';
  try {
    v.postgresql = serverSettings.server_version ?? '?';
  } catch (e) {
    v.postgresql = `unreachable: ${(e as Error).message}`;
  }
  try {
    const { Redis } = await import('ioredis');
    const r = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 1 });
    await r.connect();
    const info = await r.info('server');
    v.redis = /redis_version:(\S+)/.exec(info)?.[1] ?? '?';
    const persistence = await r.info('persistence');
    v['redis.aof_enabled'] = /aof_enabled:(\S+)/.exec(persistence)?.[1] ?? '?';
    r.disconnect();
  } catch (e) {
    v.redis = `unreachable: ${(e as Error).message}`;
  }
  return v;
}
