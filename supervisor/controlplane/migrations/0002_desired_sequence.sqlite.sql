-- Control-plane schema, version 2, for the embedded SQLite store: the
-- PostgreSQL version's sequence and change record (docs/control-plane.md).
--
-- SQLite triggers cannot rewrite NEW, so the AFTER triggers record the change
-- and then set the row's sequence with a nested UPDATE; its WHEN clause keeps
-- that UPDATE (which raises the sequence) from firing the trigger again.
-- changed_by is 'sql' for a plain-SQL writer; the daemon's own writes replace
-- it with the OS user in the same transaction.

ALTER TABLE supervisor_desired ADD COLUMN sequence INTEGER NOT NULL DEFAULT 0;

CREATE TABLE supervisor_desired_log (
    sequence    INTEGER PRIMARY KEY,
    revision_id INTEGER NOT NULL,
    changed_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    changed_by  TEXT    NOT NULL,
    message     TEXT
);

UPDATE supervisor_desired SET sequence = 1;
INSERT INTO supervisor_desired_log (sequence, revision_id, changed_at, changed_by, message)
SELECT 1, revision_id, updated_at, 'db migrate', NULL FROM supervisor_desired;

CREATE TRIGGER supervisor_desired_sequence_insert AFTER INSERT ON supervisor_desired
BEGIN
    INSERT INTO supervisor_desired_log (sequence, revision_id, changed_by)
    VALUES (max(NEW.sequence,
                (SELECT coalesce(max(sequence), 0) FROM supervisor_desired_log)) + 1,
            NEW.revision_id, 'sql');
    UPDATE supervisor_desired
       SET sequence = (SELECT max(sequence) FROM supervisor_desired_log)
     WHERE singleton;
END;

CREATE TRIGGER supervisor_desired_sequence_update AFTER UPDATE ON supervisor_desired
WHEN NEW.sequence <= OLD.sequence
BEGIN
    INSERT INTO supervisor_desired_log (sequence, revision_id, changed_by)
    VALUES (max(OLD.sequence,
                (SELECT coalesce(max(sequence), 0) FROM supervisor_desired_log)) + 1,
            NEW.revision_id, 'sql');
    UPDATE supervisor_desired
       SET sequence = (SELECT max(sequence) FROM supervisor_desired_log)
     WHERE singleton;
END;
