/**
 * `pgasynq server ls`: the live servers (Inspector.servers), each with the
 * tasks it is running. With --json, that array of ServerInfo, each with its
 * activeWorkers.
 */
import type { ServerInfo } from '../model/inspector-types.js';
import { colours, jsonNote, withInspector } from './common.js';
import type { CliContext } from './context.js';
import { jsonText, relative, table, type Style } from './format.js';
import type { CliProgram } from './root.js';

function render(servers: ServerInfo[], s: Style): string[] {
  if (servers.length === 0) return ['no servers are running'];
  const now = Date.now();
  const lines = table(
    ['id', 'host', 'pid', 'status', 'active', 'queues', 'started'],
    servers.map((x) => [
      x.id,
      x.host,
      String(x.pid),
      x.status === 'active' ? s.green(x.status) : s.yellow(x.status),
      `${x.activeWorkers.length}/${x.concurrency}`,
      Object.entries(x.queues)
        .map(([q, w]) => `${q}:${w}`)
        .join(' ') + (x.strictPriority ? ' (strict)' : ''),
      relative(x.startedAt, now),
    ]),
    { right: [2, 4] },
  );
  const workers = servers.flatMap((x) => x.activeWorkers.map((w) => ({ server: x.id, ...w })));
  if (workers.length === 0) return [...lines, '', 'no task is running'];
  return [
    ...lines,
    '',
    s.bold('Active workers'),
    ...table(
      ['server', 'queue', 'task id', 'type', 'payload', 'started', 'lease expires', 'deadline'],
      workers.map((w) => [
        w.server,
        w.queue,
        w.taskId,
        w.type,
        jsonText(w.payload, 40),
        relative(w.startedAt, now),
        relative(w.leaseExpiresAt, now),
        relative(w.deadline, now),
      ]),
    ),
  ];
}

export function registerServer(program: CliProgram, ctx: CliContext): void {
  const server = program.command('server').description('the running worker servers');

  server
    .command('ls')
    .alias('list')
    .description('list the live servers and the tasks each is running')
    .addHelpText('after', jsonNote('Inspector.servers(): an array of ServerInfo, each with its activeWorkers'))
    .action(async () => {
      const servers = await withInspector(ctx, (i) => i.servers());
      ctx.emit(servers, () => render(servers, colours(ctx)));
    });
}
