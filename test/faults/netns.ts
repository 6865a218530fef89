/**
 * A worker "host" of its own for the partition tests (reliability plan §5.1):
 * a network namespace joined to the root namespace by a veth pair, one /30
 * between them. A process started with `ns.wrap` in front of its command
 * (`ip netns exec <ns> …`, which execs in place: the pid is the program's)
 * reaches the owned cluster at `ns.hostAddr`, which the cluster must listen
 * on (create the namespace before the cluster, then `allowInCluster`).
 *
 *   const ns = createNetns();
 *   const h = await createHarness('f12', { settings: { listen_addresses: `'127.0.0.1,${ns.hostAddr}'` } });
 *   await allowInCluster(h, ns);
 *   const w1 = await h.spawnWorker('w1', { wrap: ns.wrap, env: { DATABASE_URL: ns.dsn(h.connectionString) } });
 *   ns.cut();   // `ip link set <veth> down` inside the namespace
 *   ns.heal();
 *   ns.destroy(); // in after(), also if the test failed
 *
 * Only interfaces and namespaces this module created are touched: names carry
 * this process's pid, and the subnet (in 10.213.0.0/16) is checked against
 * every IPv4 address and route of the root namespace first. Whatever is still
 * standing when the process exits is removed then.
 *
 * Needs root (CAP_NET_ADMIN) and iproute2.
 */
import { execFileSync } from 'node:child_process';
import { appendFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Harness } from './harness.js';

export interface Netns {
  /** The namespace's name (`ip netns`). */
  name: string;
  /** The veth end in the root namespace, and the one inside. */
  hostIf: string;
  nsIf: string;
  /** The root namespace's address on the pair (the cluster listens here), and the namespace's. */
  hostAddr: string;
  nsAddr: string;
  /** The /30 of the pair, for pg_hba. */
  cidr: string;
  /** Put in front of a command to run it inside the namespace. */
  wrap: string[];
  /** A connection string with its host replaced by hostAddr. */
  dsn(connectionString: string): string;
  /** Takes the namespace's end of the pair down: nothing passes either way (packets already sent are retransmitted by TCP). */
  cut(): void;
  /** Brings it up again. */
  heal(): void;
  readonly isCut: boolean;
  /** Removes the pair and the namespace (idempotent). */
  destroy(): void;
}

const ip = (args: string[]): string => execFileSync('ip', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });

const live = new Set<Netns>();
let seq = 0;
let hooked = false;

/** Every 10.213.x.y address or route of the root namespace, as the /30 index it falls in. */
function usedIndexes(): Set<number> {
  const used = new Set<number>();
  const text = `${ip(['-4', '-o', 'addr', 'show'])}\n${ip(['-4', 'route', 'show', 'table', 'all'])}`;
  for (const m of text.matchAll(/\b10\.213\.(\d+)\.(\d+)/g)) used.add(Number(m[1]) * 64 + (Number(m[2]) >> 2));
  return used;
}

export function createNetns(): Netns {
  const n = seq++;
  const tag = `${process.pid}${n}`;
  const name = `pqf-${tag}`;
  const hostIf = `pqf${tag}h`;
  const nsIf = `pqf${tag}c`;
  if (hostIf.length > 15) throw new Error(`interface name ${hostIf} too long`);
  const used = usedIndexes();
  let idx = (process.pid * 4 + n) % 16384;
  while (used.has(idx)) idx = (idx + 1) % 16384;
  const base = `10.213.${idx >> 6}`;
  const last = (idx & 63) << 2;
  const hostAddr = `${base}.${last + 1}`;
  const nsAddr = `${base}.${last + 2}`;
  let destroyed = false;
  let cut = false;

  const ns: Netns = {
    name,
    hostIf,
    nsIf,
    hostAddr,
    nsAddr,
    cidr: `${base}.${last}/30`,
    wrap: ['ip', 'netns', 'exec', name],
    dsn(connectionString) {
      const url = new URL(connectionString);
      url.hostname = hostAddr;
      return url.href;
    },
    cut() {
      ip(['netns', 'exec', name, 'ip', 'link', 'set', nsIf, 'down']);
      cut = true;
    },
    heal() {
      ip(['netns', 'exec', name, 'ip', 'link', 'set', nsIf, 'up']);
      cut = false;
    },
    get isCut() {
      return cut;
    },
    destroy() {
      if (destroyed) return;
      destroyed = true;
      live.delete(ns);
      // Deleting one end deletes the pair; the namespace goes once its last process has.
      for (const args of [
        ['link', 'del', hostIf],
        ['netns', 'del', name],
      ]) {
        try {
          ip(args);
        } catch {
          // already gone
        }
      }
    },
  };

  if (!hooked) {
    hooked = true;
    process.on('exit', () => {
      for (const x of [...live]) x.destroy();
    });
    for (const signal of ['SIGINT', 'SIGTERM'] as const) {
      process.once(signal, () => {
        for (const x of [...live]) x.destroy();
        process.kill(process.pid, signal);
      });
    }
  }
  live.add(ns);
  try {
    ip(['netns', 'add', name]);
    ip(['link', 'add', hostIf, 'type', 'veth', 'peer', 'name', nsIf]);
    ip(['link', 'set', nsIf, 'netns', name]);
    ip(['addr', 'add', `${hostAddr}/30`, 'dev', hostIf]);
    ip(['link', 'set', hostIf, 'up']);
    ip(['netns', 'exec', name, 'ip', 'addr', 'add', `${nsAddr}/30`, 'dev', nsIf]);
    ip(['netns', 'exec', name, 'ip', 'link', 'set', nsIf, 'up']);
    ip(['netns', 'exec', name, 'ip', 'link', 'set', 'lo', 'up']);
  } catch (err) {
    ns.destroy();
    throw err;
  }
  return ns;
}

/**
 * Lets the namespace's processes into the harness's cluster: a pg_hba line for
 * its /30 (initdb -A trust covers loopback only), then a reload. The cluster
 * must already listen on ns.hostAddr (its listen_addresses, set at start).
 */
export async function allowInCluster(h: Harness, ns: Netns): Promise<void> {
  appendFileSync(join(h.cluster.dir, 'data', 'pg_hba.conf'), `host all all ${ns.cidr} trust\n`);
  await h.query('SELECT pg_reload_conf()');
}
