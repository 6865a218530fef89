/** Plain-text helpers for human-readable CLI output. */

/** Left-aligned columns separated by two spaces, with a header row and a rule under it. */
export function table(headers: string[], rows: string[][]): string[] {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => c.padEnd(widths[i] ?? 0))
      .join('  ')
      .trimEnd();
  return [line(headers), line(widths.map((w) => '-'.repeat(w))), ...rows.map(line)];
}

/** An instant for a table cell: ISO 8601 in UTC, or "-" when there is none. */
export function instant(d: Date | null | undefined): string {
  return d ? d.toISOString() : '-';
}
