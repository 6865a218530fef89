-- pgasynq 0001: every table of the task model.
-- {{schema}} is replaced by the quoted schema name before this file runs.

CREATE TABLE {{schema}}.queues (
  name            text PRIMARY KEY,
  paused          boolean NOT NULL DEFAULT false,
  -- All-time totals, added to by servers' periodic stats flushes (never per task).
  processed_total bigint NOT NULL DEFAULT 0,
  failed_total    bigint NOT NULL DEFAULT 0,
  created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {{schema}}.tasks (
  queue            text NOT NULL,
  id               text NOT NULL,
  type             text NOT NULL,
  -- A JSON payload lives in payload; a binary one in payload_bytes (payload is then NULL).
  payload          jsonb,
  payload_bytes    bytea,
  headers          jsonb NOT NULL DEFAULT '{}',
  state            text NOT NULL,
  max_retry        integer NOT NULL DEFAULT 25,
  retried          integer NOT NULL DEFAULT 0,
  timeout          interval NOT NULL DEFAULT '0',
  deadline         timestamptz,
  unique_key       text,
  group_key        text,
  retention        interval NOT NULL DEFAULT '0',
  -- The instant the row's state is keyed on, as asynq's sorted-set scores are:
  -- pending: when it became pending (the queue's FIFO order); scheduled, retry:
  -- when it is due; completed: when retention ends; archived: when archived;
  -- NULL while active or aggregating.
  run_at           timestamptz,
  -- Lease of an active task: who holds it, until when, and the fencing token that
  -- every write about the claimed task must carry. A new token on every claim.
  lease_owner      text,
  lease_expires_at timestamptz,
  lease_token      uuid,
  started_at       timestamptz,
  cancel_requested boolean NOT NULL DEFAULT false,
  error_msg        text,
  last_failed_at   timestamptz,
  completed_at     timestamptz,
  result           jsonb,
  result_bytes     bytea,
  enqueued_at      timestamptz NOT NULL DEFAULT now(),
  updated_at       timestamptz NOT NULL DEFAULT now(),
  -- Tie-break for rows with the same run_at, so the order is total and stable.
  seq              bigint GENERATED ALWAYS AS IDENTITY,
  PRIMARY KEY (queue, id),
  CONSTRAINT tasks_state_valid CHECK (state IN
    ('pending', 'active', 'scheduled', 'retry', 'archived', 'completed', 'aggregating')),
  -- asynq #1144 ("active with no lease") made impossible by construction.
  CONSTRAINT tasks_active_has_lease CHECK (state <> 'active' OR
    (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL AND lease_owner IS NOT NULL)),
  CONSTRAINT tasks_due_has_run_at CHECK (state NOT IN ('pending', 'scheduled', 'retry') OR run_at IS NOT NULL),
  CONSTRAINT tasks_retry_counts CHECK (max_retry >= 0 AND retried >= 0),
  CONSTRAINT tasks_one_payload CHECK (payload IS NULL OR payload_bytes IS NULL)
) WITH (
  -- A queue table churns: most rows live seconds. Leave room for HOT updates
  -- (claim, heartbeat) and vacuum long before the default 20 % of dead rows.
  fillfactor = 80,
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_vacuum_threshold = 1000,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_cost_limit = 2000,
  autovacuum_vacuum_insert_scale_factor = 0.05
);

-- One partial index per state that a component scans, so the claim, the forwarder,
-- the recoverer and the janitor are index range scans however many finished rows
-- the table holds.
CREATE INDEX tasks_pending_idx     ON {{schema}}.tasks (queue, run_at, seq) WHERE state = 'pending';
CREATE INDEX tasks_due_idx         ON {{schema}}.tasks (run_at) WHERE state IN ('scheduled', 'retry');
CREATE INDEX tasks_active_idx      ON {{schema}}.tasks (lease_expires_at) WHERE state = 'active';
CREATE INDEX tasks_completed_idx   ON {{schema}}.tasks (run_at) WHERE state = 'completed';
CREATE INDEX tasks_archived_idx    ON {{schema}}.tasks (queue, run_at) WHERE state = 'archived';
CREATE INDEX tasks_aggregating_idx ON {{schema}}.tasks (queue, group_key, enqueued_at) WHERE state = 'aggregating';
-- No index on id alone: every state change of a row is a non-HOT update that
-- inserts into each index, and the one lookup by id without its queue
-- (cancelProcessing) concerns active rows, which tasks_active_idx covers.

-- asynq's Unique(ttl): a lock per (queue, type, payload digest) that outlives the task
-- states it covers and expires on its own.
CREATE TABLE {{schema}}.unique_locks (
  queue      text NOT NULL,
  key        text NOT NULL,
  task_id    text NOT NULL,
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (queue, key)
);
CREATE INDEX unique_locks_expires_idx ON {{schema}}.unique_locks (expires_at);

CREATE TABLE {{schema}}.servers (
  id              text PRIMARY KEY,
  host            text NOT NULL,
  pid             integer NOT NULL,
  concurrency     integer NOT NULL,
  queues          jsonb NOT NULL,
  strict_priority boolean NOT NULL,
  status          text NOT NULL,
  started_at      timestamptz NOT NULL DEFAULT now(),
  heartbeat_at    timestamptz NOT NULL DEFAULT now(),
  -- A server that stops refreshing its row is gone once this passes.
  expires_at      timestamptz NOT NULL
);

-- Per queue and UTC day: finished attempts and failures. Servers add their
-- in-memory sums every few seconds, so no row is touched per task.
CREATE TABLE {{schema}}.daily_stats (
  queue     text NOT NULL,
  day       date NOT NULL,
  processed bigint NOT NULL DEFAULT 0,
  failed    bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (queue, day)
);

CREATE TABLE {{schema}}.scheduler_entries (
  id           text PRIMARY KEY,
  spec         text NOT NULL,
  task_type    text NOT NULL,
  payload      jsonb,
  payload_bytes bytea,
  options      jsonb NOT NULL DEFAULT '{}',
  location     text NOT NULL DEFAULT 'UTC',
  scheduler_id text NOT NULL,
  next_run_at  timestamptz,
  prev_run_at  timestamptz,
  heartbeat_at timestamptz NOT NULL DEFAULT now(),
  expires_at   timestamptz NOT NULL
);

-- One row per tick of an entry: the primary key is what makes any number of
-- schedulers enqueue each tick exactly once.
CREATE TABLE {{schema}}.scheduler_events (
  entry_id    text NOT NULL,
  tick_at     timestamptz NOT NULL,
  task_id     text NOT NULL,
  enqueued_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (entry_id, tick_at)
);
