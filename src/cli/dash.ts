/**
 * `pgasynq dash`: the web dashboard and /metrics on one port, until SIGINT or
 * SIGTERM. Binds 127.0.0.1 unless --host says otherwise; a non-loopback
 * host without --token is allowed but warned about. The token may also come
 * from PGASYNQ_DASH_TOKEN, which keeps it out of `ps`.
 * `--json`: prints one line `{ url, metricsUrl, readOnly, tokenRequired, hidePayloads }` once listening.
 */
import { Option } from '@commander-js/extra-typings';
import { intInRange, jsonNote } from './common.js';
import { UsageError, type CliContext } from './context.js';
import type { CliProgram } from './program.js';

export function registerDash(program: CliProgram, ctx: CliContext): void {
  program
    .command('dash')
    .description('the web dashboard and /metrics (Prometheus), until Ctrl-C')
    .addOption(new Option('--port <port>', 'port to listen on (0: any free port)').argParser(intInRange(0, 65535)).default(8080))
    .option('--host <address>', 'address to bind; anything but loopback exposes the dashboard', '127.0.0.1')
    .option('--read-only', 'hide and refuse every action (pause, run, archive, delete, cancel)')
    .option('--token <token>', 'require this token on every request (default: $PGASYNQ_DASH_TOKEN)')
    .option('--hide-payloads', 'never send task payloads or results to the browser')
    .addOption(new Option('--refresh <seconds>', 'default auto-refresh interval (0: off)').argParser(intInRange(0, 3600)).default(5))
    .addHelpText(
      'after',
      `\nWith --token, open http://HOST:PORT/?token=TOKEN once (a cookie keeps you in) or send\n"Authorization: Bearer TOKEN" (Prometheus: authorization.credentials).\n${jsonNote('one line with the URL and the settings once it listens')}`,
    )
    .action(async (opts) => {
      // At info: the dashboard's actions (pause, delete, …) are on record in the terminal.
      const conn = ctx.connection('info');
      const envToken = ctx.io.env.PGASYNQ_DASH_TOKEN;
      const token = opts.token ?? (envToken === undefined || envToken === '' ? undefined : envToken);
      if (token !== undefined && !/^[\x21-\x7e]{1,512}$/.test(token)) throw new UsageError('--token must be 1–512 visible ASCII characters without spaces');
      const { createDashboard } = await import('../dashboard/server.js');
      const { isLoopback } = await import('../dashboard/security.js');
      const { untilTerminated } = await import('../signals.js');
      const dash = createDashboard({
        ...conn,
        readOnly: opts.readOnly === true,
        hidePayloads: opts.hidePayloads === true,
        refreshInterval: opts.refresh * 1000,
        ...(token === undefined ? {} : { token }),
      });
      // Listen for the signals first, so a Ctrl-C during start-up still closes everything.
      const terminated = untilTerminated();
      try {
        // Fail fast (exit 1) when the database cannot be reached or the schema is not migrated.
        await dash.inspector.queues();
        const { url } = await dash.listen(opts.port, opts.host);
        const metricsUrl = `${url}metrics`;
        ctx.emit({ url, metricsUrl, readOnly: opts.readOnly === true, tokenRequired: token !== undefined, hidePayloads: opts.hidePayloads === true }, () => [
          `pgasynq dashboard: ${url}`,
          `metrics:           ${metricsUrl}`,
          ...(opts.readOnly ? ['read-only:         actions are hidden and refused'] : []),
          ...(token !== undefined ? ['token:             required (open /?token=... once, or send Authorization: Bearer ...)'] : []),
          ...(opts.hidePayloads ? ['payloads:          hidden'] : []),
          'Ctrl-C to stop.',
        ]);
        if (!isLoopback(opts.host) && token === undefined) {
          ctx.io.err.write(
            `warning: listening on ${opts.host} without --token: anyone who can reach this port can read your queues${opts.readOnly ? '' : ' and act on them'}\n`,
          );
        }
        await terminated;
      } finally {
        await dash.close();
      }
    });
}
