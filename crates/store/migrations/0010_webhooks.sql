-- Webhooks (issue 34): a tenant's URLs, the event types each is sent, its signing secret
-- (and the previous one, which signs too until `previous_until_us` after a rotation). The
-- outbox holds one delivery per event and webhook, written in the transaction that appends
-- the event; each attempt at sending one is kept.
CREATE TABLE webhooks (
    id TEXT PRIMARY KEY,
    tenant TEXT,
    url TEXT NOT NULL,
    types TEXT NOT NULL,
    secret TEXT NOT NULL,
    previous_secret TEXT,
    previous_until_us INTEGER,
    created_us INTEGER NOT NULL,
    removed_us INTEGER
);
CREATE INDEX webhooks_by_tenant ON webhooks (tenant) WHERE removed_us IS NULL;
CREATE TABLE webhook_deliveries (
    id TEXT PRIMARY KEY,
    webhook_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    body TEXT NOT NULL,
    created_us INTEGER NOT NULL,
    next_us INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT 'pending',
    lease_owner TEXT,
    lease_until_us INTEGER,
    last_error TEXT
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_us) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_by_webhook ON webhook_deliveries (webhook_id, created_us);
CREATE TABLE webhook_attempts (
    delivery_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    at_us INTEGER NOT NULL,
    status INTEGER,
    error TEXT,
    duration_ms INTEGER NOT NULL,
    PRIMARY KEY (delivery_id, attempt)
);
