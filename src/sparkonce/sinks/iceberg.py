"""Apache Iceberg sink (first slice): append mode, rows staged on the driver.

**Guarantee (DESIGN.md section 1): effectively-once**, on the SQL catalog (SQLite and
PostgreSQL, tested): every input record of the pipeline's source is in the table
exactly once after any crash, retry or restart, provided only sparkonce commits this
pipeline (other writers may append to the table: their rows are theirs). Each batch is
one Iceberg snapshot, committed through the catalog's atomic swap of the table's
metadata together with the pipeline's ledger (see :mod:`sparkonce.ledger.iceberg`).
Other catalogs (REST, Glue, Hive...) are not tested and not supported by this slice:
the ledger's check is a requirement that PyIceberg's SQL catalog validates in-process.

What this slice does not do yet: rows written by Spark's tasks as Parquet files (the
batch is collected to the driver as an Arrow table and appended by PyIceberg), upsert
mode, and Spark pipelines end to end are not tested.

``catalog``: a PyIceberg catalog (``pyiceberg.catalog.sql.SqlCatalog``); ``table``:
``"namespace.name"``. The table is created from the batch schema on first use when it
does not exist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from sparkonce.commit.base import Staged, Stager
from sparkonce.config import Guarantee, OutputMode
from sparkonce.errors import ConfigError
from sparkonce.ledger.iceberg import IcebergLedgerStore
from sparkonce.sinks.base import TransactionalSink

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from sparkonce.ledger.base import BatchContext


def _plain(t: Any) -> Any:
    """An Arrow type with large/small string and binary variants made one."""
    import pyarrow as pa

    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    return t


def check_schema(batch: pa.Schema, table: pa.Schema, where: str) -> None:
    """Raise ConfigError unless ``batch`` has ``table``'s columns with the same types."""
    mine = {f.name: f.type for f in batch}
    theirs = {f.name: f.type for f in table}
    for name, t in mine.items():
        if name not in theirs:
            raise ConfigError(
                f"column {name!r} ({t}) of the batch is not in {where} (its columns: "
                f"{', '.join(theirs)}). Add it to the table, or drop it from the output."
            )
        if _plain(t) != _plain(theirs[name]):
            raise ConfigError(
                f"column {name!r} is {t} in the batch but {theirs[name]} in {where}. "
                "Cast it in the pipeline's transform, or change the table's column type."
            )
    missing = [n for n in theirs if n not in mine]
    if missing:
        raise ConfigError(
            f"{where} has columns the batch lacks: {', '.join(missing)}. Add them to the "
            "pipeline's output (or make them optional and drop them from the table)."
        )


class IcebergStager(Stager):
    """The batch collected on the driver as an Arrow table, appended at the commit."""

    stages_on_driver = True

    def __init__(self, store: IcebergLedgerStore) -> None:
        self.store = store

    def prepare(self, ctx: BatchContext, df: DataFrame, seq: int) -> Staged:
        return self._staged(df.toArrow())

    def prepare_arrow(
        self, ctx: BatchContext, table: pa.Table, schema: StructType | None, seq: int
    ) -> Staged:
        return self._staged(table)

    def _staged(self, table: pa.Table) -> Staged:
        if self.store.schema is None:
            self.store.schema = table.schema
        target = self.store.load()
        check_schema(table.schema, target.schema().as_arrow(), self.store.describe())
        return Staged(rows=table.num_rows, payload=table)

    def publish(self, txn: Any, ctx: BatchContext, staged: Staged) -> None:
        txn.data = staged.payload


class IcebergSink(TransactionalSink):
    """Effectively-once sink into an Apache Iceberg table (see the module docstring)."""

    guarantee: ClassVar[Guarantee] = "effectively-once"
    store: IcebergLedgerStore
    stager: IcebergStager

    def __init__(self, catalog: Any, table: str, *, mode: str = "append") -> None:
        if mode != "append":
            raise ConfigError(
                f"IcebergSink mode {mode!r} is not supported yet: only mode='append'."
            )
        if not table or "." not in table:
            raise ConfigError(f"IcebergSink needs the table as 'namespace.name', got {table!r}.")
        self.catalog = catalog
        self.table = table
        self.store = IcebergLedgerStore(catalog, table)
        self.stager = IcebergStager(self.store)

    def validate(self, schema: StructType, output_mode: OutputMode = "append") -> None:
        """Check (or, for a new table, take) the output schema before the epoch."""
        from pyspark.sql.pandas.types import to_arrow_schema

        self.validate_arrow(to_arrow_schema(schema))

    def validate_arrow(self, schema: pa.Schema) -> None:
        """:meth:`validate` for an Arrow schema: a ConfigError names the column."""
        if self.store.schema is None:
            self.store.schema = schema
        target = self.store.load()
        check_schema(schema, target.schema().as_arrow(), self.describe())

    def describe(self) -> str:
        return f"IcebergSink({self.store.describe()} in catalog {self.catalog.name!r})"
