/**
 * The one place the CLI masks passwords before anything reaches the terminal:
 * error messages, stack traces and the library's log lines.
 */
import { redact } from '../broker/db.js';

/** The password of a connection string, raw and URL-decoded, so it can be masked in any text. */
function secretsOf(url: string | undefined): string[] {
  if (url === undefined) return [];
  const raw = /^[a-z]+:\/\/[^:/@]*:([^@]*)@/i.exec(url)?.[1];
  const kv = /(?:^|\s)password\s*=\s*(?:'((?:[^'\\]|\\.)*)'|(\S+))/.exec(url);
  const found = [raw, kv?.[1], kv?.[2]].filter((s): s is string => s !== undefined && s !== '');
  const decoded = found.map((s) => {
    try {
      return decodeURIComponent(s);
    } catch {
      return s;
    }
  });
  return [...new Set([...found, ...decoded])].sort((a, b) => b.length - a.length);
}

/** Never lets a password reach the terminal: URLs are redacted, the password itself is masked. */
export function sanitize(text: string, databaseUrl: string | undefined): string {
  let out = text.replace(/postgres(?:ql)?:\/\/\S+/g, (url) => redact(url));
  for (const secret of secretsOf(databaseUrl)) out = out.split(secret).join('***');
  return out;
}
