"""Every statement of `PostgresJournal`, rendered once per schema.

The schema name enters a statement only through identifier quoting, so each statement is a
`LiteralString` built from text written here. Times are the server's clock, and every write is
fenced by the writer's lease epoch in the statement itself.
"""

from __future__ import annotations

from typing import LiteralString

__all__ = ('SCHEMA_VERSION', 'Sql', 'quote_identifier')

SCHEMA_VERSION = 4
"""The layout this code writes; a database at a newer version is refused (it was migrated by a newer release).

Version 2 added fencing epochs and the lease holder's database session; version 3 added when a finished
execution's retention ends, with an index; version 4 the record's status in a column of its
own, with an index, so a page of the listing is counted and sorted without reading every record, and
the marker of a journal given keys.
Older schemas are upgraded in place, and releases that only know an older version then refuse the
database, so no writer remains that ignores what was added.
"""

_NOW = 'extract(epoch FROM clock_timestamp())'
"""The server's time in epoch seconds: the one clock every worker's lease is judged by (B-11)."""


def quote_identifier(name: str) -> LiteralString:
    """`name` as a quoted SQL identifier: safe inside a statement whatever it contains, as if written there."""
    return '"' + name.replace('"', '""') + '"'  # pyright: ignore[reportReturnType]


class Sql:
    """Every statement, rendered once for one schema."""

    def __init__(self, schema: str) -> None:
        s = quote_identifier(schema)
        now = _NOW
        self.version_table: LiteralString = f'{s}.schema_version'
        # Idempotent, so it both creates a schema and upgrades one of version 1.
        self.ddl: LiteralString = f"""
            CREATE SCHEMA IF NOT EXISTS {s};
            CREATE TABLE IF NOT EXISTS {s}.schema_version (
                one boolean PRIMARY KEY DEFAULT true CHECK (one),
                version integer NOT NULL
            );
            CREATE TABLE IF NOT EXISTS {s}.executions (
                eid text PRIMARY KEY,
                key bytea NOT NULL,
                record text,
                lease_holder text,
                lease_expires double precision,
                updated double precision
            );
            ALTER TABLE {s}.executions
                ADD COLUMN IF NOT EXISTS lease_epoch bigint,
                ADD COLUMN IF NOT EXISTS lease_session integer,
                ADD COLUMN IF NOT EXISTS lease_session_start timestamptz;
            CREATE SEQUENCE IF NOT EXISTS {s}.lease_epochs;
            CREATE TABLE IF NOT EXISTS {s}.entries (
                eid text NOT NULL,
                run text NOT NULL,
                position bigint NOT NULL,
                value text NOT NULL,
                PRIMARY KEY (eid, run, position)
            );
            CREATE TABLE IF NOT EXISTS {s}.run_records (
                eid text NOT NULL,
                run text NOT NULL,
                name text NOT NULL,
                value text NOT NULL,
                PRIMARY KEY (eid, run, name)
            );
            CREATE INDEX IF NOT EXISTS executions_updated ON {s}.executions (updated);
            ALTER TABLE {s}.executions ADD COLUMN IF NOT EXISTS retain_until double precision;
            CREATE INDEX IF NOT EXISTS executions_retain_until ON {s}.executions (retain_until)
                WHERE retain_until IS NOT NULL;
            ALTER TABLE {s}.executions ADD COLUMN IF NOT EXISTS status text;
            CREATE INDEX IF NOT EXISTS executions_status_updated ON {s}.executions (status, updated);
            ALTER TABLE {s}.schema_version ADD COLUMN IF NOT EXISTS sealed text;
        """
        self.read_version: LiteralString = f'SELECT version FROM {s}.schema_version'
        self.set_version: LiteralString = (
            f'INSERT INTO {s}.schema_version (one, version) VALUES (true, %(version)s) '
            'ON CONFLICT (one) DO UPDATE SET version = EXCLUDED.version'
        )
        self.probe: LiteralString = (
            f"INSERT INTO {s}.executions (eid, key) VALUES (%(eid)s, '') ON CONFLICT (eid) DO NOTHING"
        )
        self.probe_epochs: LiteralString = f"SELECT nextval('{s}.lease_epochs')"
        # Every write first updates the execution row where the writer's epoch is the current one.
        # The row lock serialises it with a takeover, which re-evaluates the condition after waiting.
        fence = (
            f'UPDATE {s}.executions SET updated = {now} WHERE eid = %(eid)s AND lease_epoch = %(epoch)s RETURNING eid'
        )
        self.write_entry: LiteralString = (
            f'WITH fence AS ({fence}) '
            f'INSERT INTO {s}.entries (eid, run, position, value) '
            'SELECT eid, %(run)s, %(position)s, %(value)s FROM fence '
            'ON CONFLICT (eid, run, position) DO UPDATE SET value = EXCLUDED.value RETURNING 1'
        )
        self.write_record: LiteralString = (
            f'WITH fence AS ({fence}) '
            f'INSERT INTO {s}.run_records (eid, run, name, value) '
            'SELECT eid, %(run)s, %(name)s, %(value)s FROM fence '
            'ON CONFLICT (eid, run, name) DO UPDATE SET value = EXCLUDED.value RETURNING 1'
        )
        # A finished record's retention is counted by the server's clock from this write.
        self.write_execution: LiteralString = (
            f'UPDATE {s}.executions SET record = %(value)s, updated = {now}, status = %(status)s, '
            f'retain_until = {now} + %(retention)s::double precision '
            'WHERE eid = %(eid)s AND lease_epoch = %(epoch)s RETURNING 1'
        )
        # PERF-3: a run's entries and records in one statement, one round trip.
        self.read_run: LiteralString = (
            f'SELECT position, NULL::text AS name, value FROM {s}.entries WHERE eid = %(eid)s AND run = %(run)s '
            'UNION ALL '
            f'SELECT NULL::bigint, name, value FROM {s}.run_records WHERE eid = %(eid)s AND run = %(run)s'
        )
        self.read_execution: LiteralString = f'SELECT record FROM {s}.executions WHERE eid = %(eid)s'
        self.delete_run: LiteralString = (
            f'WITH fence AS ({fence}), '
            f'gone AS (DELETE FROM {s}.entries WHERE eid IN (SELECT eid FROM fence) AND run = %(run)s), '
            f'gone_records AS (DELETE FROM {s}.run_records WHERE eid IN (SELECT eid FROM fence) AND run = %(run)s) '
            'SELECT count(*) FROM fence'
        )
        self.lock_execution: LiteralString = (
            f'SELECT 1 FROM {s}.executions WHERE eid = %(eid)s AND lease_epoch = %(epoch)s FOR UPDATE'
        )
        self.delete_execution_row: LiteralString = f'DELETE FROM {s}.executions WHERE eid = ANY(%(eids)s)'
        self.delete_entries: LiteralString = f'DELETE FROM {s}.entries WHERE eid = ANY(%(eids)s)'
        self.delete_records: LiteralString = f'DELETE FROM {s}.run_records WHERE eid = ANY(%(eids)s)'
        # B-13: judged by the server's clock, in the statement that deletes (the row lock keeps a
        # concurrent acquire out until it commits).
        # Judged by the server's clock, in the statement that deletes (the row lock keeps a
        # concurrent acquire out until it commits). Retention reads its partial index, oldest first (FN-2).
        # The time as a sub-select is computed once, before the scan, so it bounds an index scan; the
        # volatile clock itself would be compared row by row, reading the whole index.
        once = f'(SELECT {now})'
        not_live = f'(lease_expires IS NULL OR lease_expires <= {now})'
        self.prune_expired: LiteralString = (
            f'DELETE FROM {s}.executions WHERE eid IN ('
            f'SELECT eid FROM {s}.executions WHERE retain_until <= {once} AND {not_live} '
            'ORDER BY retain_until LIMIT %(limit)s FOR UPDATE SKIP LOCKED) '
            'RETURNING eid, key'
        )
        self.prune_candidates: LiteralString = (
            f'SELECT eid, key, record, updated IS NOT NULL FROM {s}.executions '
            f'WHERE (updated IS NULL OR updated < {once} - %(older_than)s) AND {not_live} FOR UPDATE SKIP LOCKED'
        )
        self.list: LiteralString = f"""
            WITH e AS (SELECT eid, count(*) AS n, sum(octet_length(value)) AS b FROM {s}.entries GROUP BY eid),
                 r AS (SELECT eid, count(*) AS n, sum(octet_length(value)) AS b FROM {s}.run_records GROUP BY eid),
                 u AS (SELECT eid, count(*) AS n FROM (
                          SELECT eid, run FROM {s}.entries UNION SELECT eid, run FROM {s}.run_records
                       ) AS runs GROUP BY eid)
            SELECT x.key, x.record, coalesce(x.lease_expires > {now}, false), x.lease_holder, x.retain_until,
                   x.updated,
                   coalesce(u.n, 0), coalesce(e.n, 0),
                   coalesce(e.b, 0) + coalesce(r.b, 0) + coalesce(octet_length(x.record), 0)
            FROM {s}.executions AS x
            LEFT JOIN e ON e.eid = x.eid LEFT JOIN r ON r.eid = x.eid LEFT JOIN u ON u.eid = x.eid
            WHERE x.record IS NOT NULL OR e.n IS NOT NULL OR r.n IS NOT NULL
        """
        # A page of the listing. What a live lease makes running is judged by the server's clock; the
        # rest by the status column, written with the record. The key filter is a byte range: the keys that
        # start with a prefix, which the planner can estimate, where a computed prefix it cannot.
        live = f'coalesce(lease_expires > (SELECT {now}), false)'  # the clock read once, not row by row
        listed = (
            '(record IS NOT NULL OR updated IS NOT NULL) '
            'AND (%(eid)s::text IS NULL OR eid = %(eid)s) '
            'AND key >= %(low)s AND (%(high)s::bytea IS NULL OR key < %(high)s)'
        )
        bucket = "CASE WHEN status = ANY(%(recorded)s) THEN status ELSE 'interrupted' END"
        self.page_counts: LiteralString = (
            f'SELECT {bucket}, CASE WHEN {live} THEN lease_holder END, count(*) FROM {s}.executions '
            f'WHERE {listed} GROUP BY 1, 2'
        )
        # The states are tested on the status column as it is, so the last-update index serves the order.
        stored = (
            '(status = ANY(%(statuses)s) OR (%(interrupted)s AND (status IS NULL OR NOT status = ANY(%(recorded)s))))'
        )
        self.page_rows: LiteralString = (
            f'SELECT eid, key, record, {live}, lease_holder, retain_until, updated FROM {s}.executions '
            f'WHERE {listed} AND (({live} AND %(running)s) OR (NOT {live} AND {stored})) '
            'ORDER BY updated DESC, key LIMIT %(limit)s OFFSET %(offset)s'
        )
        self.page_sizes: LiteralString = (
            'SELECT eid, run, count(position), sum(octet_length(value)) FROM ('
            f'SELECT eid, run, position, value FROM {s}.entries WHERE eid = ANY(%(eids)s) UNION ALL '
            f'SELECT eid, run, NULL, value FROM {s}.run_records WHERE eid = ANY(%(eids)s)) AS stored GROUP BY eid, run'
        )
        self.unset_status: LiteralString = (
            f'SELECT eid, record FROM {s}.executions WHERE status IS NULL AND record IS NOT NULL'
        )
        self.set_status: LiteralString = (
            f'UPDATE {s}.executions AS x SET status = v.status '
            'FROM unnest(%(eids)s::text[], %(statuses)s::text[]) AS v(eid, status) WHERE x.eid = v.eid'
        )
        # A holder is dead when its lease expired by the server's clock, or when it is an ended attempt
        # of the acquiring process (`take_over`). Its database session proves nothing: a session ends
        # when the server restarts or a pooled connection is closed, while the holder runs on.
        # The session columns of schema version 2 are left empty, so no older release reads them either.
        # A journal without keys (`keyed` false) takes no lease in a schema marked as given keys, and
        # every lease taken reads the marker in the same statement, so its holder can mark the schema.
        self.acquire: LiteralString = (
            f'INSERT INTO {s}.executions AS x (eid, key, lease_holder, lease_expires, lease_epoch) '
            f"SELECT %(eid)s, %(key)s, %(holder)s, {now} + %(ttl)s, nextval('{s}.lease_epochs') "
            f'WHERE %(keyed)s OR NOT EXISTS (SELECT 1 FROM {s}.schema_version WHERE sealed IS NOT NULL) '
            'ON CONFLICT (eid) DO UPDATE SET lease_holder = EXCLUDED.lease_holder, '
            'lease_expires = EXCLUDED.lease_expires, lease_epoch = EXCLUDED.lease_epoch, '
            'lease_session = NULL, lease_session_start = NULL '
            'WHERE %(force)s OR x.lease_holder IS NULL OR x.lease_expires IS NULL '
            f'OR x.lease_expires <= {now} OR x.lease_holder = %(holder)s OR x.lease_holder = %(take_over)s '
            f'RETURNING lease_expires, lease_epoch, (SELECT sealed FROM {s}.schema_version)'
        )
        self.read_marker: LiteralString = f'SELECT sealed FROM {s}.schema_version'
        self.write_marker: LiteralString = f'UPDATE {s}.schema_version SET sealed = %(marker)s'
        self.read_lease: LiteralString = (
            f'SELECT lease_holder, lease_expires, lease_epoch FROM {s}.executions WHERE eid = %(eid)s'
        )
        self.read_leases: LiteralString = (
            f'SELECT eid, lease_holder, lease_expires, lease_epoch FROM {s}.executions WHERE eid = ANY(%(eids)s)'
        )
        # Every lease a process holds in this schema, in one statement; rows are locked in key order,
        # the order every batch of writes takes them in, so two batches never wait on each other in a circle.
        self.renew: LiteralString = (
            f'UPDATE {s}.executions AS x SET lease_expires = {now} + v.ttl '
            'FROM unnest(%(eids)s::text[], %(holders)s::text[], %(epochs)s::bigint[], %(ttls)s::float8[]) '
            'AS v(eid, holder, epoch, ttl) '
            f'WHERE x.eid IN (SELECT eid FROM {s}.executions WHERE eid = ANY(%(eids)s) ORDER BY eid FOR UPDATE) '
            'AND x.eid = v.eid AND x.lease_holder = v.holder AND x.lease_epoch = v.epoch '
            'RETURNING x.eid, x.lease_expires'
        )
        # A lease-only row (no write ever touched it) goes with its lease; otherwise only the lease is cleared.
        mine = 'eid = %(eid)s AND lease_holder = %(holder)s AND lease_epoch = %(epoch)s'
        self.release: LiteralString = (
            f'WITH gone AS (DELETE FROM {s}.executions WHERE {mine} AND updated IS NULL AND record IS NULL) '
            f'UPDATE {s}.executions SET lease_holder = NULL, lease_expires = NULL, lease_epoch = NULL, '
            'lease_session = NULL, lease_session_start = NULL '
            f'WHERE {mine} AND (updated IS NOT NULL OR record IS NOT NULL)'
        )
