/**
 * `npm run schema:dump`: writes migrations/schema.sql, the schema as the
 * numbered migrations leave it, for reading. It migrates a throwaway schema in
 * DATABASE_URL's database, renders it from the catalog, and drops it again.
 * test/schema-file.test.ts renders a schema of its own with `schemaText` and
 * fails when the committed file differs.
 *
 * Catalog queries (pg_get_*def), not pg_dump: they need no client binary of
 * the server's version (CI's second run is on an embedded PostgreSQL 18, which
 * the machine's pg_dump 15 refuses), they give the order and layout chosen
 * here instead of pg_dump's SET, ownership and version lines to strip, and the
 * test needs nothing but the pg driver. What they render still depends on the
 * server's major version (pg_get_viewdef's layout), so the file records it and
 * the test skips on a server of another version.
 */
import { writeFileSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';
import pg from 'pg';
import { migrate } from '../src/index.js';

/** The committed file. */
export const SCHEMA_FILE = fileURLToPath(new URL('../migrations/schema.sql', import.meta.url));

/** The throwaway schema `npm run schema:dump` migrates and drops. */
const DUMP_SCHEMA = 'pgasynq_schema_dump';

/** The header line that records the server's major version, as the test reads it back. */
export const VERSION_LINE = /^-- Rendered by PostgreSQL (\d+)\.$/m;

interface Row {
  [column: string]: unknown;
}

/**
 * The text of migrations/schema.sql for `schema` of `connectionString`'s
 * database, which must be migrated already. Throws when the schema holds a
 * kind of object this renderer does not show, so the file never leaves one
 * out in silence.
 */
export async function schemaText(connectionString: string, schema: string): Promise<string> {
  const client = new pg.Client({ connectionString });
  await client.connect();
  try {
    // An empty search_path makes every pg_get_*def qualify the schema's names, which then become {{schema}}.
    await client.query("SET search_path TO ''");
    // The schema's name is $1 wherever a query names it; the rest take a relation's oid.
    const q = async (text: string): Promise<Row[]> => (await client.query<Row>(text, text.includes('$1') ? [schema] : [])).rows;
    await refuseUnrendered(q);
    const major = Math.floor(Number((await client.query<{ v: string }>("SELECT current_setting('server_version_num') AS v")).rows[0]!.v) / 10000);
    const applied = (await client.query<{ name: string }>(`SELECT name FROM "${schema}".migrations ORDER BY name COLLATE "C"`)).rows.map((r) => r.name);

    const tables: string[] = [];
    for (const table of await q(`SELECT c.oid, c.oid::regclass::text AS name, c.reloptions, obj_description(c.oid, 'pg_class') AS comment
      FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'r' ORDER BY c.relname COLLATE "C"`)) {
      tables.push(await tableDdl(q, table));
    }
    const sequences = (
      await q(`
      SELECT format('CREATE SEQUENCE %s AS %s START WITH %s INCREMENT BY %s MINVALUE %s MAXVALUE %s CACHE %s%s;',
               c.oid::regclass, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmin, s.seqmax, s.seqcache,
               CASE WHEN s.seqcycle THEN ' CYCLE' ELSE '' END)
             || coalesce(E'\n' || (SELECT format('ALTER SEQUENCE %s OWNED BY %s.%I;', c.oid::regclass, d.refobjid::regclass, a.attname)
                                   FROM pg_depend d JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                                   WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'a'), '') AS ddl
      FROM pg_class c JOIN pg_sequence s ON s.seqrelid = c.oid
      WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'S'
        AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'i')
      ORDER BY c.relname COLLATE "C"`)
    ).map((r) => `${r.ddl as string}\n`);
    const views: string[] = [];
    for (const view of await q(`SELECT c.oid, c.oid::regclass::text AS name, c.reloptions, obj_description(c.oid, 'pg_class') AS comment, pg_get_viewdef(c.oid, true) AS def
      FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'v' ORDER BY c.relname COLLATE "C"`)) {
      views.push(await viewDdl(q, view));
    }
    const functions = (
      await q(`
      SELECT pg_get_functiondef(p.oid) AS def,
             format('%s.%I(%s)', p.pronamespace::regnamespace, p.proname, pg_get_function_identity_arguments(p.oid)) AS signature,
             p.proacl IS NOT NULL AND NOT EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE') AS revoked,
             obj_description(p.oid, 'pg_proc') AS comment
      FROM pg_proc p WHERE p.pronamespace = $1::regnamespace
      ORDER BY p.proname COLLATE "C", pg_get_function_identity_arguments(p.oid) COLLATE "C"`)
    ).map((f) => {
      let text = `${(f.def as string).trimEnd()};\n`;
      if (f.revoked === true) text += `REVOKE EXECUTE ON FUNCTION ${f.signature as string} FROM PUBLIC;\n`;
      if (f.comment !== null) text += `COMMENT ON FUNCTION ${f.signature as string} IS ${literal(f.comment as string)};\n`;
      return text;
    });

    const out = [
      header(major, applied),
      ...part('Tables, each with its indexes, triggers and comments', tables),
      ...part('Sequences not owned by an identity column', sequences),
      ...part('Views, each with its triggers and comments', views),
      ...part('Functions, with EXECUTE revoked from PUBLIC where a migration revoked it', functions),
    ];
    return placeholders(out.join('\n'), schema);
  } finally {
    await client.end();
  }
}

function header(major: number, applied: string[]): string {
  return [
    "-- pgasynq's current schema: what the numbered migrations in this directory leave in a schema.",
    '--',
    '-- Generated by `npm run schema:dump` (scripts/schema-dump.ts) from a schema migrated with',
    `-- migrate(), through ${applied.at(-1) ?? 'no migration'} (${applied.length} files). Do not edit it and do not apply it:`,
    '-- the numbered migrations are the source of truth, and migrate() runs only them.',
    '-- test/schema-file.test.ts fails when this file no longer matches what they produce.',
    '--',
    '-- {{schema}} stands for the quoted schema name, as in the migrations. Objects are',
    '-- grouped by kind and sorted by name, not in the order they could be created in.',
    '-- Privileges granted to roles (roleSetupSql()) are not part of the migrations, and not shown.',
    `-- Rendered by PostgreSQL ${major}.`,
    '',
  ].join('\n');
}

/** A titled part of the file, or nothing when the schema has no object of its kind. */
function part(title: string, items: string[]): string[] {
  return items.length === 0 ? [] : [`-- ${'='.repeat(title.length)}\n-- ${title}\n-- ${'='.repeat(title.length)}\n`, ...items];
}

async function tableDdl(q: (text: string) => Promise<Row[]>, table: Row): Promise<string> {
  const oid = table.oid as number;
  const columns = await q(`
    SELECT format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod))
           || CASE WHEN a.attcollation <> t.typcollation THEN format(' COLLATE %s', a.attcollation::regcollation) ELSE '' END
           || CASE a.attidentity WHEN 'a' THEN ' GENERATED ALWAYS' WHEN 'd' THEN ' GENERATED BY DEFAULT' ELSE '' END
           -- The sequence's name, which statements may use (nextval), is shown with the column.
           || CASE WHEN a.attidentity <> '' THEN format(' AS IDENTITY (SEQUENCE NAME %s)', pg_get_serial_sequence(a.attrelid::regclass::text, a.attname)) ELSE '' END
           || CASE WHEN a.attgenerated = 's' THEN format(' GENERATED ALWAYS AS (%s) STORED', pg_get_expr(d.adbin, d.adrelid, true))
                   WHEN d.adbin IS NOT NULL THEN ' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid, true) ELSE '' END
           || CASE WHEN a.attnotnull AND a.attidentity = '' THEN ' NOT NULL' ELSE '' END AS line,
           a.attname, col_description(a.attrelid, a.attnum) AS comment
    FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE a.attrelid = ${oid} AND a.attnum > 0 AND NOT a.attisdropped
    ORDER BY a.attnum`);
  // Not-null constraints (contype 'n', PostgreSQL 18) are the columns' NOT NULL above.
  const constraints = await q(`
    SELECT format('CONSTRAINT %I %s', conname, pg_get_constraintdef(oid, true)) AS line, conname, obj_description(oid, 'pg_constraint') AS comment
    FROM pg_constraint WHERE conrelid = ${oid} AND contype <> 'n'
    ORDER BY conname COLLATE "C"`);
  const name = table.name as string;
  const lines = [...columns, ...constraints].map((r) => `  ${r.line as string}`);
  let text = `CREATE TABLE ${name} (\n${lines.join(',\n')}\n)${reloptions(table)};\n`;
  for (const index of await q(`
    SELECT pg_get_indexdef(i.indexrelid, 0, true) AS def, obj_description(i.indexrelid, 'pg_class') AS comment, i.indexrelid::regclass::text AS name
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE i.indrelid = ${oid} AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid AND k.conrelid = ${oid})
    ORDER BY c.relname COLLATE "C"`)) {
    text += `${index.def as string};\n`;
    if (index.comment !== null) text += `COMMENT ON INDEX ${index.name as string} IS ${literal(index.comment as string)};\n`;
  }
  text += await triggers(q, oid, name);
  text += relationComments(name, table.comment, 'TABLE', columns, constraints);
  return text;
}

async function viewDdl(q: (text: string) => Promise<Row[]>, view: Row): Promise<string> {
  const oid = view.oid as number;
  const name = view.name as string;
  const columns = await q(
    `SELECT a.attname, col_description(a.attrelid, a.attnum) AS comment FROM pg_attribute a WHERE a.attrelid = ${oid} AND a.attnum > 0 ORDER BY a.attnum`,
  );
  let text = `CREATE VIEW ${name}${reloptions(view)} AS\n${(view.def as string).trimEnd()}\n`;
  text += await triggers(q, oid, name);
  text += relationComments(name, view.comment, 'VIEW', columns, []);
  return text;
}

async function triggers(q: (text: string) => Promise<Row[]>, oid: number, relation: string): Promise<string> {
  let text = '';
  for (const t of await q(`
    SELECT pg_get_triggerdef(oid, true) AS def, tgname, obj_description(oid, 'pg_trigger') AS comment
    FROM pg_trigger WHERE tgrelid = ${oid} AND NOT tgisinternal ORDER BY tgname COLLATE "C"`)) {
    text += `${t.def as string};\n`;
    if (t.comment !== null) text += `COMMENT ON TRIGGER ${ident(t.tgname as string)} ON ${relation} IS ${literal(t.comment as string)};\n`;
  }
  return text;
}

function relationComments(name: string, comment: unknown, kind: string, columns: Row[], constraints: Row[]): string {
  let text = '';
  if (comment !== null) text += `COMMENT ON ${kind} ${name} IS ${literal(comment as string)};\n`;
  for (const c of columns) if (c.comment !== null) text += `COMMENT ON COLUMN ${name}.${ident(c.attname as string)} IS ${literal(c.comment as string)};\n`;
  for (const c of constraints)
    if (c.comment !== null) text += `COMMENT ON CONSTRAINT ${ident(c.conname as string)} ON ${name} IS ${literal(c.comment as string)};\n`;
  return text;
}

function reloptions(rel: Row): string {
  const options = rel.reloptions as string[] | null;
  return options === null ? '' : ` WITH (\n  ${options.map((o) => o.replace('=', ' = ')).join(',\n  ')}\n)`;
}

const ident = (name: string) => (/^[a-z_][a-z0-9_]*$/.test(name) ? name : `"${name.replaceAll('"', '""')}"`);
const literal = (text: string) => `'${text.replaceAll("'", "''")}'`;

/** The schema's name, quoted (as migrate() writes it into function bodies) or bare (as the catalog prints it), becomes {{schema}}. */
function placeholders(text: string, schema: string): string {
  return text.replace(new RegExp(`"${schema}"|\\b${schema}\\b`, 'g'), '{{schema}}');
}

/**
 * Kinds of object the renderer above does not show: if a migration adds one,
 * the dump fails and says so, rather than leaving it out of the file. Also
 * refuses default privileges of the connected role, which would change the
 * functions' EXECUTE grants that the file shows as the migrations' REVOKEs.
 */
async function refuseUnrendered(q: (text: string) => Promise<Row[]>): Promise<void> {
  const found = await q(`
    SELECT format('%s %s', CASE c.relkind WHEN 'p' THEN 'partitioned table' WHEN 'm' THEN 'materialized view' WHEN 'f' THEN 'foreign table' ELSE 'relation of kind ' || c.relkind::text END, c.relname) AS what
    FROM pg_class c WHERE c.relnamespace = $1::regnamespace AND c.relkind NOT IN ('r', 'v', 'i', 'S')
    UNION ALL SELECT 'row-level security on ' || relname FROM pg_class WHERE relnamespace = $1::regnamespace AND relrowsecurity
    UNION ALL SELECT 'inherited table ' || inhrelid::regclass::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relnamespace = $1::regnamespace
    UNION ALL SELECT 'type ' || typname FROM pg_type t WHERE typnamespace = $1::regnamespace AND typrelid = 0 AND typelem = 0
    UNION ALL SELECT format('routine of kind %s %s', prokind, proname) FROM pg_proc WHERE pronamespace = $1::regnamespace AND prokind <> 'f'
    UNION ALL SELECT 'rule ' || rulename FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class WHERE c.relnamespace = $1::regnamespace AND r.rulename <> '_RETURN'
    UNION ALL SELECT 'policy ' || polname FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid WHERE c.relnamespace = $1::regnamespace
    UNION ALL SELECT 'grant to PUBLIC on ' || c.relname FROM pg_class c, aclexplode(c.relacl) a WHERE c.relnamespace = $1::regnamespace AND a.grantee = 0
    UNION ALL SELECT 'default privileges of role ' || defaclrole::regrole::text FROM pg_default_acl WHERE defaclrole = current_user::regrole AND defaclobjtype = 'f'
    ORDER BY 1`);
  if (found.length > 0) {
    throw new Error(`schema-dump does not render ${found.map((r) => r.what as string).join(', ')}: teach scripts/schema-dump.ts to show it`);
  }
}

/** Migrates a throwaway schema, renders it into migrations/schema.sql, drops it. */
async function main(): Promise<void> {
  const connectionString = process.env.DATABASE_URL;
  if (connectionString === undefined) throw new Error('set DATABASE_URL to a PostgreSQL database this script may create and drop a schema in');
  const pool = new pg.Pool({ connectionString, max: 1 });
  try {
    await pool.query(`DROP SCHEMA IF EXISTS "${DUMP_SCHEMA}" CASCADE`);
    await migrate({ connectionString, schema: DUMP_SCHEMA, logger: false });
    const text = await schemaText(connectionString, DUMP_SCHEMA);
    writeFileSync(SCHEMA_FILE, text);
    console.log(`wrote ${SCHEMA_FILE} (${text.split('\n').length - 1} lines, ${VERSION_LINE.exec(text)?.[0].slice(3) ?? ''})`);
  } finally {
    await pool.query(`DROP SCHEMA IF EXISTS "${DUMP_SCHEMA}" CASCADE`).catch(() => {});
    await pool.end();
  }
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) await main();
