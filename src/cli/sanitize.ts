/**
 * The one place the CLI masks passwords before anything reaches the terminal:
 * error messages, stack traces and the library's log lines.
 */
import { redact, secretsOf } from '../internal/redact.js';

/**
 * Never lets a password reach the terminal: connection strings in the text
 * are redacted, and the passwords of the one in use (and PGPASSWORD) are
 * masked wherever they appear, however the text quotes them.
 */
export function sanitize(text: string, databaseUrl: string | undefined, env: Record<string, string | undefined> = {}): string {
  let out = redact(text);
  const secrets = [...secretsOf(databaseUrl), ...(env.PGPASSWORD ? [env.PGPASSWORD] : [])].sort((a, b) => b.length - a.length);
  for (const secret of secrets) out = out.split(secret).join('***');
  return out;
}
