-- Run trees (issue 13): a child run names the run that started it and its job's first
-- run; a root names neither. A job's idempotency key names at most one run.
ALTER TABLE runs ADD COLUMN parent_run_id TEXT;
ALTER TABLE runs ADD COLUMN root_run_id TEXT;
ALTER TABLE runs ADD COLUMN idempotency_key TEXT;
CREATE INDEX runs_by_root ON runs (root_run_id);
CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
