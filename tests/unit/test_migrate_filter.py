"""statepact's Alembic lineage without a server: ids, the autogenerate filter, offline SQL.

- Revision ids carry statepact's name and the base the branch label, so none
  can be an application's; the ids of earlier releases map onto shipped ones.
- ``AutogenerateFilter`` hides statepact's objects (tables, their parts, the
  version table, the sequence, the functions) and nothing else, in the default
  schema and in ``db_schema``.
- ``upgrade_sql`` / ``downgrade_sql`` render scripts with no database at all.
- ``upgrade_from_env`` outside a running environment says where it belongs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from statepact.storage.postgres import migrate
from statepact.storage.postgres.migrate import AutogenerateFilter
from statepact.storage.postgres.schema import StateTables, metadata

OWN = sorted(metadata.tables)


def test_every_revision_id_carries_statepact_s_name() -> None:
    """ids are statepact_NNNN, in order, file names start with them, and the base carries the
    branch label so `statepact@head` is the head."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrate.alembic_config())
    shipped = list(migrate.revisions())
    assert shipped == [f"statepact_{n:04d}" for n in range(1, len(shipped) + 1)]
    base = script.get_revision(shipped[0])
    assert base is not None
    assert base.branch_labels == {migrate.BRANCH_LABEL}
    assert script.get_revision(f"{migrate.BRANCH_LABEL}@head").revision == migrate.head()
    for revision in script.walk_revisions():
        assert Path(revision.path).name.startswith(f"{revision.revision}_")


def test_earlier_releases_ids_map_onto_shipped_revisions() -> None:
    """0001-0003 (releases before the prefix) name shipped revisions; anything else is kept."""
    shipped = set(migrate.revisions())
    assert set(migrate.LEGACY_REVISIONS.values()) <= shipped
    assert migrate.canonical_revision("0002") == "statepact_0002"
    assert migrate.canonical_revision("head") == "head"
    assert migrate.canonical_revision(None) is None
    assert migrate._revision_argument("0002:head") == "statepact_0002:head"
    with pytest.raises(ValueError, match="revision"):
        migrate._revision_argument("")


@pytest.mark.parametrize("table", [*OWN, migrate.VERSION_TABLE])
def test_include_name_hides_each_statepact_table_and_its_parts(table: str) -> None:
    """A table of statepact's, its columns, indexes and constraints: not the app's."""
    default = {"schema_name": None}
    assert migrate.include_name(table, "table", default) is False
    for part in ("column", "index", "unique_constraint", "foreign_key_constraint"):
        parent = {"schema_name": None, "table_name": table}
        assert migrate.include_name("anything", part, parent) is False


def test_include_name_keeps_everything_else() -> None:
    """The app's tables and their parts, schemas, and names statepact does not own pass."""
    assert migrate.include_name("orders", "table", {"schema_name": None}) is True
    assert migrate.include_name("id", "column", {"schema_name": None, "table_name": "orders"})
    assert migrate.include_name("public", "schema", {}) is True
    assert migrate.include_name("alembic_version", "table", {"schema_name": None}) is True
    assert migrate.include_name("adk_runs_archive", "table", {"schema_name": None}) is True


def test_the_sequence_and_functions_are_hidden_from_extensions() -> None:
    """Extensions that compare sequences or functions pass them through the same hooks."""
    for name in ("adk_work_token_seq", "statepact_commit", "statepact_try_lock"):
        kind = "sequence" if name.endswith("_seq") else "function"
        assert migrate.include_name(name, kind, {"schema_name": None}) is False
        assert migrate.include_object(object(), name, kind, True, None) is False
    assert migrate.include_name("app_function", "function", {"schema_name": None}) is True


def test_db_schema_and_custom_names_are_respected() -> None:
    """With db_schema and StateTables names, those are hidden there; another schema's
    same-named table is the app's."""
    names = StateTables(runs="agent_runs", work="agent_work")
    own = AutogenerateFilter(tables=names, db_schema="agents")
    assert own.include_name("agent_runs", "table", {"schema_name": "agents"}) is False
    assert own.include_name("agent_work_token_seq", "sequence", {"schema_name": "agents"}) is False
    assert own.include_name("statepact_values", "table", {"schema_name": "agents"}) is False
    assert own.include_name("agent_runs", "table", {"schema_name": None}) is False
    assert own.include_name("agent_runs", "table", {"schema_name": "billing"}) is True
    # The default filter knows nothing of a schema it was not given.
    assert migrate.include_name("adk_runs", "table", {"schema_name": "agents"}) is True
    assert own.include_name("orders", "table", {"schema_name": "agents"}) is True
    assert "agents" in repr(own)


def test_include_object_on_tables_and_indexes() -> None:
    """include_object reads the object's (or its table's) name and schema."""
    app = sa.MetaData()
    orders = sa.Table("orders", app, sa.Column("id", sa.Integer, primary_key=True))
    orders_ix = sa.Index("ix_orders_id", orders.c.id)
    assert migrate.include_object(orders, "orders", "table", True, None) is True
    assert migrate.include_object(orders_ix, "ix_orders_id", "index", True, None) is True
    runs = metadata.tables["adk_runs"]
    assert migrate.include_object(runs, "adk_runs", "table", True, None) is False
    (index, *_) = sorted(runs.indexes, key=lambda ix: str(ix.name))
    assert migrate.include_object(index, index.name, "index", True, None) is False
    assert migrate.include_object(runs.c.tenant, "tenant", "column", True, None) is False
    reflected = sa.MetaData()
    elsewhere = sa.Table("adk_runs", reflected, sa.Column("x", sa.Integer), schema="billing")
    assert migrate.include_object(elsewhere, "adk_runs", "table", True, None) is True


def test_upgrade_sql_and_downgrade_sql_need_no_database() -> None:
    """The scripts render from the revisions alone: one transaction, the lock, every table."""
    script = migrate.upgrade_sql()
    assert script.startswith("BEGIN;")
    assert script.rstrip().endswith("COMMIT;")
    assert f"CREATE TABLE {migrate.VERSION_TABLE}" in script
    for table in OWN:
        assert f"CREATE TABLE {table} " in script, table
    assert f"'{migrate.head()}'" in script
    back = migrate.downgrade_sql("base")
    for table in OWN:
        assert f"DROP TABLE {table};" in back, table
    assert migrate.downgrade_sql("statepact_0003:statepact_0002").count("DROP TABLE") == 1
    from statepact.errors import SchemaVersionError

    with pytest.raises(SchemaVersionError, match="nope"):
        migrate.upgrade_sql("nope")


def test_upgrade_from_env_outside_an_environment_says_where_it_belongs() -> None:
    """Called from plain code, it refuses and points at migrate.upgrade()."""
    with pytest.raises(RuntimeError, match=r"env\.py"):
        migrate.upgrade_from_env()
