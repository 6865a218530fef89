// The site's generated reference, written before VitePress builds: the API from the package's
// TSDoc (TypeDoc, as Markdown for VitePress; a warning about an exported name fails the build),
// and every command of the CLI with its flags, from the CLI's own definitions (the built
// dist/cli/program.js: run `npm run build` in the repository first).
import { mkdirSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Application } from 'typedoc';

const docs = fileURLToPath(new URL('..', import.meta.url));
const root = fileURLToPath(new URL('../..', import.meta.url));

const app = await Application.bootstrapWithPlugins({
  entryPoints: [`${root}src/index.ts`, `${root}src/testing/index.ts`],
  tsconfig: `${root}tsconfig.build.json`,
  plugin: ['typedoc-plugin-markdown', 'typedoc-vitepress-theme'],
  out: `${docs}reference/api`,
  docsRoot: docs,
  readme: 'none',
  excludeInternal: true,
  excludePrivate: true,
  treatWarningsAsErrors: true,
  hideGenerator: true,
  // Sources link to the repository on GitHub, whatever remote this checkout has. Without git,
  // {path} is relative to the entry points' common folder, src/.
  disableGit: true,
  gitRevision: 'main',
  sourceLinkTemplate: 'https://github.com/pgasynq/pgasynq/blob/{gitRevision}/src/{path}#L{line}',
  entryFileName: 'index',
  sidebar: { pretty: true },
});
const project = await app.convert();
if (!project) throw new Error('TypeDoc could not convert the package');
app.validate(project);
if (app.logger.hasErrors() || app.logger.hasWarnings()) throw new Error('TypeDoc reported problems (above)');
await app.generateOutputs(project);

const { createProgram } = await import(`${root}dist/cli/program.js`);
const noWrite = { write: () => true };
const { program } = createProgram({ out: noWrite, err: noWrite, env: {} });
const sections = [];
const walk = (command, path) => {
  const name = [...path, command.name()].join(' ');
  sections.push(`## \`${name}\`\n\n\`\`\`text\n${command.helpInformation().trimEnd()}\n\`\`\`\n`);
  for (const sub of command.commands) walk(sub, [...path, command.name()]);
};
walk(program, []);
mkdirSync(`${docs}reference`, { recursive: true });
writeFileSync(
  `${docs}reference/cli.md`,
  `# The pgasynq command\n\nEvery command and its flags, as \`--help\` prints them (generated from the CLI's own definitions).\nHow to use them: [the CLI guide](/guide/cli).\n\n${sections.join('\n')}`,
);
console.log(`reference: the API of pgasynq and pgasynq/testing, and ${sections.length} CLI commands`);

// The error codes, configuration defaults and SQL objects, as tables (reference-tables.mjs).
const { writeReferenceTables } = await import('./reference-tables.mjs');
await writeReferenceTables(project);
