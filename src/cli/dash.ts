/**
 * `pgasynq dash`: the web dashboard and /metrics on one port, until SIGINT or
 * SIGTERM. Binds 127.0.0.1 unless --host says otherwise; a non-loopback
 * host without --token is allowed but warned about. The token may also come
 * from PGASYNQ_DASH_TOKEN, which keeps it out of `ps`.
 *
 * It answers only to the Host names of --allowed-hosts besides localhost,
 * 127.0.0.1 and [::1] (by default the --host name, or this machine's name on
 * 0.0.0.0 / ::), so a web page cannot reach it by DNS rebinding; bound to
 * every address without --allowed-hosts, it says how to allow more names.
 * `--json`: prints one line `{ url, metricsUrl, readOnly, tokenRequired, hidePayloads, allowedHosts }` once listening.
 */
import { InvalidArgumentError, Option } from '@commander-js/extra-typings';
import { allowedHostsOption, isLoopback, isWildcard } from '../dashboard/security.js';
import { intInRange, jsonNote } from './common.js';
import { UsageError, type CliContext } from './context.js';
import type { CliProgram } from './root.js';

export function registerDash(program: CliProgram, ctx: CliContext): void {
  program
    .command('dash')
    .description('the web dashboard and /metrics (Prometheus), until Ctrl-C')
    .addOption(new Option('--port <port>', 'port to listen on (0: any free port)').argParser(intInRange(0, 65535)).default(8080))
    .option('--host <address>', 'address to bind; anything but loopback exposes the dashboard', '127.0.0.1')
    .addOption(
      new Option(
        '--allowed-hosts <names>',
        "Host names it answers to besides localhost, 127.0.0.1, [::1], comma-separated (default: the --host name, or this machine's name on 0.0.0.0 / ::); * for any (unsafe: DNS rebinding)",
      ).argParser(parseAllowedHosts),
    )
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
      const { runUntilTerminated } = await import('../internal/signals.js');
      const dash = createDashboard({
        ...conn,
        readOnly: opts.readOnly === true,
        hidePayloads: opts.hidePayloads === true,
        refreshInterval: opts.refresh * 1000,
        ...(token === undefined ? {} : { token }),
        ...(opts.allowedHosts === undefined ? {} : { allowedHosts: opts.allowedHosts }),
      });
      // runUntilTerminated listens for the signals first, so a Ctrl-C during start-up still closes everything.
      try {
        await runUntilTerminated(
          async () => {
            // Fail fast (exit 1) when the database cannot be reached or the schema is not migrated.
            await dash.inspector.queues();
            const { url, allowedHosts } = await dash.listen(opts.port, opts.host);
            const metricsUrl = `${url}metrics`;
            ctx.emit(
              { url, metricsUrl, readOnly: opts.readOnly === true, tokenRequired: token !== undefined, hidePayloads: opts.hidePayloads === true, allowedHosts },
              () => [
                `pgasynq dashboard: ${url}`,
                `metrics:           ${metricsUrl}`,
                ...(opts.readOnly ? ['read-only:         actions are hidden and refused'] : []),
                ...(token !== undefined ? ['token:             required (open /?token=... once, or send Authorization: Bearer ...)'] : []),
                ...(opts.hidePayloads ? ['payloads:          hidden'] : []),
                `answers to Host:   ${allowedHosts === '*' ? 'any' : allowedHosts.join(', ')}`,
                'Ctrl-C to stop.',
              ],
            );
            if (!isLoopback(opts.host) && token === undefined) {
              ctx.io.err.write(
                `warning: listening on ${opts.host} without --token: anyone who can reach this port can read your queues${opts.readOnly ? '' : ' and act on them'}\n`,
              );
            }
            if (allowedHosts === '*' && token === undefined) {
              ctx.io.err.write(
                'warning: --allowed-hosts * answers to any Host name: a web page you open can read (and act on) this dashboard through DNS rebinding; list the names instead, or set --token\n',
              );
            } else if (allowedHosts !== '*' && opts.allowedHosts === undefined && isWildcard(opts.host)) {
              ctx.io.err.write(
                `note: listening on every address, but answering only to Host ${allowedHosts.join(', ')} (a defence against DNS rebinding); to open it under another name or address, add --allowed-hosts NAME[,NAME...]\n`,
              );
            }
          },
          async () => {},
        );
      } finally {
        await dash.close();
      }
    });
}

/** --allowed-hosts: "*", or host names separated by commas, checked as the library checks allowedHosts. */
function parseAllowedHosts(value: string): string[] | '*' {
  if (value.trim() === '*') return '*';
  const names = value
    .split(',')
    .map((h) => h.trim())
    .filter((h) => h !== '');
  try {
    return [...(allowedHostsOption(names, '--allowed-hosts') as readonly string[])];
  } catch (err) {
    throw new InvalidArgumentError(err instanceof Error ? `${err.message}.` : String(err));
  }
}
