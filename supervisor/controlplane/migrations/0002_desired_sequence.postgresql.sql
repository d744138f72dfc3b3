-- Control-plane schema, version 2 (docs/control-plane.md): every change of
-- the desired pointer gets a sequence number and a record.
--
-- supervisor_desired.sequence is the root's intent: it grows by one at every
-- change of supervisor_desired, whoever makes it (publish, rollback, plain
-- SQL), and never goes down, also when the row is deleted and inserted again.
-- Followers compare sequences, not revision ids, so a rollback (an older id,
-- a higher sequence) reaches them, and a replayed older statement does not.
--
-- supervisor_desired_log keeps one row per change: who made it (the database
-- role, and the client's address where known) and why (the message the
-- publisher or the rollback gave, passed as the transaction-local setting
-- supervisor.change_message). It has no foreign key on purpose: pruning old
-- revisions keeps the record of when they were desired.

ALTER TABLE supervisor_desired ADD COLUMN sequence bigint NOT NULL DEFAULT 0;

CREATE TABLE supervisor_desired_log (
    sequence    bigint      PRIMARY KEY,
    revision_id bigint      NOT NULL,
    changed_at  timestamptz NOT NULL DEFAULT now(),
    changed_by  text        NOT NULL,
    message     text
);

-- The pointer as it stands when the schema is upgraded is change 1.
UPDATE supervisor_desired SET sequence = 1;
INSERT INTO supervisor_desired_log (sequence, revision_id, changed_at, changed_by, message)
SELECT 1, revision_id, updated_at, 'db migrate', NULL FROM supervisor_desired;

-- BEFORE: the sequence is set on the row itself, so a plain-SQL writer cannot
-- choose it. INSERT ... ON CONFLICT DO UPDATE fires BEFORE INSERT for the
-- proposed row and then BEFORE UPDATE for the real change: only the AFTER
-- trigger below, which fires once for what was written, records it.
--
-- BEFORE UPDATE runs under the row's lock, so its numbers are in order. BEFORE
-- INSERT is not: it numbers the proposed row before the conflict check, which
-- may wait for a writer that changes the pointer and then deletes the row (so
-- the insert goes ahead with a number that writer took). The AFTER trigger
-- sees that writer's record then, and numbers the inserted row again by
-- updating it, which records the change in turn.
-- Both functions run with their owner's rights (the role that migrated), with
-- the search path of the migration: the record is the schema's own bookkeeping,
-- so a role that may write the pointer needs no grant on supervisor_desired_log
-- (nor did a publisher's role before this version), and it cannot point them
-- at another table by its own search_path. Who made the change is therefore
-- session_user, the role that logged in, not current_user (the owner here).
CREATE FUNCTION supervisor_desired_sequence() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    NEW.sequence := greatest(
        CASE WHEN TG_OP = 'UPDATE' THEN OLD.sequence ELSE 0 END,
        (SELECT coalesce(max(l.sequence), 0) FROM supervisor_desired_log l)) + 1;
    RETURN NEW;
END
$$;

CREATE FUNCTION supervisor_desired_record() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' AND NEW.sequence <=
            (SELECT coalesce(max(l.sequence), 0) FROM supervisor_desired_log l) THEN
        UPDATE supervisor_desired SET sequence = NEW.sequence WHERE singleton;
        RETURN NULL;
    END IF;
    INSERT INTO supervisor_desired_log (sequence, revision_id, changed_by, message)
    VALUES (
        NEW.sequence, NEW.revision_id,
        session_user::text || coalesce('@' || host(inet_client_addr()), ''),
        nullif(current_setting('supervisor.change_message', true), ''));
    RETURN NULL;
END
$$;

CREATE TRIGGER supervisor_desired_sequence BEFORE INSERT OR UPDATE ON supervisor_desired
    FOR EACH ROW EXECUTE FUNCTION supervisor_desired_sequence();
CREATE TRIGGER supervisor_desired_record AFTER INSERT OR UPDATE ON supervisor_desired
    FOR EACH ROW EXECUTE FUNCTION supervisor_desired_record();
