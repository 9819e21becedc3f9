-- The packed log (issue 18). Each run gets an integer key, `rk`, that its events carry
-- instead of the run's UUID (kept once, in `runs`); AUTOINCREMENT so that a purged run's key
-- is never given to another. Events are stored one commit batch to a row: the batch's
-- first and last seq, the first event's time, the events packed into one blob (the format
-- of crates/store/src/packed.rs) and the chain hash of its last event. Event kinds and the
-- key lists of objects ("shapes") are numbered in two dictionaries the blobs refer to. The
-- code that applies this file packs the events already stored, then drops `events`. A run's
-- times become integers (microseconds since the Unix epoch, UTC), as events' already were:
-- 8 bytes where the text took 27, in the row and in every index that orders by them; the
-- code turns the copied texts into them.
CREATE TABLE runs_packed (
    rk              INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id          TEXT NOT NULL UNIQUE,
    scenario_id     TEXT NOT NULL,
    status          TEXT NOT NULL,
    created_at      INTEGER NOT NULL, -- microseconds since the Unix epoch, UTC
    updated_at      INTEGER NOT NULL,
    last_seq        INTEGER NOT NULL,
    head_hash       BLOB,
    lease_owner     TEXT,
    lease_until_us  INTEGER,
    tenant          TEXT,
    parent_run_id   TEXT,
    root_run_id     TEXT,
    idempotency_key TEXT
);
INSERT INTO runs_packed (run_id, scenario_id, status, created_at, updated_at, last_seq,
    head_hash, lease_owner, lease_until_us, tenant, parent_run_id, root_run_id, idempotency_key)
SELECT run_id, scenario_id, status, created_at, updated_at, last_seq, head_hash,
    lease_owner, lease_until_us, tenant, parent_run_id, root_run_id, idempotency_key
FROM runs ORDER BY created_at, run_id;
DROP TABLE runs;
ALTER TABLE runs_packed RENAME TO runs;
CREATE INDEX runs_by_status ON runs (status, created_at);
CREATE INDEX runs_claimable ON runs (status, lease_until_us, created_at);
CREATE INDEX runs_by_root ON runs (root_run_id);
CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX runs_by_tenant ON runs (tenant, created_at);

CREATE TABLE kinds (code INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE shapes (id INTEGER PRIMARY KEY, keys TEXT NOT NULL UNIQUE);

CREATE TABLE batches (
    rk        INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    last_seq  INTEGER NOT NULL,
    at_us     INTEGER NOT NULL, -- the first event's time, microseconds since the Unix epoch
    body      BLOB NOT NULL,
    hash      BLOB NOT NULL
);
CREATE UNIQUE INDEX batches_by_run ON batches (rk, first_seq);
