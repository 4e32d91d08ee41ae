"""Write two small streaming checkpoints with the installed PySpark (see README.md here)."""

import shutil
import sys
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

out = sys.argv[1]


def count(batch: DataFrame, batch_id: int) -> None:
    batch.count()


spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.sql.shuffle.partitions", "1")
    .config("spark.ui.enabled", "false")
    .getOrCreate()
)
for name, stateful in (("stateless", False), ("stateful", True)):
    ck = f"{out}/{name}"
    shutil.rmtree(ck, ignore_errors=True)
    df = spark.readStream.format("rate").option("rowsPerSecond", 5).option("numPartitions", 1)
    rows = df.load()
    if stateful:
        rows = rows.groupBy((F.col("value") % 2).alias("k")).count()
    q = (
        rows.writeStream.foreachBatch(count)
        .outputMode("update" if stateful else "append")
        .option("checkpointLocation", ck)
        .trigger(processingTime="1 second")
        .start()
    )
    while q.lastProgress is None or q.lastProgress["batchId"] < 3:
        time.sleep(0.5)
    q.stop()
print(spark.version)
