/**
 * `pgasynq group ls --queue Q`: the queue's groups of aggregating tasks
 * (Inspector.groups). With --json, that array of { group, size }.
 */
import { jsonNote, withInspector } from './common.js';
import type { CliContext } from './context.js';
import { table } from './format.js';
import type { CliProgram } from './root.js';

export function registerGroup(program: CliProgram, ctx: CliContext): void {
  const group = program.command('group').description('groups of aggregating tasks');

  group
    .command('ls')
    .alias('list')
    .description("list a queue's groups and how many tasks wait in each")
    .requiredOption('-q, --queue <queue>', 'queue name')
    .addHelpText('after', jsonNote('Inspector.groups(queue): [{ group, size }, ...]'))
    .action(async (opts) => {
      const groups = await withInspector(ctx, (i) => i.groups(opts.queue));
      ctx.emit(groups, () =>
        groups.length === 0
          ? `no groups in queue "${opts.queue}"`
          : table(
              ['group', 'size'],
              groups.map((g) => [g.group, String(g.size)]),
              { right: [1] },
            ),
      );
    });
}
