-- Control-plane schema, version 3, for the embedded SQLite store: the PostgreSQL
-- version's bounds (docs/control-plane.md). A row of supervisor_desired_log must
-- follow the record by exactly +1 and name the revision the pointer holds (the
-- recording triggers run after the pointer is written); its sequence never
-- changes; no sequence goes above 2^62. SQLite has no roles and no trigger depth:
-- whoever may write the file may drop these, as they may write anything else.
-- The newest row stays (old rows may be deleted); a record whose newest rows were
-- deleted before this version gets the pointer's change back.

INSERT INTO supervisor_desired_log (sequence, revision_id, changed_by, message)
SELECT d.sequence, d.revision_id, 'db migrate', 'the change record restored to the pointer'
  FROM supervisor_desired d
 WHERE d.sequence > (SELECT coalesce(max(l.sequence), 0) FROM supervisor_desired_log l);

CREATE TRIGGER supervisor_desired_log_guard BEFORE INSERT ON supervisor_desired_log
WHEN NEW.sequence IS NOT (SELECT coalesce(max(sequence), 0) + 1 FROM supervisor_desired_log)
  OR NEW.revision_id IS NOT (SELECT revision_id FROM supervisor_desired WHERE singleton)
BEGIN
    SELECT RAISE(ABORT, 'supervisor_desired_log is written only by the trigger on supervisor_desired, by +1');
END;

CREATE TRIGGER supervisor_desired_log_fixed BEFORE UPDATE OF sequence ON supervisor_desired_log
WHEN NEW.sequence IS NOT OLD.sequence
BEGIN
    SELECT RAISE(ABORT, 'supervisor_desired_log.sequence never changes');
END;

CREATE TRIGGER supervisor_desired_sequence_range BEFORE UPDATE OF sequence ON supervisor_desired
WHEN NEW.sequence > 4611686018427387904 OR NEW.sequence < 0
BEGIN
    SELECT RAISE(ABORT, 'supervisor_desired.sequence above 2^62');
END;

CREATE TRIGGER supervisor_desired_log_newest BEFORE DELETE ON supervisor_desired_log
WHEN OLD.sequence >= (SELECT max(sequence) FROM supervisor_desired_log)
BEGIN
    SELECT RAISE(ABORT, 'supervisor_desired_log: the newest change stays (it holds the sequence the next one follows); delete older rows only');
END;
