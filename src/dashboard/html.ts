/**
 * The dashboard's one escaping helper. Every page is built with the `html`
 * tagged template: each interpolated value is HTML-escaped unless it is
 * already `Html` (the output of another `html` template), so a queue name, a
 * task type, a payload, an error or a header can never become markup. The
 * same escape shows characters that draw nothing or reorder the text around
 * them (bidi overrides and isolates, zero-width and other format characters,
 * control characters but tab and newlines, line separators) as `\u{202E}`,
 * so a type like "invoice\u{202E}fdp.exe" cannot pass for "invoiceexe.pdf".
 * Attribute values in templates are always quoted, and the escape covers
 * both quote characters, so the same escape is right in text and attributes.
 * There is no way to mark a string as safe markup: only a template's own
 * literal text is ever emitted unescaped (and jsonForScript's output, which
 * is JSON with every character that could end its element escaped).
 */
import { escapeInvisible } from '../internal/printable.js';

/** Markup that is already safe: produced by `html` or written in this package. */
export class Html {
  constructor(readonly value: string) {}
  toString(): string {
    return this.value;
  }
}

const ESCAPES: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;', '`': '&#96;' };

/** Escapes text for HTML text and (quoted) attribute values, showing invisible and direction characters as \u{…}. */
export function escapeHtml(text: string): string {
  return escapeInvisible(text, { keepLineBreaks: true, form: 'braced' }).replace(/[&<>"'`]/g, (c) => ESCAPES[c] as string);
}

/** A value interpolated into a template: Html as is, arrays joined, nothing for null/undefined/false, text escaped. */
function part(value: unknown): string {
  if (value instanceof Html) return value.value;
  if (value === null || value === undefined || value === false) return '';
  if (Array.isArray(value)) return value.map(part).join('');
  return escapeHtml(String(value));
}

/** The tagged template every page is written with: interpolations are escaped. */
export function html(strings: TemplateStringsArray, ...values: unknown[]): Html {
  let out = strings[0] as string;
  for (let i = 0; i < values.length; i++) out += part(values[i]) + (strings[i + 1] as string);
  return new Html(out);
}

/**
 * JSON for a `<script type="application/json">` data block: `<`, `>`, `&`
 * and the line separators are \u-escaped, so no string in it can close the
 * element or open a comment.
 */
export function jsonForScript(value: unknown): Html {
  const text = JSON.stringify(value).replace(/[<>&\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  return new Html(text);
}
