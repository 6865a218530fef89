// Three generated pages of the site's reference, from the sources of truth, so they cannot drift
// from the code (reference.mjs calls this with its TypeDoc project, after writing the API pages):
//
// - reference/errors.md: every error class the package exports, its `code` read from an instance
//   of the built class, its summary from the TSDoc, its family and the `is…` helpers that match it.
// - reference/configuration.md: every options interface of the public API, each option's type,
//   default (its `@defaultValue`) and meaning from the TSDoc; where the code resolves a default
//   to a value (a constant, ServerConfig's rules), the TSDoc's must say the same. And the
//   environment variables the CLI reads, found in src/ by the TypeScript compiler.
// - reference/sql.md: the views, their columns and the functions of a schema migrated with the
//   built package's migrate() in DATABASE_URL's database (a throwaway schema, dropped after),
//   with what each role of roleSetupSql() may read and execute (its script, run in a
//   transaction that is rolled back).
//
// It needs the built package (dist/: `npm run build` at the root) and a PostgreSQL server. Run
// alone (`node docs/scripts/reference-tables.mjs`, after reference.mjs has written the API pages
// it links to) it converts the TypeDoc project itself.
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';
import pg from 'pg';
import { Application, ReflectionKind } from 'typedoc';
import ts from 'typescript';

const docs = fileURLToPath(new URL('..', import.meta.url));
const root = fileURLToPath(new URL('../..', import.meta.url));
const dist = (path) => import(pathToFileURL(`${root}dist/${path}`).href);

/** The entry points TypeDoc documents, by its module names, and the built module of each. */
const MODULES = [
  { name: 'index', label: 'pgasynq', built: 'index.js' },
  { name: 'testing', label: 'pgasynq/testing', built: 'testing/index.js' },
];

const fail = (message) => {
  throw new Error(`reference-tables: ${message}`);
};

// ---------------------------------------------------------------------------------------------
// Markdown

/**
 * Prose for one line of Markdown: outside code spans `<` and `{` escaped (VitePress compiles
 * each page as a Vue template: a raw `<x>` would be a tag, `{{` a binding).
 */
function cell(text) {
  return text
    .replace(/\s+/g, ' ')
    .trim()
    .split(/(`[^`]*`)/)
    .map((part, i) => (i % 2 === 1 ? part : part.replaceAll('<', '&lt;').replaceAll('{', '&#123;')))
    .join('');
}

/** A code span holding `text` (backticks inside get a longer fence). */
const code = (text) => (text.includes('`') ? `\`\` ${text} \`\`` : `\`${text}\``);

/** A Markdown table; a `|` in a cell, in a code span too, is escaped (markdown-it unescapes it). */
function table(head, rows) {
  const line = (cells) => `| ${cells.map((c) => c.replaceAll('|', '\\|')).join(' | ')} |`;
  return [line(head), `|${head.map(() => '---').join('|')}|`, ...rows.map(line)].join('\n');
}

/**
 * A reflection's own TSDoc summary: TypeDoc gives a class or an interface without one the
 * summary of what it extends, which would describe the parent, not it.
 */
function ownSummary(reflection) {
  const text = partsText(reflection.comment?.summary);
  const inherited = (reflection.extendedTypes ?? []).some((t) => t.reflection && partsText(t.reflection.comment?.summary) === text);
  return inherited ? '' : text;
}

/** TSDoc display parts as Markdown: code as written, `{@link X}` as X in a code span. */
function partsText(parts) {
  return (parts ?? [])
    .map((p) => {
      if (p.kind === 'inline-tag') return code(p.text);
      if (p.kind === 'code') return p.text.replace(/^```\w*\n([\s\S]*?)\n?```$/, '$1');
      return p.text;
    })
    .join('')
    .replace(/\s+/g, ' ')
    .trim();
}

/** The site path of a reflection's API page, which TypeDoc has written (checked). */
function apiLink(moduleName, reflection) {
  const dir = { [ReflectionKind.Class]: 'classes', [ReflectionKind.Interface]: 'interfaces', [ReflectionKind.TypeAlias]: 'type-aliases' }[reflection.kind];
  const page = `reference/api/${moduleName}/${dir}/${reflection.name}`;
  if (dir === undefined || !existsSync(`${docs}${page}.md`)) fail(`no API page ${page}.md for ${reflection.name}: did TypeDoc's layout change?`);
  return `/${page}`;
}

function write(name, text) {
  mkdirSync(`${docs}reference`, { recursive: true });
  if (text.includes('{{')) fail(`${name} would hold "{{", which VitePress reads as a Vue binding`);
  writeFileSync(`${docs}reference/${name}`, text.endsWith('\n') ? text : `${text}\n`);
}

// ---------------------------------------------------------------------------------------------
// Error codes

async function errorsPage(project) {
  const main = await dist('index.js');
  const { PgasynqError, ValidationError } = main;
  const helpers = Object.entries(main).filter(([name, f]) => /^is[A-Z]/.test(name) && typeof f === 'function');
  const rows = [];
  const seen = new Set();
  for (const m of MODULES) {
    const built = await dist(m.built);
    const mod = project.getChildByName(m.name);
    for (const [name, cls] of Object.entries(built)) {
      if (typeof cls !== 'function' || !(cls.prototype instanceof PgasynqError) || seen.has(cls)) continue;
      seen.add(cls);
      const reflection = mod?.getChildByName(name);
      if (reflection?.kind !== ReflectionKind.Class) fail(`${name} is exported by ${m.label} but TypeDoc has no class of that name`);
      // The code is an instance field: read it from an instance built with placeholder arguments
      // (no constructor of these checks its arguments), else from the field's TypeDoc initializer.
      let instance;
      try {
        instance = new cls('x', 'x', 'x', 'x');
      } catch {
        instance = undefined;
      }
      const declared = reflection.getChildByName('code')?.defaultValue?.replace(/^'(.*)'$/, '$1');
      const errCode = instance?.code ?? declared;
      if (typeof errCode !== 'string' || errCode === '') fail(`cannot read the code of ${name}`);
      const family = cls === ValidationError || cls.prototype instanceof ValidationError;
      const matching = helpers.filter(([, is]) => is(instance ?? { code: errCode })).map(([helper]) => code(`${helper}()`));
      const source = reflection.sources?.[0];
      rows.push({
        // The ValidationError family first, its base at the top; then in source order.
        order: `${m.name === 'index' ? 0 : 1}:${family ? 0 : 1}:${cls === ValidationError ? 0 : 1}:${source?.fileName ?? ''}:${String(source?.line ?? 0).padStart(6, '0')}`,
        name,
        cells: [
          `[${name}](${apiLink(m.name, reflection)})`,
          code(errCode),
          cell(ownSummary(reflection)) || '—',
          family ? 'yes' : '—',
          matching.join(', ') || '—',
        ],
        module: m.label,
      });
    }
  }
  if (rows.length === 0) fail('found no error class in the built package');
  rows.sort((a, b) => a.order.localeCompare(b.order));
  const testing = rows.filter((r) => r.module !== 'pgasynq');
  const missing = rows.filter((r) => r.cells[2] === '—').map((r) => r.name);
  if (missing.length > 0) console.warn(`reference-tables: errors without a TSDoc summary (shown as —): ${missing.join(', ')}`);
  const base = project.getChildByName('index').getChildByName('PgasynqError');
  write(
    'errors.md',
    `# Error codes

Every error class pgasynq exports, generated from the package itself. Each extends
[PgasynqError](${apiLink('index', base)}) and carries a stable \`code\`: test \`err.code\`, or use
the \`is…\` helpers, where \`instanceof\` cannot be relied on (two copies of the package in one
process). The ValidationError family (bad arguments and options, refused before anything is sent
to the database) shares the code \`ERR_VALIDATION\`; the class says which input was refused, and
\`field\` and \`rule\` say how.
${testing.length > 0 ? `\n${testing.map((r) => r.name).join(', ')} ${testing.length === 1 ? 'comes' : 'come'} from \`pgasynq/testing\`.\n` : ''}
${table(
  ['Class', '`code`', 'Meaning', 'ValidationError', 'Matched by'],
  rows.map((r) => r.cells),
)}
`,
  );
  return rows.length;
}

// ---------------------------------------------------------------------------------------------
// Configuration defaults

/** The options interfaces, in the order the page shows them; any other `…Options` or `…Config` follows. */
const OPTIONS_ORDER = [
  'ConnectionOptions',
  'ClientOptions',
  'EnqueueOptions',
  'EnqueueCallOptions',
  'WaitOptions',
  'EnqueueAndWaitOptions',
  'ServerConfig',
  'SchedulerOptions',
  'PeriodicTaskManagerOptions',
  'PeriodicTaskConfig',
  'InspectorOptions',
  'ListOptions',
  'DashboardOptions',
  'MetricsHandlerOptions',
  'RoleSetupOptions',
];

/**
 * Defaults as the code resolves them, by interface and option: ServerConfig's rules applied to
 * an empty config, the Scheduler's, an empty enqueue's record, and the constants the code
 * defaults to. A `@defaultValue` that starts with a value (`5 s`, `'UTC'`, `25`, `false`)
 * must equal the code's.
 */
async function codeDefaults() {
  const { resolveServerConfig } = await dist('server/config.js');
  const { resolveSchedulerOptions } = await dist('scheduler.js');
  const { SYNC_INTERVAL_DEFAULT_MS } = await dist('periodic-task-manager.js');
  const { Task, MAX_PAYLOAD_BYTES } = await dist('index.js');
  const { toRecord } = await dist('model/task.js');
  const { DEFAULT_SCHEMA } = await dist('model/validate.js');
  const { LOG_LEVEL_DEFAULT } = await dist('internal/logger.js');
  const { DEFAULT_ROLE_PREFIX } = await dist('model/roles.js');
  const { DASHBOARD_REFRESH_DEFAULT_MS } = await dist('dashboard/server.js');
  const record = toRecord(new Task('reference:defaults', null), {});
  const scheduler = resolveSchedulerOptions({ logger: false });
  return {
    ConnectionOptions: { schema: DEFAULT_SCHEMA, logLevel: LOG_LEVEL_DEFAULT },
    ClientOptions: { maxPayloadBytes: MAX_PAYLOAD_BYTES },
    InspectorOptions: { maxPayloadBytes: MAX_PAYLOAD_BYTES },
    ServerConfig: resolveServerConfig({ logger: false }),
    SchedulerOptions: { location: scheduler.location, heartbeatInterval: scheduler.heartbeatInterval },
    PeriodicTaskManagerOptions: { syncInterval: SYNC_INTERVAL_DEFAULT_MS },
    EnqueueOptions: {
      queue: record.queue,
      maxRetry: record.maxRetry,
      timeout: record.timeoutMs,
      retention: record.retentionMs,
      onDependencyFailure: record.onDependencyFailure,
      replace: record.replace,
      priority: record.priority,
    },
    DashboardOptions: { refreshInterval: DASHBOARD_REFRESH_DEFAULT_MS },
    RoleSetupOptions: { schema: DEFAULT_SCHEMA, prefix: DEFAULT_ROLE_PREFIX },
  };
}

const UNITS = { ms: 1, s: 1000, min: 60_000, h: 3_600_000 };

/** The value a default's text starts with, or undefined when it starts with words. */
function leadingValue(text) {
  let m = /^'([^']*)'/.exec(text);
  if (m) return m[1];
  m = /^(true|false)\b/.exec(text);
  if (m) return m[1] === 'true';
  m = /^(-?\d[\d,]*(?:\.\d+)?)(?:\s*(ms|s|min|h)\b)?/.exec(text);
  if (m) return Number(m[1].replaceAll(',', '')) * (m[2] ? UNITS[m[2]] : 1);
  m = /^\{[^}]*\}/.exec(text);
  if (m) {
    try {
      return JSON.parse(m[0].replace(/([A-Za-z_]\w*)\s*:/g, '"$1":').replaceAll("'", '"'));
    } catch {
      return undefined;
    }
  }
  return undefined;
}

const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

/** A default's text as a cell: a value in a code span, words as they are. */
function defaultCell(text) {
  if (/^('[^']*'|true|false|-?\d[\d,.]*|\{.*\}|[\w.]+\(\))$/.test(text)) return code(text);
  return cell(text);
}

/** The options an interface or an intersection type alias declares itself, and the ones it takes from others. */
function optionsOf(reflection) {
  if (reflection.kind === ReflectionKind.Interface) {
    return {
      own: (reflection.children ?? []).filter((c) => c.kind === ReflectionKind.Property && !c.inheritedFrom),
      parents: (reflection.extendedTypes ?? []).map((t) => t.name),
    };
  }
  const types = reflection.type?.type === 'intersection' ? reflection.type.types : [reflection.type];
  return {
    own: types.flatMap((t) => (t?.type === 'reflection' ? (t.declaration.children ?? []) : [])),
    parents: types.filter((t) => t?.type === 'reference').map((t) => t.name),
  };
}

const bySource = (a, b) =>
  (a.sources?.[0]?.fileName ?? '').localeCompare(b.sources?.[0]?.fileName ?? '') || (a.sources?.[0]?.line ?? 0) - (b.sources?.[0]?.line ?? 0);

/**
 * Every environment variable src/ reads (the CLI runs all of it but pgasynq/testing): each
 * `<something>.env.NAME` or `env.NAME`, found by the TypeScript parser (so not in comments).
 */
function environmentReads() {
  const found = new Set();
  const walk = (dir) => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const path = `${dir}/${entry.name}`;
      if (entry.isDirectory()) {
        if (entry.name !== 'testing') walk(path);
      } else if (entry.name.endsWith('.ts')) {
        const source = ts.createSourceFile(path, readFileSync(path, 'utf8'), ts.ScriptTarget.Latest, true);
        const visit = (node) => {
          let name;
          let target;
          if (ts.isPropertyAccessExpression(node)) [name, target] = [node.name.text, node.expression];
          else if (ts.isElementAccessExpression(node) && ts.isStringLiteral(node.argumentExpression))
            [name, target] = [node.argumentExpression.text, node.expression];
          const last = target && (ts.isIdentifier(target) ? target.text : ts.isPropertyAccessExpression(target) ? target.name.text : undefined);
          if (last === 'env' && /^[A-Z][A-Z0-9_]*$/.test(name)) found.add(name);
          ts.forEachChild(node, visit);
        };
        visit(source);
      }
    }
  };
  walk(`${root}src`);
  return found;
}

/**
 * What each environment variable does. The list must match what src/ reads: a variable read
 * but not described here, or described but no longer read, fails the build.
 */
const ENVIRONMENT = {
  DATABASE_URL:
    'The connection string when `--database-url` is not given: a command that needs a database and has neither stops with a usage error, and `pgasynq demo` runs on the embedded database. The library falls back to it too, when given no `connectionString`, `pool` or `embedded`.',
  PGASYNQ_DASH_TOKEN: '`pgasynq dash`: the token every request must carry, when `--token` is not given. Empty: no token.',
  PGASYNQ_EMBEDDED: '`pgasynq demo`: `1` runs the demo on the embedded database even when a database URL is set.',
  NO_COLOR: 'Set and not empty: no colours in the human-readable output (which has them only on a terminal).',
  TERM: '`dumb`: no colours in the human-readable output.',
  PGPASSWORD:
    'The password when the connection string has none (read by the pg driver); its value is masked as `***` wherever it appears in the CLI’s error messages and log lines.',
  PGOPTIONS:
    'Server settings sent at connect (`-c name=value …`), read by the pg driver. Where pgasynq sets `synchronous_commit` for a pool it creates (a Server’s, a Client’s), it sends these first and its own after them.',
  PGHOST: 'The host when the connection string names none (read by the pg driver); also how log lines name the server.',
  PGPORT: 'The port when the connection string names none (read by the pg driver); also how log lines name the server.',
  PGDATABASE: 'The database when the connection string names none (read by the pg driver); also how log lines name the server.',
};

async function configurationPage(project) {
  const expected = await codeDefaults();
  const missing = [];
  const sections = [];
  const found = [];
  // The main entry point's: pgasynq/testing's options are documented on their API pages.
  for (const reflection of project.getChildByName('index')?.children ?? []) {
    if ([ReflectionKind.Interface, ReflectionKind.TypeAlias].includes(reflection.kind) && /(Options|Config)$/.test(reflection.name)) found.push(reflection);
  }
  const rank = (name) => (OPTIONS_ORDER.includes(name) ? OPTIONS_ORDER.indexOf(name) : OPTIONS_ORDER.length);
  found.sort((a, b) => rank(a.name) - rank(b.name) || a.name.localeCompare(b.name));
  const names = new Set(found.map((f) => f.name));
  let rowCount = 0;
  for (const reflection of found) {
    const { own, parents } = optionsOf(reflection);
    const accepted = own.filter((p) => p.type?.type !== 'intrinsic' || p.type.name !== 'never').sort(bySource);
    const refused = own.filter((p) => p.type?.type === 'intrinsic' && p.type.name === 'never');
    const checks = expected[reflection.name] ?? {};
    const rows = accepted.map((p) => {
      const tag = p.comment?.blockTags?.find((t) => t.tag === '@defaultValue');
      let def;
      if (!p.flags.isOptional) def = 'required';
      else if (tag === undefined) missing.push(`${reflection.name}.${p.name}`);
      else {
        const text = partsText(tag.content);
        const value = leadingValue(text);
        if (p.name in checks && value !== undefined && !same(value, checks[p.name])) {
          fail(`${reflection.name}.${p.name}: the TSDoc's @defaultValue says ${text}, the code applies ${JSON.stringify(checks[p.name])}`);
        }
        def = defaultCell(text);
      }
      return [code(p.name), code(p.type?.toString() ?? 'unknown'), def ?? '', cell(partsText(p.comment?.summary)) || '—'];
    });
    for (const name of Object.keys(checks)) {
      if (reflection.name !== 'ServerConfig' && !own.some((p) => p.name === name)) fail(`${reflection.name} has no option ${name}, which this script checks`);
    }
    rowCount += rows.length;
    const also = parents.map((p) => (names.has(p) ? `[${p}](#${p.toLowerCase()})` : code(p)));
    const summary = ownSummary(reflection);
    sections.push(
      [
        `## ${reflection.name}`,
        [
          `${summary ? `${cell(summary)} ` : ''}[API](${apiLink('index', reflection)})`,
          also.length > 0 ? `Also takes every option of ${also.join(' and ')}.` : '',
          refused.length > 0 ? `Does not take ${refused.map((p) => code(p.name)).join(', ')}.` : '',
        ]
          .filter(Boolean)
          .join(' '),
        rows.length > 0 ? table(['Option', 'Type', 'Default', 'Meaning'], rows) : '',
      ]
        .filter(Boolean)
        .join('\n\n'),
    );
  }
  if (missing.length > 0) {
    fail(`these options have no @defaultValue in their TSDoc (add one: the value the code applies, or what happens without it):\n  ${missing.join('\n  ')}`);
  }
  const read = environmentReads();
  const undocumented = [...read].filter((n) => !(n in ENVIRONMENT));
  const gone = Object.keys(ENVIRONMENT).filter((n) => !read.has(n));
  if (undocumented.length > 0 || gone.length > 0) {
    fail(
      `the environment variables of reference-tables.mjs's ENVIRONMENT no longer match src/: ${[...undocumented.map((n) => `${n} is read but not described`), ...gone.map((n) => `${n} is described but no longer read`)].join('; ')}`,
    );
  }
  const env = table(
    ['Variable', 'Meaning'],
    Object.entries(ENVIRONMENT).map(([name, text]) => [code(name), cell(text)]),
  );
  write(
    'configuration.md',
    `# Configuration defaults

Every options object of the public API: each option, its type, its default and what it does,
generated from the TSDoc (each heading links to the API page with the same text). Durations are
milliseconds. Where the code applies a default that is a value (a constant, the Server's rules),
the generator checks that the TSDoc says the same. How the Server's options work together:
[Server options](/guide/options).

${sections.join('\n\n')}

## Environment variables

What the \`pgasynq\` command reads from its environment, the library's reads included (the list
is checked against the reads in the source). The command's flags: [the pgasynq command](/reference/cli).

${env}
`,
  );
  return { interfaces: found.length, options: rowCount, environment: Object.keys(ENVIRONMENT).length };
}

// ---------------------------------------------------------------------------------------------
// SQL views and functions

const DEFAULT_DATABASE_URL = 'postgres://postgres@127.0.0.1:5432/test';

async function sqlPage() {
  const { migrate, roleSetupSql, roleNames, ROLE_KINDS } = await dist('index.js');
  const connectionString = process.env.DATABASE_URL || DEFAULT_DATABASE_URL;
  const shown = connectionString.replace(/\/\/([^:@/]*):[^@/]*@/, '//$1:***@');
  const suffix = randomBytes(4).toString('hex');
  const schema = `pgasynq_reference_${suffix}`;
  const prefix = `pgasynq_reference_${suffix}`;
  const pool = new pg.Pool({ connectionString, max: 1 });
  try {
    await pool.query('SELECT 1');
  } catch (err) {
    await pool.end();
    fail(
      `cannot reach PostgreSQL at ${shown} (${err.message}): the SQL reference is read from a schema migrated there. Start PostgreSQL, or set DATABASE_URL to a database where a throwaway schema may be created.`,
    );
  }
  try {
    const { applied } = await migrate({ pool, schema, logger: false });
    // What the migrations alone leave callable by everyone (PUBLIC's default EXECUTE, not revoked).
    const open = (
      await pool.query(
        `SELECT p.proname AS name FROM pg_proc p
         WHERE p.pronamespace = $1::regnamespace AND p.prorettype <> 'trigger'::regtype
           AND (p.proacl IS NULL OR EXISTS (SELECT FROM aclexplode(p.proacl) a WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'))
         ORDER BY 1`,
        [schema],
      )
    ).rows.map((f) => code(`${f.name}()`));
    const client = await pool.connect();
    try {
      // The roles script, as `pgasynq roles` prints it, in a transaction of ours that is rolled
      // back: the roles and grants exist only while the privileges are read.
      const script = roleSetupSql({ schema, prefix });
      if (script.match(/^BEGIN;$/gm)?.length !== 1 || script.match(/^COMMIT;$/gm)?.length !== 1) {
        fail('the roles script no longer holds exactly one BEGIN; and one COMMIT; line: update how sqlPage() runs it');
      }
      await client.query('BEGIN');
      await client.query(script.replace(/^(BEGIN|COMMIT);$/gm, ''));
      const test = roleNames(prefix);
      const shownRole = roleNames('pgasynq');
      const tenants = ROLE_KINDS.filter((k) => k !== 'owner');
      const roleArray = tenants.map((k) => test[k]);
      const kindOf = (name) => tenants.find((k) => test[k] === name);
      const views = (
        await client.query(
          `SELECT c.oid, c.relname AS name, obj_description(c.oid, 'pg_class') AS comment,
                  ARRAY(SELECT r FROM unnest($2::text[]) r WHERE has_any_column_privilege(r, c.oid, 'SELECT')) AS readers
           FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('v', 'm') ORDER BY c.relname <> 'tasks', c.relname`,
          [schema, roleArray],
        )
      ).rows;
      const columns = (
        await client.query(
          `SELECT a.attrelid AS view, a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type, col_description(a.attrelid, a.attnum) AS comment,
                  ARRAY(SELECT r FROM unnest($2::text[]) r WHERE NOT has_column_privilege(r, a.attrelid, a.attnum, 'SELECT')) AS hidden
           FROM pg_attribute a WHERE a.attrelid = ANY ($1::oid[]) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attrelid, a.attnum`,
          [views.map((v) => v.oid), roleArray],
        )
      ).rows;
      const functions = (
        await client.query(
          `SELECT p.proname AS name, pg_get_function_arguments(p.oid) AS args, pg_get_function_result(p.oid) AS result, p.prosecdef AS definer,
                  p.prorettype = 'trigger'::regtype AS trigger, obj_description(p.oid, 'pg_proc') AS comment,
                  ARRAY(SELECT r FROM unnest($2::text[]) r WHERE has_function_privilege(r, p.oid, 'EXECUTE')) AS executors
           FROM pg_proc p WHERE p.pronamespace = $1::regnamespace ORDER BY p.proname, 2`,
          [schema, roleArray],
        )
      ).rows;
      await client.query('ROLLBACK');
      const unschema = (text) => (text ?? '').replaceAll(`"${schema}"`, 'pgasynq').replaceAll(schema, 'pgasynq');
      const roles = (names) => names.map((n) => code(shownRole[kindOf(n)])).join(', ');
      const callable = functions.filter((f) => !f.trigger && f.executors.length > 0);
      const workerOnly = callable.filter((f) => f.executors.length === 1 && f.executors[0] === test.worker);
      const shared = callable.filter((f) => !workerOnly.includes(f));
      const internal = functions.filter((f) => !f.trigger && f.executors.length === 0);
      const triggers = functions.filter((f) => f.trigger);
      const described = functions.some((f) => f.comment);
      const functionTable = (list) =>
        table(
          ['Function', 'Returns', 'Runs as', 'Executable by', ...(described ? ['Meaning'] : [])],
          list.map((f) => [
            code(`${f.name}(${unschema(f.args)})`),
            code(unschema(f.result)),
            f.definer ? 'owner' : 'caller',
            roles(f.executors),
            ...(described ? [cell(unschema(f.comment)) || '—'] : []),
          ]),
        );
      // Which of them the SQL guide shows how to use: each `name(` it writes, bare or schema-qualified.
      const guide = readFileSync(`${docs}guide/sql.md`, 'utf8');
      const inGuide = callable.filter((f) => new RegExp(`(?:(?<=pgasynq\\.)|(?<![\\w.]))${f.name}\\(`).test(guide)).map((f) => code(`${f.name}()`));
      const viewSections = views.map((v) => {
        // Only the roles that read the view but not the column: the others read no column of it.
        const cols = columns.filter((c) => c.view === v.oid).map((c) => ({ ...c, hidden: c.hidden.filter((r) => v.readers.includes(r)) }));
        const anyHidden = cols.some((c) => c.hidden.length > 0);
        const anyComment = cols.some((c) => c.comment);
        return [
          `### ${v.name}`,
          [v.comment ? cell(unschema(v.comment)) : '', `Readable by ${roles(v.readers)} (and the owner).`].filter(Boolean).join(' '),
          table(
            ['Column', 'Type', ...(anyHidden ? ['Not readable by'] : []), ...(anyComment ? ['Meaning'] : [])],
            cols.map((c) => [
              code(c.name),
              code(c.type),
              ...(anyHidden ? [roles(c.hidden) || '—'] : []),
              ...(anyComment ? [cell(unschema(c.comment)) || '—'] : []),
            ]),
          ),
        ].join('\n\n');
      });
      write(
        'sql.md',
        `# SQL views and functions

What a schema holds for you to read and call in SQL, generated from a schema migrated with
\`migrate()\` (${applied.length} migrations, the last ${code(applied.at(-1))}). \`pgasynq\` stands
for your schema's name. How to read and repair tasks, and enqueue, in SQL:
[Task state in SQL](/guide/sql). Who may read or execute what is what the
[roles script](/guide/deployment#roles-and-least-privilege) grants its roles (\`pgasynq roles\`,
\`roleSetupSql()\`; the owner, \`${shownRole.owner}\`, may do everything). Without it, grant your
logins what they need yourself: the migrations revoke \`EXECUTE\` from \`PUBLIC\` on every
function${open.length > 0 ? ` but ${open.join(', ')}` : ''}.

## Views

${table(
  ['View', 'Columns', 'Readable by'],
  views.map((v) => [`[${v.name}](#${v.name.replaceAll('_', '-')})`, String(columns.filter((c) => c.view === v.oid).length), roles(v.readers)]),
)}

${viewSections.join('\n\n')}

## Functions

A function that runs as the owner (\`SECURITY DEFINER\`) needs no privilege of its caller on
the tables, only \`EXECUTE\` on itself; one that runs as the caller needs the caller's privileges
on what it reads. The SQL guide shows how to use ${inGuide.join(', ')}; the others are what the
library's classes and the views call.

### Functions the roles may execute

${functionTable(shared)}

### Functions the worker alone may execute

What a \`Server\` calls to claim tasks, to write their leases and outcomes, and for its
maintenance (forwarder, recoverer, janitor, aggregator).

${functionTable(workerOnly)}

### The owner's alone

Helpers of the functions above and of the triggers, which no role of the roles script may
execute: ${internal.map((f) => code(`${f.name}()`)).join(', ')}. Not listed: ${triggers.length} trigger functions.
`,
      );
      return { views: views.length, columns: columns.length, functions: callable.length, internal: internal.length };
    } catch (err) {
      await client.query('ROLLBACK').catch(() => {});
      throw err;
    } finally {
      client.release();
    }
  } finally {
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => {});
    await pool.end();
  }
}

// ---------------------------------------------------------------------------------------------

/** Writes the three pages; `project` is the TypeDoc project reference.mjs converted. */
export async function writeReferenceTables(project) {
  const errors = await errorsPage(project);
  const config = await configurationPage(project);
  const sql = await sqlPage();
  console.log(
    `reference: ${errors} error classes; ${config.options} options of ${config.interfaces} interfaces and ${config.environment} environment variables; ` +
      `${sql.views} views (${sql.columns} columns) and ${sql.functions} functions in SQL`,
  );
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const app = await Application.bootstrap({
    entryPoints: MODULES.map((m) => `${root}src/${m.built.replace(/\.js$/, '.ts')}`),
    tsconfig: `${root}tsconfig.build.json`,
    excludeInternal: true,
    excludePrivate: true,
    disableGit: true,
    sourceLinkTemplate: '{path}',
  });
  const project = await app.convert();
  if (!project) fail('TypeDoc could not convert the package');
  await writeReferenceTables(project);
}
