// Writes every code block of the given Markdown files whose info string names a file
// (```ts producer.ts) into a directory, so CI runs the documentation's code itself.
// Usage: node readme-files.mjs DIR FILE.md [FILE.md …]
import { readFileSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';

const [dir, ...files] = process.argv.slice(2);
const written = [];
for (const file of files) {
  const blocks = [...readFileSync(file, 'utf8').matchAll(/^```\w+ ([\w.-]+\.[cm]?[jt]s)\n([\s\S]*?)^```$/gm)];
  for (const [, name, code] of blocks) {
    if (written.includes(name)) throw new Error(`${file}: a second block named ${name}`);
    writeFileSync(join(dir, name), code);
    written.push(name);
  }
  if (blocks.length > 0) console.log(`from ${basename(file)}: ${blocks.map((b) => b[1]).join(', ')}`);
}
if (written.length === 0) throw new Error(`no named code blocks in ${files.join(', ')}`);
