-- The server (issue 16): bearer tokens, each scoped to one tenant with one role, stored as
-- the SHA-256 of the token (the token itself is shown once, when it is made). A revoked
-- token stays listed with the time it was revoked. Run pages are read newest first per
-- tenant.
CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    sha256 TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    role TEXT NOT NULL,
    name TEXT NOT NULL,
    created_at TEXT NOT NULL,
    revoked_at TEXT
);
CREATE INDEX runs_by_tenant ON runs (tenant, created_at);
