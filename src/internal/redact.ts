/**
 * Passwords out of anything shown: connection strings in messages and logs,
 * stored task errors, dashboard pages and CLI output.
 */

/** `password=` and `sslpassword=` (any `…password=`) as a parameter of a URL's query: masked up to the next parameter. */
const QUERY_PASSWORD = /([?&][a-z_]*password=)(?:[^\s&]|&(?![a-z_]+=))*/gi;
/** The same keys in a key=value string: a quoted value, or up to the next space. Not after ? or &: those are the rule above's. */
const KV_PASSWORD = /((?<![?&\w])[a-z_]*password\s*=\s*)(?:'(?:[^'\\]|\\.)*'?|[^\s']\S*)/gi;
/** A URL up to the colon before its password: `postgres://app:` (also a mistyped `postgres:/app:`); the user name may hold an `@`. */
const URL_HEAD = /\b(?:[a-z][a-z0-9+.-]{0,30}:\/\/|postgres(?:ql)?:\/?)[^\s:/?#]*:/i;

/**
 * Masks the password of a URL in one word of text: from the colon after the
 * user name to the word's last `@`, so a password holding `/ ? # @ :` is
 * masked whole. Found with indexOf, not a backtracking pattern: this runs on
 * every stored error, whose text a handler may have filled with anything.
 */
function maskUrlPassword(word: string): string {
  const head = URL_HEAD.exec(word);
  if (head === null) return word;
  const from = head.index + head[0].length;
  const at = word.lastIndexOf('@');
  return at < from ? word : `${word.slice(0, from)}***${word.slice(at)}`;
}

/**
 * Hides passwords in a connection string, or in any text holding one, before
 * it reaches a message or a log: `postgres://app:***@db/q`. It masks the
 * password of every `scheme://user:password@` (whatever characters it holds,
 * as long as it has no space: redactConnectionString() knows where a whole
 * string ends), every `password=` and `sslpassword=` parameter of a URL, and
 * every such pair of a key=value string (quoted or not). The query
 * parameters go first: one may hold an `@` that the URL rule would take for
 * the end of the password, leaving the rest of it in the clear.
 */
export function redact(text: string): string {
  return text
    .replace(QUERY_PASSWORD, '$1***')
    .replace(/\S+/g, (word) => (word.includes('@') ? maskUrlPassword(word) : word))
    .replace(KV_PASSWORD, '$1***');
}

/** A URL's `scheme://user:` and its password, up to the last `@` of the string. */
const DSN_USERINFO = /^([a-z][a-z0-9+.-]*:\/\/[^:]*:).*@/is;

/**
 * A whole connection string, fit to show. Unlike redact(), which must find a
 * URL's end in running text, it knows the string is one connection string, so
 * the password runs to its last `@` even through spaces.
 */
export function redactConnectionString(cs: string): string {
  return redact(cs.replace(DSN_USERINFO, '$1***@'));
}

/**
 * The secrets of a connection string as written, and URL-decoded: the URL's
 * password and every `…password=` value (URL query or key=value), longest
 * first, so that a caller can mask them in text that quotes them some other way.
 */
export function secretsOf(cs: string | undefined): string[] {
  if (cs === undefined) return [];
  const found: string[] = [];
  const userinfo = /^[a-z][a-z0-9+.-]*:\/\/[^:]*:(.*)@/is.exec(cs)?.[1];
  if (userinfo !== undefined) found.push(userinfo);
  for (const m of cs.matchAll(/[?&][a-z_]*password=((?:[^\s&]|&(?![a-z_]+=))*)/gi)) found.push(m[1] as string);
  for (const m of cs.matchAll(/(?<![?&\w])[a-z_]*password\s*=\s*(?:'((?:[^'\\]|\\.)*)'?|([^\s']\S*))/gi)) {
    found.push(m[1] === undefined ? (m[2] as string) : m[1].replace(/\\(.)/g, '$1'));
  }
  const decoded = found.map((s) => {
    try {
      return decodeURIComponent(s);
    } catch {
      return s;
    }
  });
  return [...new Set([...found, ...decoded])].filter((s) => s !== '' && s !== '***').sort((a, b) => b.length - a.length);
}
