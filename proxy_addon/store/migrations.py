"""
The schema, as named migrations that run on both backends (dialect-aware, one list).

Each `m00N_...` function takes a `Schema`: `schema.execute(sql)` runs a statement, and
`schema.postgres` says which dialect to write where they differ (types, identity columns,
triggers). On SQLite they are sqlite-utils migrations, recorded by name in
`_sqlite_migrations`; `SQLiteStore.open` applies what is pending inside `BEGIN IMMEDIATE`, so
concurrent openers migrate once. On PostgreSQL, `apply_postgres` records them by the same
names in `receipt_proxy_migrations` and applies what is pending in one transaction under an
advisory lock, so several proxies starting at once migrate once.

Never edit or rename an applied migration: databases in use have recorded it by name and
will not run it again. Change the schema with a new `m00N_...` function at the end.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from sqlite_utils.migrations import Migrations

from proxy_addon.states import UNRESOLVED
from proxy_addon.store.chain_start import chain_history
from proxy_addon.store.hash_chain import CHAIN_TRIGGER

migrations = Migrations("receipt-proxy")
MIGRATION_SET = migrations.name
POSTGRES_TABLE = "receipt_proxy_migrations"


class Schema:
    """What a migration writes through: SQLite (sqlite-utils' Database) or a PostgreSQL connection."""

    def __init__(self, target: Any, *, postgres: bool):
        self.target = target
        self.postgres = postgres

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run a statement (`?` placeholders, none in literals)."""
        if params and self.postgres:
            sql = sql.replace("?", "%s")
        if params:
            self.target.execute(sql, list(params))
        else:
            self.target.execute(sql)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """The rows of a query, as dicts of column -> value."""
        if self.postgres:
            cur = self.target.execute(sql.replace("?", "%s"), list(params))
            return [
                dict(r) if isinstance(r, dict) else dict(zip([d.name for d in cur.description], r, strict=True))
                for r in cur
            ]
        cur = self.target.execute(sql, list(params))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


MigrationFn = Callable[[Schema], None]
ALL: list[tuple[str, MigrationFn]] = []  # every migration, in order, by name


def migration(fn: MigrationFn) -> MigrationFn:
    """Register `fn` under its name for both backends."""
    ALL.append((fn.__name__, fn))

    def on_sqlite(db: Schema) -> None:
        fn(Schema(db, postgres=False))

    on_sqlite.__name__ = fn.__name__
    migrations(name=fn.__name__)(on_sqlite)  # type: ignore[type-var]  # sqlite-utils' Protocol: `db` by position
    return fn


def apply_postgres(conn: Any, lock: int, lock_timeout: float) -> list[str]:
    """
    Apply the pending migrations on a PostgreSQL connection (in autocommit mode), in one
    transaction under the advisory lock `lock`: concurrent openers wait, then find nothing
    pending. Returns the names applied.
    """
    applied: list[str] = []
    with conn.transaction():
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{int(max(lock_timeout, 1) * 1000)}ms",))
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {POSTGRES_TABLE} (migration_set TEXT NOT NULL, name TEXT NOT NULL, "
            "applied_at TEXT NOT NULL, PRIMARY KEY (migration_set, name))"
        )
        done = {
            r["name"] if isinstance(r, dict) else r[0]
            for r in conn.execute(f"SELECT name FROM {POSTGRES_TABLE} WHERE migration_set = %s", (MIGRATION_SET,))
        }
        schema = Schema(conn, postgres=True)
        for name, fn in ALL:
            if name in done:
                continue
            fn(schema)
            conn.execute(
                f"INSERT INTO {POSTGRES_TABLE} (migration_set, name, applied_at) VALUES (%s, %s, %s)",
                (MIGRATION_SET, name, str(dt.datetime.now(dt.UTC))),
            )
            applied.append(name)
    return applied


@migration
def m001_receipts(db: Schema) -> None:
    pg = db.postgres
    db.execute(_receipts_table(pg))
    unresolved = ", ".join(f"'{s}'" for s in sorted(UNRESOLVED))
    db.execute(
        f"CREATE UNIQUE INDEX receipts_one_unresolved_per_fingerprint "
        f"ON receipts(intent_fingerprint) WHERE state IN ({unresolved})"
    )
    db.execute("CREATE INDEX receipts_by_fingerprint ON receipts(intent_fingerprint)")
    db.execute("CREATE INDEX receipts_by_state ON receipts(state)")
    db.execute(_events_table(pg))
    db.execute("CREATE INDEX receipt_events_by_receipt ON receipt_events(operation_id, id)")
    _events_append_only(db)


# m001's statements, as they were first written (SQLite keeps a table's CREATE text as given: kept byte for byte).


def _receipts_table(pg: bool) -> str:
    return f"""
        CREATE TABLE receipts (
            {"seq BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE," if pg else ""}
            operation_id TEXT PRIMARY KEY,
            api TEXT NOT NULL,
            operation TEXT NOT NULL,
            method TEXT NOT NULL,
            target TEXT NOT NULL,
            state TEXT NOT NULL,
            intent_fingerprint TEXT NOT NULL,
            intent TEXT NOT NULL,
            principal TEXT NOT NULL,
            submitted_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            completed_at TEXT,
            http_status INTEGER,
            error TEXT,
            external_id TEXT,
            flow_id TEXT,
            retry_of TEXT REFERENCES receipts(operation_id){" DEFERRABLE" if pg else ""},
            instance TEXT,
            response_status INTEGER,
            response_headers TEXT,
            response_body {"BYTEA" if pg else "BLOB"},
            response_truncated INTEGER
        )
        """


def _events_table(pg: bool) -> str:
    return f"""
        CREATE TABLE receipt_events (
            id {"BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY" if pg else "INTEGER PRIMARY KEY AUTOINCREMENT"},
            operation_id TEXT NOT NULL REFERENCES receipts(operation_id){" DEFERRABLE" if pg else ""},
            at TEXT NOT NULL,
            event TEXT NOT NULL,
            from_state TEXT,
            to_state TEXT NOT NULL,
            reason TEXT NOT NULL,
            actor TEXT NOT NULL,
            flow_id TEXT
        )
        """


def _events_append_only(db: Schema) -> None:
    """Triggers that refuse to change or delete an event (PostgreSQL: to truncate the table too)."""
    if db.postgres:
        db.execute(
            "CREATE FUNCTION receipt_events_append_only() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'receipt_events is append-only'; END $$"
        )
        for op in ("UPDATE", "DELETE"):
            db.execute(
                f"CREATE TRIGGER receipt_events_no_{op.lower()} BEFORE {op} ON receipt_events "
                "FOR EACH ROW EXECUTE FUNCTION receipt_events_append_only()"
            )
        db.execute(
            "CREATE TRIGGER receipt_events_no_truncate BEFORE TRUNCATE ON receipt_events "
            "FOR EACH STATEMENT EXECUTE FUNCTION receipt_events_append_only()"
        )
        return
    for op in ("UPDATE", "DELETE"):
        db.execute(
            f"CREATE TRIGGER receipt_events_no_{op.lower()} BEFORE {op} ON receipt_events "
            f"BEGIN SELECT RAISE(ABORT, 'receipt_events is append-only'); END"
        )


@migration
def m002_prunable_events_and_idempotency_keys(db: Schema) -> None:
    # Events stay append-only while their receipt exists; `prune` removes the receipt first.
    if db.postgres:
        db.execute("DROP TRIGGER receipt_events_no_delete ON receipt_events")
        db.execute(
            "CREATE FUNCTION receipt_events_delete_guard() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF EXISTS (SELECT 1 FROM receipts WHERE operation_id = OLD.operation_id) THEN "
            "RAISE EXCEPTION 'receipt_events is append-only'; END IF; RETURN OLD; END $$"
        )
        db.execute(
            "CREATE TRIGGER receipt_events_no_delete BEFORE DELETE ON receipt_events "
            "FOR EACH ROW EXECUTE FUNCTION receipt_events_delete_guard()"
        )
    else:
        db.execute("DROP TRIGGER receipt_events_no_delete")
        db.execute(
            "CREATE TRIGGER receipt_events_no_delete BEFORE DELETE ON receipt_events "
            "WHEN EXISTS (SELECT 1 FROM receipts WHERE operation_id = OLD.operation_id) "
            "BEGIN SELECT RAISE(ABORT, 'receipt_events is append-only'); END"
        )
    db.execute("ALTER TABLE receipts ADD COLUMN idempotency_key TEXT")
    db.execute("ALTER TABLE receipts ADD COLUMN client_key TEXT")
    db.execute("CREATE INDEX receipts_by_client_key ON receipts(client_key) WHERE client_key IS NOT NULL")
    db.execute("CREATE INDEX receipt_events_by_time ON receipt_events(at)")


@migration
def m003_awaiting_approval_is_unresolved(db: Schema) -> None:
    db.execute("DROP INDEX receipts_one_unresolved_per_fingerprint")
    unresolved = ", ".join(f"'{s}'" for s in sorted(UNRESOLVED))
    db.execute(
        f"CREATE UNIQUE INDEX receipts_one_unresolved_per_fingerprint "
        f"ON receipts(intent_fingerprint) WHERE state IN ({unresolved})"
    )


@migration
def m004_when_an_idempotency_key_was_first_sent(db: Schema) -> None:
    # A retry reuses its predecessor's key; an API forgets a key some time after it first saw it.
    db.execute("ALTER TABLE receipts ADD COLUMN idempotency_key_at TEXT")


@migration
def m005_raw_target(db: Schema) -> None:
    # The target as the agent sent it (redacted like `target`), when it was not the canonical
    # one that rules match and fingerprints take: `//api/./things`, `127.1`, `thing%73`.
    db.execute("ALTER TABLE receipts ADD COLUMN raw_target TEXT")


@migration
def m006_failed_reads(db: Schema) -> None:
    # A reconcile read that fails proves nothing: the receipt stays outcome_unknown, and these
    # say how many reads failed and before when no new read is tried (Retry-After, a backoff,
    # or a settle delay). Written by `transition` as the reconcile records its verdict.
    db.execute("ALTER TABLE receipts ADD COLUMN failed_reads INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE receipts ADD COLUMN next_read_at TEXT")


@migration
def m007_approval_decisions(db: Schema) -> None:
    # An operator's decision on a write held for approval, made from another process (`receipts
    # approve` / `receipts deny`) for the proxy that holds the write to apply. One per receipt
    # (the primary key): a receipt is decided once. Bound to the intent fingerprint the operator
    # decided on; `consumed_at` is set in the transaction that moves the receipt on. Portable
    # SQL: the same statement creates it in PostgreSQL (its foreign key deferrable there, for `prune`).
    db.execute(
        f"""
        CREATE TABLE approval_decisions (
            operation_id TEXT PRIMARY KEY REFERENCES receipts(operation_id){" DEFERRABLE" if db.postgres else ""},
            intent_fingerprint TEXT NOT NULL,
            decision TEXT NOT NULL CHECK (decision IN ('approved', 'denied')),
            note TEXT NOT NULL,
            actor TEXT NOT NULL,
            decided_at TEXT NOT NULL,
            consumed_at TEXT
        )
        """
    )


@migration
def m008_instance_leases(db: Schema) -> None:
    # Proxies on several machines cannot see each other's flock: on PostgreSQL each instance
    # holds a lease row it renews (a heartbeat), in the server's time, and a live instance
    # recovers the in-flight receipts of one whose lease expired. `receipt_settings` keeps a
    # check value of the fleet's HMAC key, so an instance with another key (another principal,
    # another fingerprint for the same write: duplicates unseen) refuses to start.
    # SQLite keeps its flock on files beside the database (gate/instances.py): nothing to add.
    if not db.postgres:
        return
    db.execute(
        "CREATE TABLE receipt_instances (instance TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, "
        "started_at TIMESTAMPTZ NOT NULL DEFAULT now(), heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(), "
        "expires_at TIMESTAMPTZ NOT NULL)"
    )
    db.execute("CREATE TABLE receipt_settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)")


@migration
def m009_fingerprint_versions(db: Schema) -> None:
    # Which fingerprint scheme (fingerprint.SCHEME) and which rule (a digest of what the
    # fingerprint reads of it: Operation.fingerprint_rule) made each receipt, so that a retry
    # is still recognised after an upgrade or an edited rule (intent/earlier_fingerprints.py). Receipts
    # made before have NULL in both: scheme 1 or 2, under the rule as it is now. The rules'
    # descriptions are kept once each, by digest. The partial index holds only receipts of
    # earlier schemes: a new receipt never enters it, so it costs new writes nothing.
    db.execute("ALTER TABLE receipts ADD COLUMN fingerprint_scheme INTEGER")
    db.execute("ALTER TABLE receipts ADD COLUMN fingerprint_rule TEXT")
    db.execute("CREATE TABLE fingerprint_rules (digest TEXT PRIMARY KEY, rule TEXT NOT NULL, first_seen TEXT NOT NULL)")
    db.execute(
        "CREATE INDEX receipts_of_earlier_schemes ON receipts(api, operation, fingerprint_scheme, state, updated_at) "
        "WHERE fingerprint_scheme IS NULL OR fingerprint_scheme < 3"
    )


@migration
def m010_request_lifetime(db: Schema) -> None:
    # How long the original request of a receipt may still land upstream, for a read that would
    # prove its absence (reconcile/judge.py): `upstream_timeout` is the sending proxy's
    # receipts_upstream_timeout (seconds), recorded with the receipt; `in_flight_until` is when it
    # became `submitted` plus that timeout: the latest its proxy holds the request open. A read
    # proves nothing absent before then when that proxy went silent (its receipt recovered).
    db.execute(f"ALTER TABLE receipts ADD COLUMN upstream_timeout {'DOUBLE PRECISION' if db.postgres else 'REAL'}")
    db.execute("ALTER TABLE receipts ADD COLUMN in_flight_until TEXT")


@migration
def m011_key_check_and_sealed_answers(db: Schema) -> None:
    # SQLite keeps a check value of secret.key too, as PostgreSQL has since m008 (key_check.py):
    # a proxy started with a lost or another key refuses to start instead of seeing no retry as
    # a duplicate. And a recorded answer is encrypted at rest (sealing.py): `response_encryption`
    # names the scheme of a row written so ("v1": its headers and body sealed together in
    # response_body, its status in http_status; response_status and response_headers NULL, so
    # that an earlier version finds no answer to replay); NULL is an answer recorded in clear.
    if not db.postgres:
        db.execute("CREATE TABLE receipt_settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("ALTER TABLE receipts ADD COLUMN response_encryption TEXT")


@migration
def m012_read_principal(db: Schema) -> None:
    # The principal of a write's credential headers alone, when more made its principal (a key
    # in its query, body or path: intent/caller.py): `receipts reconcile` checks that a read's headers are
    # the write's against it. NULL: the principal is that of the headers.
    db.execute("ALTER TABLE receipts ADD COLUMN read_principal TEXT")


@migration
def m013_interim_answers(db: Schema) -> None:
    # An MCP tool call whose server answered something that is not an outcome (store/rounds.py)
    # stays `submitted`, with nothing in flight: `waiting_for` says for what ("input": the server
    # asked the client for input, MCP input_required; "task": it runs the call as a task), NULL
    # otherwise. `mcp_rounds` counts the server's input_required answers; `waiting_until` is when a
    # call waiting for input is taken as abandoned. A task is kept by a keyed reference (`task_ref`,
    # the index its observed answers find it by), its id sealed (`task_sealed`, sealing.py), the
    # first characters of its id to tell it by (`task_hint`), its last seen status and its revision.
    db.execute("ALTER TABLE receipts ADD COLUMN waiting_for TEXT")
    db.execute("ALTER TABLE receipts ADD COLUMN mcp_rounds INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE receipts ADD COLUMN waiting_until TEXT")
    db.execute("ALTER TABLE receipts ADD COLUMN task_ref TEXT")
    db.execute(f"ALTER TABLE receipts ADD COLUMN task_sealed {'BYTEA' if db.postgres else 'BLOB'}")
    db.execute("ALTER TABLE receipts ADD COLUMN task_hint TEXT")
    db.execute("ALTER TABLE receipts ADD COLUMN task_status TEXT")
    db.execute("ALTER TABLE receipts ADD COLUMN task_revision TEXT")
    db.execute("CREATE INDEX receipts_by_task ON receipts(task_ref) WHERE task_ref IS NOT NULL")


@migration
def m014_approval_links(db: Schema) -> None:
    # An operator's decision binds to the rules' version it was given under (policy_version of the
    # operation when the write was held): the holding proxy applies an approval only while its
    # rules still have that version. `link` is the id of the signed link that decided
    # (gate/approval_links.py), so that the same link used again is told it was used. NULL in both:
    # a decision from the CLI (bound to the version its write was held under), or made before.
    db.execute("ALTER TABLE approval_decisions ADD COLUMN rules_version TEXT")
    db.execute("ALTER TABLE approval_decisions ADD COLUMN link TEXT")


@migration
def m015_shadow_receipts(db: Schema) -> None:
    # Observe mode (receipts_mode=observe, store/attempts.py `_observed`) sends a duplicate that enforcement
    # would have answered from an earlier receipt, as a receipt of its own: `shadow_of` names that earlier
    # receipt. Such a receipt may be unresolved beside its original, so the one-unresolved-per-intent index
    # counts only receipts that enforcement sends too (shadow_of IS NULL); decisions read an intent's
    # unresolved receipts first (attempts.py `_unresolved_first`), so a later enforced write still finds one.
    db.execute("ALTER TABLE receipts ADD COLUMN shadow_of TEXT")
    db.execute("DROP INDEX receipts_one_unresolved_per_fingerprint")
    unresolved = ", ".join(f"'{s}'" for s in sorted(UNRESOLVED))
    db.execute(
        f"CREATE UNIQUE INDEX receipts_one_unresolved_per_fingerprint "
        f"ON receipts(intent_fingerprint) WHERE state IN ({unresolved}) AND shadow_of IS NULL"
    )


@migration
def m016_budget_charges(db: Schema) -> None:
    # Effect budgets (store/budgets.py). `budget_charges`: each new receipt's share of each budget of
    # its operation, inserted with it. `budget_use`: each budget's use in a window (per principal, ""
    # for a budget per operation), kept in the same transactions as the receipts' states: raised with
    # each charge, lowered when a charged receipt becomes rejected or not_sent (it gives its share
    # back). No foreign key: a receipt pruned within its window keeps its share; `prune` deletes the
    # rows of windows that have ended. Windows are in UTC epoch seconds.
    real = "DOUBLE PRECISION" if db.postgres else "REAL"
    db.execute(
        f"""
        CREATE TABLE budget_charges (
            operation_id TEXT NOT NULL,
            budget_key TEXT NOT NULL,
            principal TEXT NOT NULL,
            amount {real} NOT NULL,
            window_start BIGINT NOT NULL,
            window_end BIGINT NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX budget_charges_by_receipt ON budget_charges(operation_id)")
    db.execute(
        f"""
        CREATE TABLE budget_use (
            budget_key TEXT NOT NULL,
            principal TEXT NOT NULL,
            window_start BIGINT NOT NULL,
            window_end BIGINT NOT NULL,
            used {real} NOT NULL,
            writes INTEGER NOT NULL,
            PRIMARY KEY (budget_key, principal, window_start)
        )
        """
    )


@migration
def m017_hash_chain(db: Schema) -> None:
    # Receipts you can prove (docs/proof.md): every event carries its position in the database's one
    # chain, the hash of the record before it and its own hash (store/hash_chain.py appends them).
    # `receipt_chain_marks` holds the chain's records that are no event: where the chain starts (this
    # migration, after the history it chains once) and the ranges `prune` removed (their last hash
    # kept, so the rest still links). `receipt_checkpoints` holds the signed checkpoints. All three
    # tables are append-only by triggers, as receipt_events is; the update trigger is lifted only
    # while this migration chains the events written before it.
    big = "BIGINT" if db.postgres else "INTEGER"
    for column, kind in (("chain_seq", big), ("prev_hash", "TEXT"), ("hash", "TEXT")):
        db.execute(f"ALTER TABLE receipt_events ADD COLUMN {column} {kind}")
    db.execute("CREATE UNIQUE INDEX receipt_events_by_chain ON receipt_events(chain_seq)")
    db.execute(
        f"CREATE TABLE receipt_chain_marks (chain_seq {big} PRIMARY KEY, through {big} NOT NULL, at TEXT NOT NULL, "
        "mark TEXT NOT NULL, detail TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL)"
    )
    db.execute("CREATE UNIQUE INDEX receipt_chain_marks_by_end ON receipt_chain_marks(through)")
    db.execute(
        f"CREATE TABLE receipt_checkpoints (size {big} PRIMARY KEY, head TEXT NOT NULL, at TEXT NOT NULL, "
        "note TEXT NOT NULL)"
    )
    for table in ("receipt_chain_marks", "receipt_checkpoints"):
        _append_only(db, table)
    chain_history(db)
    if db.postgres:  # each event chained as it is inserted (store/hash_chain.py, CHAIN_TRIGGER)
        # Its id too, under CHAIN_LOCK: from a plain sequence, as the identity's default would take one first.
        db.execute("ALTER TABLE receipt_events ALTER COLUMN id DROP IDENTITY")
        db.execute("CREATE SEQUENCE receipt_events_id_seq OWNED BY receipt_events.id")
        db.execute("SELECT setval('receipt_events_id_seq', coalesce(max(id), 0) + 1, false) FROM receipt_events")
        db.execute(CHAIN_TRIGGER)
        db.execute(
            "CREATE TRIGGER receipt_events_chained BEFORE INSERT ON receipt_events "
            "FOR EACH ROW EXECUTE FUNCTION receipt_events_chain()"
        )


@migration
def m018_trace_parent(db: Schema) -> None:
    # The W3C traceparent of the proxy's span for a new receipt (receipts_otel: gate/receipt_spans.py): a
    # later change to it (a reconcile from the CLI, a person's resolution, a lease expiry) is a span of
    # its own that links to it. Two random ids and a flag: nothing of the request. NULL: no span was made.
    db.execute("ALTER TABLE receipts ADD COLUMN trace_parent TEXT")


def _append_only(db: Schema, table: str) -> None:
    """Triggers that refuse to change or delete a row of `table` (PostgreSQL: to truncate it too)."""
    if db.postgres:
        db.execute(
            "CREATE OR REPLACE FUNCTION receipt_chain_append_only() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END $$"
        )
        for op, each in (("UPDATE", "ROW"), ("DELETE", "ROW"), ("TRUNCATE", "STATEMENT")):
            db.execute(
                f"CREATE TRIGGER {table}_no_{op.lower()} BEFORE {op} ON {table} "
                f"FOR EACH {each} EXECUTE FUNCTION receipt_chain_append_only()"
            )
        return
    for op in ("UPDATE", "DELETE"):
        db.execute(
            f"CREATE TRIGGER {table}_no_{op.lower()} BEFORE {op} ON {table} "
            f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
        )
