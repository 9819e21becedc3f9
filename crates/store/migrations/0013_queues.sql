-- Queues, priorities, limits and homes (issue 36). A run's job waits in its root's queue,
-- due at `due_us` (its creation moved earlier by its priority; NULL: its creation); `home`
-- names the data dir that holds the run's workspace, for a run with one; `events_version`
-- is the newest event version its log holds, so that a worker never claims a log it
-- cannot read (every event before this change is at version 2 or lower). `queues` are the
-- queues a job may be started in ('default' always is), each with its aging time and an
-- optional limit on the runs leased at once; `tenant_limits`, that limit per tenant.
ALTER TABLE runs ADD COLUMN queue TEXT NOT NULL DEFAULT 'default';
ALTER TABLE runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN due_us INTEGER;
ALTER TABLE runs ADD COLUMN home TEXT;
ALTER TABLE runs ADD COLUMN events_version INTEGER NOT NULL DEFAULT 2;
CREATE INDEX runs_due ON runs (COALESCE(due_us, created_at), run_id) WHERE status = 'running';
CREATE INDEX runs_leased_by_queue ON runs (queue) WHERE lease_owner IS NOT NULL;
CREATE TABLE queues (
    name        TEXT PRIMARY KEY,
    aging_s     INTEGER NOT NULL,
    max_running INTEGER,
    created_us  INTEGER NOT NULL,
    updated_us  INTEGER NOT NULL
);
INSERT INTO queues (name, aging_s, max_running, created_us, updated_us)
    VALUES ('default', 600, NULL, 0, 0);
CREATE TABLE tenant_limits (
    tenant      TEXT PRIMARY KEY,
    max_running INTEGER NOT NULL,
    updated_us  INTEGER NOT NULL
);
