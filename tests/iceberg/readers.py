"""Independent readers of an Iceberg table, for the tests' checks: PyIceberg's own scan and
DuckDB's ``iceberg_scan`` of the table's current metadata file. Neither goes through
sparkonce: they read what the catalog points at, as any engine would."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse


def pyiceberg_values(catalog: Any, table: str, column: str = "value") -> list[int]:
    return sorted(catalog.load_table(table).scan().to_arrow().column(column).to_pylist())


def duckdb_values(catalog: Any, table: str, column: str = "value") -> list[int]:
    import duckdb  # the dev extras' reader: a missing one is an error, never a skip
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    location = catalog.load_table(table).metadata_location
    con = duckdb.connect()
    try:
        for mod in (duckdb_extension_avro, duckdb_extension_iceberg):
            con.sql(f"LOAD '{next(Path(mod.__file__).parent.glob('**/*.duckdb_extension'))}'")
        got = con.sql(f"SELECT {column} FROM iceberg_scan('{location}')").fetchall()
    finally:
        con.close()
    return sorted(r[0] for r in got)


def assert_each_value_once(catalog: Any, table: str, expected: list[int]) -> None:
    """Both readers see exactly ``expected`` (each value once)."""
    want = sorted(expected)
    for reader in (pyiceberg_values, duckdb_values):
        got = reader(catalog, table)
        twice = sorted(v for v, n in Counter(got).items() if n > 1)
        assert not twice, f"{reader.__name__}: values seen more than once: {twice[:10]}"
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        assert got == want, f"{reader.__name__}: missing {missing[:10]}, extra {extra[:10]}"


def referenced_files(catalog: Any, table: str) -> set[Path]:
    """The data files of the table's current snapshot, as local paths."""
    t = catalog.load_table(table)
    return {Path(unquote(urlparse(task.file.file_path).path)) for task in t.scan().plan_files()}


def pyiceberg_rows(catalog: Any, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    got = catalog.load_table(table).scan(selected_fields=tuple(columns)).to_arrow()
    return sorted(zip(*(got.column(c).to_pylist() for c in columns), strict=True))


def duckdb_rows(catalog: Any, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    location = catalog.load_table(table).metadata_location
    con = duckdb.connect()
    try:
        for mod in (duckdb_extension_avro, duckdb_extension_iceberg):
            con.sql(f"LOAD '{next(Path(mod.__file__).parent.glob('**/*.duckdb_extension'))}'")
        cols = ", ".join(f'"{c}"' for c in columns)
        got = con.sql(f"SELECT {cols} FROM iceberg_scan('{location}')").fetchall()
    finally:
        con.close()
    return sorted(tuple(r) for r in got)


def assert_rows(
    catalog: Any, table: str, columns: list[str], expected: list[tuple[Any, ...]]
) -> None:
    """Both readers see exactly the rows ``expected`` (projected on ``columns``)."""
    want = sorted(expected)
    for reader in (pyiceberg_rows, duckdb_rows):
        got = reader(catalog, table, columns)
        missing = sorted(set(want) - set(got))[:10]
        extra = sorted(set(got) - set(want))[:10]
        assert got == want, f"{reader.__name__}: {len(got)} rows, missing {missing}, extra {extra}"
