#!/usr/bin/env bash
# A larger `sparkonce verify` campaign over Kafka (Kafka -> Kafka, copy pipeline), on a
# throwaway broker started from the pinned jars. The report lands in
# benchmarks/results/kafka-campaign.json.
#
#   bash scripts/kafka-campaign.sh [TRIALS]      (default 12)
set -euo pipefail
cd "$(dirname "$0")/.."
TRIALS="${1:-12}"
SEED="${SPARKONCE_CAMPAIGN_SEED:-7}"
WORK=.cache/kafka-campaign
PY=.venv/bin/python
rm -rf "$WORK"
mkdir -p "$WORK/out" benchmarks/results
BOOT=$($PY -m tests.services.kafka start .services/kafka-campaign | tail -1)
trap '$PY -m tests.services.kafka stop .services/kafka-campaign' EXIT
.venv/bin/sparkonce kafka create "$BOOT" kc-in --partitions 3
.venv/bin/sparkonce kafka create "$BOOT" kc-out --partitions 3
seq 1 1800 | awk '{print "k" ($1 % 9) "\t" $1}' |
  .venv/bin/sparkonce kafka produce "$BOOT" kc-in --separator "$(printf '\t')"
cat > "$WORK/pipeline.py" <<PIPE
from pyspark.sql import functions as F
from sparkonce import KafkaSink, KafkaSource, Pipeline

def copy(df):
    return df.select(
        F.col("record_id").alias("key"),
        F.concat_ws("/", F.col("partition").cast("string"), F.col("value").cast("string")).alias("value"),
    )

pipeline = Pipeline(
    name="kafka-campaign",
    source=KafkaSource("$BOOT", "kc-in", max_records_per_partition=150),
    transform=copy,
    sink=KafkaSink("$BOOT", "kc-out"),
    checkpoint="$PWD/$WORK/checkpoint",
)
PIPE
PYSPARK_PYTHON="$PWD/$PY" .venv/bin/sparkonce verify "$WORK/pipeline.py" --trials "$TRIALS" \
  --seed "$SEED" --out "$WORK/out"
cp "$WORK/out/verify.json" benchmarks/results/kafka-campaign.json
