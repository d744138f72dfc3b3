-- Control-plane schema, version 3 (docs/control-plane.md): the sequence stays in range
-- and the change record is written only by the recording trigger.
--
-- Followers persist the highest sequence they accepted, so one bad number poisons
-- every follower: a row a writer adds to supervisor_desired_log at 2^63-2 made the
-- next publish 2^63-1 and every later one fail "bigint out of range". A sequence
-- moves by exactly +1 from the record (the BEFORE trigger of version 2 computes
-- it), never above 2^62; a row of the record comes only from
-- supervisor_desired_record (nested in the pointer's own trigger, so at trigger
-- depth 2), and a row's sequence never changes. Existing rows are not checked
-- (NOT VALID): an upgrade never fails on a record already written.
--
-- The newest row is the pointer's sequence, which the +1 rule follows: old rows
-- may be deleted, the newest may not (nor the table truncated). A record whose
-- newest rows were deleted before this version gets the pointer's change back.

INSERT INTO supervisor_desired_log (sequence, revision_id, changed_by, message)
SELECT d.sequence, d.revision_id, 'db migrate', 'the change record restored to the pointer'
  FROM supervisor_desired d
 WHERE d.sequence > (SELECT coalesce(max(l.sequence), 0) FROM supervisor_desired_log l);

ALTER TABLE supervisor_desired ADD CONSTRAINT supervisor_desired_sequence_range
    CHECK (sequence BETWEEN 0 AND 4611686018427387904) NOT VALID;
ALTER TABLE supervisor_desired_log ADD CONSTRAINT supervisor_desired_log_sequence_range
    CHECK (sequence BETWEEN 1 AND 4611686018427387904) NOT VALID;

CREATE FUNCTION supervisor_desired_log_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' OR TG_OP = 'DELETE' AND OLD.sequence >=
            (SELECT max(l.sequence) FROM supervisor_desired_log l) THEN
        RAISE EXCEPTION 'supervisor_desired_log: the newest change stays (it holds the'
            ' sequence the next one follows); delete older rows only'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF NEW.sequence IS DISTINCT FROM OLD.sequence THEN
            RAISE EXCEPTION 'supervisor_desired_log.sequence never changes'
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF pg_trigger_depth() < 2 THEN
        RAISE EXCEPTION 'supervisor_desired_log is written only by the trigger on'
            ' supervisor_desired: change the pointer instead'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.sequence IS DISTINCT FROM
            (SELECT coalesce(max(l.sequence), 0) FROM supervisor_desired_log l) + 1 THEN
        RAISE EXCEPTION 'supervisor_desired_log: sequence % does not follow the record by +1',
            NEW.sequence USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER supervisor_desired_log_guard
    BEFORE INSERT OR UPDATE OR DELETE ON supervisor_desired_log
    FOR EACH ROW EXECUTE FUNCTION supervisor_desired_log_guard();
CREATE TRIGGER supervisor_desired_log_truncate BEFORE TRUNCATE ON supervisor_desired_log
    FOR EACH STATEMENT EXECUTE FUNCTION supervisor_desired_log_guard();
