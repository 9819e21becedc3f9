-- The PostgreSQL layout of the store: the same facts as the SQLite layout at its version 6
-- (runs with their links, keys, tenants, leases and head hashes; the append-only event log
-- with each event's hash; scenario versions; tenant overrides; tokens). Times are
-- microseconds since the Unix epoch, UTC.
CREATE TABLE runs (
    run_id          TEXT PRIMARY KEY,
    scenario_id     TEXT NOT NULL,
    status          TEXT NOT NULL,
    created_us      BIGINT NOT NULL,
    updated_us      BIGINT NOT NULL,
    last_seq        BIGINT NOT NULL,
    head_hash       BYTEA,
    parent_run_id   TEXT,
    root_run_id     TEXT,
    idempotency_key TEXT,
    tenant          TEXT,
    lease_owner     TEXT,
    lease_until_us  BIGINT
);
CREATE INDEX runs_by_status ON runs (status, created_us);
CREATE INDEX runs_claimable ON runs (created_us, run_id) WHERE status = 'running';
CREATE INDEX runs_by_root ON runs (root_run_id);
CREATE INDEX runs_by_tenant ON runs (tenant, created_us);
CREATE INDEX runs_newest ON runs (created_us DESC, run_id DESC);
CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE TABLE events (
    run_id   TEXT NOT NULL,
    seq      BIGINT NOT NULL,
    at_us    BIGINT NOT NULL,
    kind     TEXT NOT NULL,
    version  INTEGER NOT NULL,
    level_id TEXT,
    attempt  BIGINT,
    data     TEXT NOT NULL,
    hash     BYTEA,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE scenario_texts (
    checksum    TEXT PRIMARY KEY,
    scenario_id TEXT NOT NULL,
    texts       TEXT NOT NULL,
    created_us  BIGINT NOT NULL
);

CREATE TABLE tenant_overrides (
    tenant      TEXT NOT NULL,
    scenario_id TEXT NOT NULL,
    yaml        TEXT NOT NULL,
    updated_us  BIGINT NOT NULL,
    PRIMARY KEY (tenant, scenario_id)
);

CREATE TABLE tokens (
    id         TEXT PRIMARY KEY,
    sha256     TEXT NOT NULL UNIQUE,
    tenant     TEXT NOT NULL,
    role       TEXT NOT NULL,
    name       TEXT NOT NULL,
    created_us BIGINT NOT NULL,
    revoked_us BIGINT
);
