// Writes every code block of a Markdown file whose info string names a file
// (```ts producer.ts) into a directory, so CI runs the README's code itself.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const [readme, dir] = process.argv.slice(2);
const blocks = [...readFileSync(readme, 'utf8').matchAll(/^```\w+ ([\w.-]+\.[cm]?[jt]s)\n([\s\S]*?)^```$/gm)];
if (blocks.length === 0) throw new Error(`no named code blocks in ${readme}`);
for (const [, name, code] of blocks) writeFileSync(join(dir, name), code);
console.log(`from ${readme}: ${blocks.map((b) => b[1]).join(', ')}`);
