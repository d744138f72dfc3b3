-- Control-plane schema, version 2, for the embedded SQLite store: the
-- PostgreSQL version's sequence and change record (docs/control-plane.md).
--
-- SQLite triggers cannot rewrite NEW, so the AFTER triggers record the change
-- and then set the row's sequence with a nested UPDATE, only where the row does
-- not hold that number already. The number comes from the record and the old
-- row, never from what the writer put in the row: as on PostgreSQL, a
-- plain-SQL writer cannot choose it. The update trigger's WHEN clause ignores
-- the nested UPDATEs (they set the sequence to the newest record's, which no
-- other write does while leaving it changed), also with recursive_triggers on.
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
    VALUES ((SELECT coalesce(max(sequence), 0) FROM supervisor_desired_log) + 1,
            NEW.revision_id, 'sql');
    UPDATE supervisor_desired
       SET sequence = (SELECT max(sequence) FROM supervisor_desired_log)
     WHERE singleton AND sequence IS NOT (SELECT max(sequence) FROM supervisor_desired_log);
END;

CREATE TRIGGER supervisor_desired_sequence_update AFTER UPDATE ON supervisor_desired
WHEN NEW.sequence = OLD.sequence
  OR NEW.sequence IS NOT (SELECT max(sequence) FROM supervisor_desired_log)
BEGIN
    INSERT INTO supervisor_desired_log (sequence, revision_id, changed_by)
    VALUES (max(OLD.sequence,
                (SELECT coalesce(max(sequence), 0) FROM supervisor_desired_log)) + 1,
            NEW.revision_id, 'sql');
    UPDATE supervisor_desired
       SET sequence = (SELECT max(sequence) FROM supervisor_desired_log)
     WHERE singleton AND sequence IS NOT (SELECT max(sequence) FROM supervisor_desired_log);
END;
