-- Control-plane schema, version 1 (docs/control-plane.md).
--
-- Revisions are immutable documents; supervisor_desired is a one-row pointer
-- to the revision every replica should serve. Anyone may publish with plain
-- SQL, for example:
--
--   WITH r AS (
--     INSERT INTO supervisor_revisions (schema_version, body, body_sha256, message)
--     VALUES (1, convert_to(:doc, 'UTF8'), sha256(convert_to(:doc, 'UTF8')), 'by hand')
--     RETURNING id)
--   INSERT INTO supervisor_desired (revision_id) SELECT id FROM r
--   ON CONFLICT (singleton) DO UPDATE
--     SET revision_id = EXCLUDED.revision_id, updated_at = now();
--
-- The NOTIFY trigger itself is (re)created by the migration runner, because
-- its channel comes from the configuration.

CREATE TABLE supervisor_revisions (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    schema_version integer     NOT NULL CHECK (schema_version >= 1),
    body           bytea       NOT NULL,
    -- SHA-256 of body, written by the publisher and verified by every reader.
    body_sha256    bytea       NOT NULL CHECK (octet_length(body_sha256) = 32),
    created_at     timestamptz NOT NULL DEFAULT now(),
    message        text
);

CREATE TABLE supervisor_desired (
    -- A boolean primary key that can only be true: at most one row, and
    -- publishers upsert it with ON CONFLICT (singleton).
    singleton   boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    revision_id bigint      NOT NULL REFERENCES supervisor_revisions (id),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The payload is only the id (NOTIFY payloads must stay under 8000 bytes, and
-- listeners treat it as a hint anyway); the channel is the trigger's argument.
CREATE FUNCTION supervisor_desired_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], NEW.revision_id::text);
    RETURN NULL;
END
$$;
