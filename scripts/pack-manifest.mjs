// The package.json that `npm pack` and `npm publish` put in the tarball: without the
// contributor's scripts and devDependencies, so that an install sees no lifecycle scripts and
// nothing a user never runs. `prepack` strips the file (after the build), `postpack` puts the
// contributor's file back; a pack that died in between leaves the backup, which the next
// `strip` restores first rather than stripping a stripped file.
import { copyFileSync, existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs';

const MANIFEST = 'package.json';
const BACKUP = 'package.json.unpacked';

const step = process.argv[2];
if (step === 'strip') {
  if (existsSync(BACKUP)) renameSync(BACKUP, MANIFEST);
  copyFileSync(MANIFEST, BACKUP);
  const manifest = JSON.parse(readFileSync(MANIFEST, 'utf8'));
  delete manifest.scripts;
  delete manifest.devDependencies;
  writeFileSync(MANIFEST, JSON.stringify(manifest, null, 2) + '\n');
} else if (step === 'restore') {
  if (existsSync(BACKUP)) renameSync(BACKUP, MANIFEST);
} else {
  console.error('usage: node scripts/pack-manifest.mjs strip|restore');
  process.exit(2);
}
