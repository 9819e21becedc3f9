-- Browser sessions (issue 33): the web UI's cookie holds a session id, never a token; the
-- store keeps the id's SHA-256, the token it was opened with (by hash: a revoked token ends
-- its sessions) and when it was made, last used and revoked. Capped per token.
CREATE TABLE sessions (
    sha256 TEXT PRIMARY KEY,
    token_sha256 TEXT NOT NULL,
    token_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    seen_at TEXT NOT NULL,
    revoked_at TEXT
);
CREATE INDEX sessions_by_token ON sessions (token_id, created_at);
CREATE INDEX sessions_by_age ON sessions (created_at);
