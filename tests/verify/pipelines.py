"""The start every pipeline file these tests write shares: the test folder on ``sys.path``
(for the planted sinks, ``broken_*.py``) and ``copy``, the transform that keeps each
record as one row. Format it with ``here``, then add the imports and the pipeline."""

PREAMBLE = """
import sys
sys.path.insert(0, {here!r})
from pyspark.sql import functions as F

def copy(df):
    return df.select(
        "record_id",
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
    )
"""
