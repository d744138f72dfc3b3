-- Control-plane schema, version 1, for the embedded SQLite store. Mirrors the
-- PostgreSQL tables (docs/control-plane.md); SQLite has no NOTIFY, so there is
-- no trigger: replicas on SQLite converge by polling alone.

CREATE TABLE supervisor_revisions (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    schema_version INTEGER NOT NULL CHECK (schema_version >= 1),
    body           BLOB    NOT NULL,
    body_sha256    BLOB    NOT NULL CHECK (length(body_sha256) = 32),
    -- ISO-8601 UTC with milliseconds, e.g. 2024-05-01T12:00:00.123Z.
    created_at     TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    message        TEXT
);

CREATE TABLE supervisor_desired (
    singleton   BOOLEAN NOT NULL PRIMARY KEY DEFAULT TRUE CHECK (singleton = TRUE),
    revision_id INTEGER NOT NULL REFERENCES supervisor_revisions (id),
    updated_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
