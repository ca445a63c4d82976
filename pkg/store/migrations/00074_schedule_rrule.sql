-- +goose Up

-- A job schedule runs on a cron expression or on an RFC 5545 RRULE
-- (issue 36), exactly one. An RRULE's DTSTART is stored (dtstart, on the
-- wall clock of the schedule's timezone): its occurrences, and the
-- fields it implies (FREQ=DAILY without BYHOUR runs at DTSTART's hour),
-- come from it, so they stay the same across restarts. A rule done (its
-- COUNT or UNTIL passed) has no next occurrence: next_at is NULL and the
-- schedule never fires again.
ALTER TABLE job_schedules
    DROP CONSTRAINT job_schedules_cron_check,
    ADD CONSTRAINT job_schedules_cron_check CHECK (length(cron) <= 200),
    ADD COLUMN rrule text NOT NULL DEFAULT '' CHECK (length(rrule) <= 500),
    ADD COLUMN dtstart timestamptz,
    ADD CONSTRAINT job_schedules_cron_or_rrule CHECK (
        (cron <> '' AND rrule = '' AND dtstart IS NULL) OR (cron = '' AND rrule <> '' AND dtstart IS NOT NULL)),
    ALTER COLUMN next_at DROP NOT NULL;

-- +goose Down
DELETE FROM job_schedules WHERE rrule <> '' OR next_at IS NULL;
ALTER TABLE job_schedules
    DROP CONSTRAINT job_schedules_cron_or_rrule,
    DROP COLUMN dtstart,
    DROP COLUMN rrule,
    DROP CONSTRAINT job_schedules_cron_check,
    ADD CONSTRAINT job_schedules_cron_check CHECK (length(cron) BETWEEN 1 AND 200),
    ALTER COLUMN next_at SET NOT NULL;
