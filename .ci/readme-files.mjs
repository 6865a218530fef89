// Writes the code blocks of the given Markdown files into a directory, so CI typechecks (and
// runs) the documentation's code itself:
// - a block whose info string names a file (```ts producer.ts) is written as that file: a
//   complete module, which the package check may also run;
// - any other TypeScript or JavaScript block is a fragment, written as fragment-PAGE-N.ts: a
//   module that imports what it uses and may take the variables .ci/package/fragments.d.ts
//   declares (client, server, ctx, db, …) as given;
// - a block marked `peer` (```ts peer) is code written for another package (BullMQ beside its
//   port, the OpenTelemetry SDK) that this check does not install: it is not written.
// Usage: node readme-files.mjs DIR FILE.md [FILE.md …]
import { readFileSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';

const [dir, ...files] = process.argv.slice(2);
const written = [];
for (const file of files) {
  const page = basename(file, '.md').toLowerCase();
  const here = [];
  let fragments = 0;
  for (const [, lang, meta, code] of readFileSync(file, 'utf8').matchAll(/^```(\w+)[ \t]*(.*)\n([\s\S]*?)^```$/gm)) {
    const named = /^[\w.-]+\.[cm]?[jt]s$/.exec(meta.trim());
    if (!named && !/^(ts|typescript|js|javascript)$/.test(lang)) continue;
    if (!named && meta.trim() === 'peer') continue;
    if (!named && meta.trim() !== '') throw new Error(`${file}: a ${lang} block with info "${meta}": name a file, mark it peer, or leave it plain`);
    // A fragment is made a module (`export {}`): its names then shadow the declared ones.
    const [name, text] = named ? [named[0], code] : [`fragment-${page}-${++fragments}.ts`, `${code}\nexport {};\n`];
    if (written.includes(name)) throw new Error(`${file}: a second block named ${name}`);
    writeFileSync(join(dir, name), text);
    written.push(name);
    here.push(name);
  }
  if (here.length > 0) console.log(`from ${basename(file)}: ${here.join(', ')}`);
}
if (written.length === 0) throw new Error(`no code blocks in ${files.join(', ')}`);
