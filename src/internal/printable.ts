/**
 * The one rule for showing text that came from the database (types, ids,
 * errors, headers, payloads) to a person, in a terminal or a page: characters
 * that draw nothing or change how the rest is shown are written as escapes.
 * A type like "invoice\u202Efdp.exe" cannot pass for "invoiceexe.pdf", and an
 * error holding "ESC]0;…BEL" cannot retitle the terminal window.
 */

/**
 * Control (Cc: C0, DEL, C1), format (Cf: U+200B–200F, U+202A–202E,
 * U+2066–2069, U+FEFF, tags…) and separator (Zl, Zp) characters, and lone
 * surrogates (Cs).
 */
const INVISIBLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Zl}\p{Zp}]/gu;
/** The same, but tab, CR and LF, which multi-line text (pretty-printed payloads, stacks) needs. */
const INVISIBLE_BUT_LINE_BREAKS = /(?![\t\n\r])[\p{Cc}\p{Cf}\p{Cs}\p{Zl}\p{Zp}]/gu;

const hex4 = (unit: number) => unit.toString(16).padStart(4, '0');

/** `\u001b`, as JSON and JavaScript write it; a code point above U+FFFF as its two surrogates. */
const jsonEscape = (c: string): string => {
  let out = '';
  for (let i = 0; i < c.length; i++) out += `\\u${hex4(c.charCodeAt(i))}`;
  return out;
};

/** `\u{202E}`: one escape per code point, as the dashboard has always shown them. */
const bracedEscape = (c: string): string => `\\u{${(c.codePointAt(0) as number).toString(16).toUpperCase().padStart(4, '0')}}`;

export interface EscapeOptions {
  /** Keep tab, CR and LF as they are. @defaultValue false */
  keepLineBreaks?: boolean;
  /** `'json'`: `\u001b` (valid in JSON text, so --json output stays JSON); `'braced'`: `\u{001B}`. @defaultValue 'json' */
  form?: 'json' | 'braced';
}

/** `text` with every invisible character (see INVISIBLE) written as an escape. */
export function escapeInvisible(text: string, opts: EscapeOptions = {}): string {
  return text.replace(opts.keepLineBreaks ? INVISIBLE_BUT_LINE_BREAKS : INVISIBLE, opts.form === 'braced' ? bracedEscape : jsonEscape);
}
