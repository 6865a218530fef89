/**
 * Least-privilege roles: the SQL that `pgasynq roles` prints and
 * roleSetupSql() returns. Every grant below is derived from the statements
 * of this directory (enqueue.ts, dependencies.ts, leases.ts, maintenance.ts,
 * servers.ts, scheduler.ts, aggregation.ts, inspector-read.ts,
 * inspector-write.ts); a statement that starts touching another table or
 * column changes this file.
 *
 * Enqueues (migration 0009) go through enqueue_tasks(), SECURITY DEFINER:
 * it checks the rows as the library's validation does, draws their
 * positions, and plans a workflow's edges from the dependencies it locks
 * itself, so neither the producer nor the worker holds any INSERT, UPDATE or
 * DELETE on task_inputs, task_states, task_dependencies or unique_locks for
 * an enqueue (a producer holds none at all, so it cannot plant rows, forge
 * edges, delete another's unique lock or hold row locks that stop claims).
 *
 * Tasks (schema v2, migration 0004) live in two tables, task_inputs and
 * task_states. A Server writes them only through the owner's functions of
 * migration 0010 (the claim, claim_limited(), the fenced writes of a lease,
 * the forwarder, the recoverer, the janitor, the aggregator's commit), each
 * SECURITY DEFINER, fencing and deciding time itself (a moved clock is the
 * owner's alone): each statement file lists the functions it calls, and the
 * worker is granted exactly those, with SELECT on what it reads. The
 * Inspector's actions are the owner's functions of migration 0012, granted to
 * the admin. The view `tasks` stays writable for repairs in SQL by the owner:
 * its INSTEAD OF trigger function tasks_write() calls the same functions.
 *
 * Flow control (migration 0007): a task's priority and concurrency key are
 * written at enqueue, as its other state columns; a queue's limits are set by
 * the admin (Inspector.setQueueLimits) and read by the worker, whose claim of
 * a limited queue is claim_limited() (SECURITY DEFINER since 0010: it counts
 * active tasks, logs the starts a rate limit keeps in queue_starts, and
 * claims, as the owner).
 *
 * queue_counts() pins search_path (0009), as every other function does.
 *
 * enqueue() in SQL (migration 0008) is SECURITY DEFINER: the producer calls
 * it (from a trigger of its own table, say) without touching the tables, so
 * its EXECUTE is all it needs; the rule functions enqueue() calls are run as
 * the owner, and granted to no one.
 *
 * Workflows (migration 0005): an enqueue with dependsOn writes the edges
 * (task_dependencies) through enqueue_tasks(); settling them when a dependency completes, is
 * archived or is deleted is the work of triggers on task_states whose
 * functions (and settle_completed() and settle_failed(), which they call) are SECURITY DEFINER
 * and owned by the owner: whoever finishes a task needs no privilege on its
 * dependents or their edges. Trigger functions are not checked for EXECUTE
 * when they fire, so revoking EXECUTE below stops nothing but direct calls.
 *
 * Six NOLOGIN group roles; users grant them to their own login roles:
 *
 *   owner      owns the schema and every object in it: `pgasynq migrate`.
 *   producer   Client.enqueue / enqueueMany (unique tasks included), and
 *              enqueue() in SQL.
 *   worker     everything a Server runs (processor, heartbeater, forwarder,
 *              recoverer, janitor, aggregator) and the Scheduler.
 *   monitor    counts without contents: `stats`, `queue ls|inspect|history`,
 *              `group ls`, `cron history`; every column except the payload,
 *              headers and result columns.
 *   inspector  read-only, payloads included: every Inspector read, `task ls`,
 *              `task inspect`, `server ls`, `cron ls`, `dash --read-only`,
 *              /metrics (it samples task lists and servers).
 *   admin      inspector plus the Inspector's actions (run, archive, delete,
 *              cancel, pause, set limits, update payload, delete queue); no
 *              DDL, no TRUNCATE, no enqueue.
 *
 * The script is idempotent and converges: it revokes what the roles hold on
 * the schema's tables and grants the current set again, in one transaction.
 * Grants name existing tables only, so it is rerun after every `pgasynq
 * migrate` that applied something (a table or column added later is not
 * covered by default privileges on purpose: column-level grants cannot be
 * defaulted, and a half-covered new table is worse than a clear 42501).
 */
import { ROLE_KINDS, type RoleKind } from '../model/roles.js';
import { AGGREGATION_FUNCTIONS } from './aggregation.js';
import { CLAIM_FUNCTIONS } from './claim.js';
import { FOLLOWING_FUNCTIONS } from './following.js';
import { LEASE_FUNCTIONS } from './leases.js';
import { MAINTENANCE_FUNCTIONS } from './maintenance.js';

/** Columns a monitor may not read: what a task carries, as opposed to where it is. */
const CONTENT_COLUMNS: readonly (readonly [table: string, column: string])[] = [
  ['tasks', 'payload'],
  ['tasks', 'payload_bytes'],
  ['tasks', 'headers'],
  ['tasks', 'result'],
  ['tasks', 'result_bytes'],
  ['task_inputs', 'payload'],
  ['task_inputs', 'payload_bytes'],
  ['task_inputs', 'headers'],
  ['task_states', 'result'],
  ['task_states', 'result_bytes'],
  // A completed dependency's result, handed to its dependents.
  ['task_dependencies', 'result'],
  ['task_dependencies', 'result_bytes'],
  ['scheduler_entries', 'payload'],
  ['scheduler_entries', 'payload_bytes'],
  // A cron entry's enqueue options: its task's headers among them.
  ['scheduler_entries', 'options'],
  // What a handler logged (ctx.log, 0013): it may quote what the task carries.
  ['task_logs', 'message'],
];

/**
 * The owner's functions of the Inspector's actions on tasks (inspector-write.ts,
 * migration 0012): run, archive, delete (with the unique lock the task holds),
 * a scheduled task's payload, a cancellation. Each decides which states it acts
 * on and leaves the lease to the table's trigger (0010 release_lease()).
 */
const ADMIN_FUNCTIONS = [
  'run_tasks(bigint[], text[])',
  'archive_tasks(bigint[], text[])',
  'delete_tasks(bigint[], text[])',
  'set_payload(bigint, jsonb, bytea)',
  'request_cancel(text)',
];

/** A queue's limits (migration 0007): the admin sets them (inspector-write.ts setLimits), the worker's claim reads them. */
const QUEUE_LIMIT_COLUMNS = 'concurrency, key_concurrency, rate_limit, rate_interval_ms';
/** Functions the grants name, by signature: each must exist, as the objects of REQUIRED. */
const REPLACE_TASKS = 'replace_tasks(json, timestamptz, text)';
const SQL_ENQUEUE = 'enqueue(text, jsonb, text, text, timestamptz, integer, integer, text)';
const ENQUEUE_TASKS = 'enqueue_tasks(json, timestamptz, boolean)';
const ENSURE_QUEUES = 'ensure_queues(text[])';
/** The clock the views and the owner's functions read the time from (0011). */
const TASK_NOW = 'task_now()';
/** The owner's functions through which a Server writes tasks (migration 0010), by signature: each statement file lists the ones it calls. */
const WORKER_FUNCTIONS = [...CLAIM_FUNCTIONS, ...LEASE_FUNCTIONS, ...MAINTENANCE_FUNCTIONS, ...AGGREGATION_FUNCTIONS];

/** Objects the grants name; all must exist (the schema is migrated) or the grants are skipped with a notice. */
const REQUIRED = [
  'migrations',
  'task_inputs',
  'task_states',
  'task_dependencies',
  'task_seq',
  'tasks',
  'queues',
  'unique_locks',
  'servers',
  'daily_stats',
  'scheduler_entries',
  'scheduler_events',
  'queue_stats',
  'active_tasks',
  'queue_starts',
];

const lit = (s: string) => `'${s}'`;

/** Grants each role to its member unless it already is one (a rerun stays quiet). */
function grantRoles(pairs: readonly (readonly [role: string, member: string])[]): string {
  const lines = pairs.map(
    ([role, member]) =>
      `  IF NOT EXISTS (SELECT FROM pg_auth_members WHERE roleid = ${lit(`"${role}"`)}::regrole AND member = ${lit(`"${member}"`)}::regrole) THEN\n` +
      `    GRANT "${role}" TO "${member}";\n  END IF;`,
  );
  return `DO $$\nBEGIN\n${lines.join('\n')}\nEND\n$$;`;
}

/**
 * The script for a validated schema name and role names (src/roles.ts
 * roleSetupSql() checks them), with one LOGIN role per group role when `logins`.
 */
export function buildRoleSetupSql(schema: string, r: Readonly<Record<RoleKind, string>>, logins: boolean): string {
  const S = `"${schema}"`;
  const id = (name: string) => `"${name}"`;
  const users = [r.producer, r.worker, r.monitor, r.inspector, r.admin].map(id).join(', ');
  const all = ROLE_KINDS.map((k) => id(r[k])).join(', ');
  const t = (name: string) => `${S}.${name}`;

  const createRoles = ROLE_KINDS.map(
    (k) => `  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = ${lit(r[k])}) THEN CREATE ROLE ${id(r[k])} NOLOGIN; END IF;`,
  ).join('\n');

  const loginRoles = logins
    ? `
-- Login roles, one per group role, without a password: set one (\\password NAME
-- in psql) or authenticate them otherwise. The owner's login acts as the owner
-- role from its first statement, so what migrations create belongs to it.
DO $$
BEGIN
${ROLE_KINDS.map((k) => `  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = ${lit(`${r[k]}_login`)}) THEN CREATE ROLE ${id(`${r[k]}_login`)} LOGIN; END IF;`).join('\n')}
END
$$;
${grantRoles(ROLE_KINDS.map((k) => [r[k], `${r[k]}_login`]))}
ALTER ROLE ${id(`${r.owner}_login`)} SET role = ${lit(r.owner)};
`
    : '';

  const contentFilter = CONTENT_COLUMNS.map(([tb, col]) => `(${lit(tb)}, ${lit(col)})`).join(', ');

  return `-- pgasynq least-privilege roles for schema ${S} (generated by \`pgasynq roles\`).
-- Idempotent: run it as a superuser before the first \`pgasynq migrate\` and
-- again after every migrate that applied something (new tables and columns
-- are granted only by a rerun). Grant the group roles to your login roles:
--   GRANT ${r.worker} TO my_worker_login;
-- A login that runs migrations must act as ${r.owner} (SET ROLE ${r.owner},
-- or ALTER ROLE my_deploy_login SET role = '${r.owner}'), so the owner owns
-- what the migrations create.
BEGIN;

DO $$
BEGIN
${createRoles}
END
$$;
${grantRoles([[r.inspector, r.admin]])}
${loginRoles}
-- Every role may connect; the owner may create the schema (pgasynq migrate
-- runs CREATE SCHEMA IF NOT EXISTS, which checks this privilege first).
DO $$
BEGIN
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO ${all}', current_database());
  EXECUTE format('GRANT CREATE ON DATABASE %I TO ${id(r.owner)}', current_database());
END
$$;

-- The owner owns the schema and everything in it, also what was migrated
-- before as another role.
CREATE SCHEMA IF NOT EXISTS ${S} AUTHORIZATION ${id(r.owner)};
ALTER SCHEMA ${S} OWNER TO ${id(r.owner)};
DO $$
DECLARE
  o record;
BEGIN
  FOR o IN
    SELECT c.oid::regclass AS name,
           CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END AS kind
    FROM pg_class c
    WHERE c.relnamespace = ${lit(S)}::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
      AND c.relowner <> ${lit(id(r.owner))}::regrole
      -- a sequence of an identity column follows its table
      AND NOT (c.relkind = 'S' AND EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype IN ('a', 'i')))
  LOOP
    EXECUTE format('ALTER %s %s OWNER TO %I', o.kind, o.name, ${lit(r.owner)});
  END LOOP;
  FOR o IN
    SELECT p.oid::regprocedure AS name FROM pg_proc p
    WHERE p.pronamespace = ${lit(S)}::regnamespace AND p.proowner <> ${lit(id(r.owner))}::regrole
  LOOP
    EXECUTE format('ALTER ROUTINE %s OWNER TO %I', o.name, ${lit(r.owner)});
  END LOOP;
END
$$;

-- Nobody else reaches the schema.
REVOKE ALL ON SCHEMA ${S} FROM PUBLIC;
-- A function the owner creates (the next migrate) may be called by no one
-- until this script grants it: PostgreSQL's default EXECUTE for PUBLIC would
-- let every role above call a new SECURITY DEFINER function, such as
-- settle_completed() (0005), as the owner. Global, not IN SCHEMA: a
-- schema's default privileges can add to the global ones, not take away.
ALTER DEFAULT PRIVILEGES FOR ROLE ${id(r.owner)} REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
GRANT USAGE ON SCHEMA ${S} TO ${users};

DO $$
DECLARE
  o record;
BEGIN
  IF ${REQUIRED.map((n) => `to_regclass(${lit(`${S}.${n}`)}) IS NULL`).join(' OR ')}
     OR to_regprocedure(${lit(`${S}.queue_counts(text)`)}) IS NULL
     OR ${[REPLACE_TASKS, SQL_ENQUEUE, ENQUEUE_TASKS, ENSURE_QUEUES, TASK_NOW, ...WORKER_FUNCTIONS, ...ADMIN_FUNCTIONS, ...FOLLOWING_FUNCTIONS].map((f) => `to_regprocedure(${lit(`${S}.${f}`)}) IS NULL`).join(' OR ')} THEN
    RAISE NOTICE 'pgasynq: schema ${schema} is not migrated: roles created, table grants skipped. Run pgasynq migrate as ${r.owner}, then run this script again.';
    RETURN;
  END IF;

  -- Start from nothing, so a rerun also takes back what is no longer needed
  -- (revoking a table privilege revokes its column privileges too).
  REVOKE ALL ON ALL TABLES IN SCHEMA ${S} FROM PUBLIC, ${users};
  REVOKE ALL ON ALL SEQUENCES IN SCHEMA ${S} FROM PUBLIC, ${users};
  REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ${S} FROM PUBLIC, ${users};

  -- producer: enqueues through the owner's functions alone: enqueue_tasks()
  -- (Client.enqueue and enqueueMany, unique locks and dependsOn included, 0009),
  -- replace_tasks() (replace, 0006) and enqueue() in SQL (0008), each SECURITY
  -- DEFINER and checking what it is given. No INSERT, UPDATE or DELETE of any
  -- table: so no row a producer could plant, no edge it could forge, no lock
  -- of another it could delete, and no row lock it could take (SELECT … FOR
  -- UPDATE needs an UPDATE privilege). It reads tasks through the view, as it
  -- always could (a replace reads the replaced tasks back).
  GRANT SELECT ON ${t('tasks')} TO ${id(r.producer)};
  -- …with their dependencies' names (TaskInfo.dependsOn), not the results they hand over.
  GRANT SELECT (dependent_seq, dependency_seq, dependency_queue, dependency_id) ON ${t('task_dependencies')} TO ${id(r.producer)};
  GRANT EXECUTE ON FUNCTION ${t(ENQUEUE_TASKS)} TO ${id(r.producer)}, ${id(r.worker)};
  GRANT EXECUTE ON FUNCTION ${t(REPLACE_TASKS)} TO ${id(r.producer)}, ${id(r.worker)};
  GRANT EXECUTE ON FUNCTION ${t(SQL_ENQUEUE)} TO ${id(r.producer)};
  -- Waiting for a task (Client.waitFor, enqueueAndWait) and watching the servers'
  -- events (Inspector.watch, 0013): through the owner's functions, which mark a task
  -- awaited or register a watcher and nothing else. Every role that reads tasks may.
${FOLLOWING_FUNCTIONS.map((f) => `  GRANT EXECUTE ON FUNCTION ${t(f)} TO ${id(r.producer)}, ${id(r.worker)}, ${id(r.monitor)}, ${id(r.inspector)};\n`).join('')}
  -- worker: every write a Server makes to a task (the claim, claim_limited() for
  -- queues with limits, the fenced writes of a lease, the forwarder, the recoverer,
  -- the janitor, the aggregator's commit) is a call of one of the owner's functions
  -- (0010, SECURITY DEFINER, fencing and deciding time themselves), and its enqueues
  -- (the scheduler's, the aggregator's, a handler's) go through enqueue_tasks(), as
  -- the producer's. So it holds no INSERT, UPDATE or DELETE on task_inputs,
  -- task_states, task_dependencies or unique_locks, no row lock it could take on
  -- them (SELECT … FOR UPDATE needs an UPDATE privilege), nothing on task_seq and
  -- nothing on queue_starts (the rate limits' log, claim_limited()'s alone). It
  -- reads what it reads: the task tables and the view (the server registry counts
  -- pending tasks, ctx.dependencyResults() reads the edges, the scheduler reads
  -- unique locks), the queues' limits, and adds to the queues' totals (stats; never
  -- paused, never the limits: they are the admin's). Completing, archiving or
  -- deleting a task with dependents settles them through the owner's SECURITY
  -- DEFINER triggers.
  -- Every column but lease_token, in the view and its table: a worker learns the token
  -- of the leases it claims and of those the recoverer may take (expired_leases()),
  -- never of another server's running task, so it cannot finish, fail, extend or lock one.
  FOR o IN
    SELECT c.relname, string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) AS cols
    FROM pg_class c
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    WHERE c.relnamespace = ${lit(S)}::regnamespace AND c.relname IN ('tasks', 'task_states') AND a.attname <> 'lease_token'
    GROUP BY c.relname
  LOOP
    EXECUTE format('GRANT SELECT (%s) ON %I.%I TO %I', o.cols, ${lit(schema)}, o.relname, ${lit(r.worker)});
  END LOOP;
  GRANT SELECT ON ${t('task_inputs')} TO ${id(r.worker)};
  GRANT SELECT ON ${t('task_dependencies')} TO ${id(r.worker)};
  GRANT SELECT ON ${t('unique_locks')} TO ${id(r.worker)};
  GRANT SELECT, UPDATE (processed_total, failed_total) ON ${t('queues')} TO ${id(r.worker)};
${WORKER_FUNCTIONS.map((f) => `  GRANT EXECUTE ON FUNCTION ${t(f)} TO ${id(r.worker)};\n`).join('')}  -- A server makes the queues it serves known at start, and an admin the queue it
  -- creates or configures, through the owner's ensure_queues() (0009), which checks
  -- the names: neither holds INSERT on queues.
  GRANT EXECUTE ON FUNCTION ${t(ENSURE_QUEUES)} TO ${id(r.worker)}, ${id(r.admin)};
  -- Server.start and Scheduler.start check the schema version (which migrations are applied).
  GRANT SELECT ON ${t('migrations')} TO ${id(r.worker)};
  GRANT SELECT, INSERT, UPDATE (status, heartbeat_at, expires_at), DELETE ON ${t('servers')} TO ${id(r.worker)};
  GRANT SELECT, INSERT, UPDATE (processed, failed), DELETE ON ${t('daily_stats')} TO ${id(r.worker)};
  GRANT SELECT, INSERT, UPDATE, DELETE ON ${t('scheduler_entries')} TO ${id(r.worker)};
  GRANT SELECT, INSERT, UPDATE (task_id), DELETE ON ${t('scheduler_events')} TO ${id(r.worker)};

  -- inspector: reads everything, payloads included (task ls / inspect show them).
  GRANT SELECT ON ALL TABLES IN SCHEMA ${S} TO ${id(r.inspector)};
  -- queue_stats calls queue_counts(), which reads task_states as the caller
  -- (0005 dropped and re-created both: this rerun grants them again).
  GRANT EXECUTE ON FUNCTION ${t('queue_counts(text)')} TO ${id(r.monitor)}, ${id(r.inspector)};
  -- queue_stats and active_tasks read the time through task_now(), as the caller.
  GRANT EXECUTE ON FUNCTION ${t(TASK_NOW)} TO ${users};

  -- monitor: every column of every table and view except the contents of
  -- tasks (payload, headers, result: in task_inputs, task_states, the view
  -- and the results dependencies hand over in task_dependencies) and cron
  -- entries; a statement that reads one fails with 42501.
  FOR o IN
    SELECT c.relname, string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) AS cols
    FROM pg_class c
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    WHERE c.relnamespace = ${lit(S)}::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
      AND (c.relname::text, a.attname::text) NOT IN (${contentFilter})
    GROUP BY c.relname
  LOOP
    EXECUTE format('GRANT SELECT (%s) ON %I.%I TO %I', o.cols, ${lit(schema)}, o.relname, ${lit(r.monitor)});
  END LOOP;

  -- admin (a member of inspector): the Inspector's actions. Task moves (run,
  -- archive, delete with the unique lock released), a scheduled task's payload
  -- and cancellation are the owner's functions (0012): no write on the task
  -- tables, the view or the unique locks. Running, archiving or deleting a
  -- waiting task or one with dependents settles the edges through the
  -- triggers. Pause, a queue's limits (setQueueLimits, 0007; createQueue makes
  -- a queue known through ensure_queues(), granted above), and queue removal
  -- with its stats are writes of the queue's own rows.
${ADMIN_FUNCTIONS.map((f) => `  GRANT EXECUTE ON FUNCTION ${t(f)} TO ${id(r.admin)};\n`).join('')}  GRANT UPDATE (paused, ${QUEUE_LIMIT_COLUMNS}), DELETE ON ${t('queues')} TO ${id(r.admin)};
  GRANT DELETE ON ${t('daily_stats')} TO ${id(r.admin)};
END
$$;

COMMIT;
`;
}
