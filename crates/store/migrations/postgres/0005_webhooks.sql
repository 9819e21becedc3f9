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
    previous_until_us BIGINT,
    created_us BIGINT NOT NULL,
    removed_us BIGINT
);
CREATE INDEX webhooks_by_tenant ON webhooks (tenant) WHERE removed_us IS NULL;
CREATE TABLE webhook_deliveries (
    id TEXT PRIMARY KEY,
    webhook_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    type TEXT NOT NULL,
    body TEXT NOT NULL,
    created_us BIGINT NOT NULL,
    next_us BIGINT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT 'pending',
    lease_owner TEXT,
    lease_until_us BIGINT,
    last_error TEXT
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_us) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_by_webhook ON webhook_deliveries (webhook_id, created_us);
CREATE TABLE webhook_attempts (
    delivery_id TEXT NOT NULL,
    attempt BIGINT NOT NULL,
    at_us BIGINT NOT NULL,
    status BIGINT,
    error TEXT,
    duration_ms BIGINT NOT NULL,
    PRIMARY KEY (delivery_id, attempt)
);
-- The outbox is written by a trigger on `events`, so that every way an event is inserted
-- (a run's creation, a group of appends, an append on its own) writes its deliveries in
-- the same statement and transaction. The body is the SQLite store's: `type`,
-- `timestamp`, `data` (run, tenant, seq, kind, level, attempt, payload), the payload left
-- out past 64 KiB.
CREATE FUNCTION baton_webhook_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    t TEXT;
    run_tenant TEXT;
    body TEXT;
    stamp TEXT;
BEGIN
    t := CASE NEW.kind
        WHEN 'approval_requested' THEN 'approval.requested'
        WHEN 'ask_user' THEN 'question.asked'
        WHEN 'wave_decided' THEN 'wave.decided'
        ELSE 'run.' || (NEW.data::jsonb ->> 'status')
    END;
    SELECT tenant INTO run_tenant FROM runs WHERE run_id = NEW.run_id;
    IF NOT EXISTS (
        SELECT 1 FROM webhooks w
         WHERE w.tenant IS NOT DISTINCT FROM run_tenant AND w.removed_us IS NULL
           AND position(',' || t || ',' IN ',' || w.types || ',') > 0
    ) THEN
        RETURN NULL;
    END IF;
    stamp := to_char(to_timestamp(NEW.at_us / 1000000.0) AT TIME ZONE 'UTC',
                     'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"');
    body := json_build_object('type', t, 'timestamp', stamp, 'data', json_build_object(
        'run_id', NEW.run_id, 'tenant', run_tenant, 'seq', NEW.seq, 'kind', NEW.kind,
        'level_id', NEW.level_id, 'attempt', NEW.attempt, 'payload', NEW.data::json))::text;
    IF octet_length(body) > 65536 THEN
        body := json_build_object('type', t, 'timestamp', stamp, 'data', json_build_object(
            'run_id', NEW.run_id, 'tenant', run_tenant, 'seq', NEW.seq, 'kind', NEW.kind,
            'level_id', NEW.level_id, 'attempt', NEW.attempt, 'payload', NULL,
            'payload_omitted', 'the payload is ' || octet_length(body) || ' bytes; read event '
                || NEW.seq || ' of run ' || NEW.run_id
                || ' (`baton events`, GET /runs/{id}/events)'))::text;
    END IF;
    INSERT INTO webhook_deliveries (id, webhook_id, run_id, seq, type, body, created_us, next_us)
    SELECT 'msg_' || w.id || '_' || NEW.run_id || '_' || NEW.seq, w.id, NEW.run_id, NEW.seq, t,
           body, NEW.at_us, NEW.at_us
      FROM webhooks w
     WHERE w.tenant IS NOT DISTINCT FROM run_tenant AND w.removed_us IS NULL
       AND position(',' || t || ',' IN ',' || w.types || ',') > 0
    ON CONFLICT (id) DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER events_webhook_outbox AFTER INSERT ON events FOR EACH ROW
    WHEN (NEW.kind IN ('approval_requested', 'ask_user', 'scenario_finished', 'wave_decided'))
    EXECUTE FUNCTION baton_webhook_outbox();
