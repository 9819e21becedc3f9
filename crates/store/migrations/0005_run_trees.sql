-- Jobs (issue 13): a child run names the run that started it and its job's first run; a
-- root names neither. A job's idempotency key names at most one run. A run of a tenant
-- names it. Tenants' overrides (partial YAML deep-merged over a base scenario) live here,
-- one per tenant and scenario, checked before they are stored.
ALTER TABLE runs ADD COLUMN tenant TEXT;
CREATE TABLE tenant_overrides (
    tenant TEXT NOT NULL,
    scenario_id TEXT NOT NULL,
    yaml TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant, scenario_id)
);
ALTER TABLE runs ADD COLUMN parent_run_id TEXT;
ALTER TABLE runs ADD COLUMN root_run_id TEXT;
ALTER TABLE runs ADD COLUMN idempotency_key TEXT;
CREATE INDEX runs_by_root ON runs (root_run_id);
CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
