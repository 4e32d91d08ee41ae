#!/usr/bin/env bash
# A larger `sparkonce verify` campaign over Kafka (Kafka -> Kafka, copy pipeline), on a
# throwaway broker started from the pinned jars. The report lands in
# benchmarks/results/kafka-campaign.json. The reader "spark" reads with Spark's own Kafka
# connector (SparkKafkaSource) instead of KafkaSource, into the same KafkaSink; its report
# goes to benchmarks/results/kafka-campaign-spark-reader.json.
#
#   bash scripts/kafka-campaign.sh [TRIALS] [READER] [VERIFY OPTIONS...]  (default 12, "sparkonce")
#
# SPARKONCE_CAMPAIGN_NAME names another report (benchmarks/results/NAME.json); e.g. the
# recovery measurement: SPARKONCE_CAMPAIGN_NAME=verify-recovery-kafka \
#   bash scripts/kafka-campaign.sh 12 sparkonce --faults kill,crash-point,zombie
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/campaign-lib.sh  # PYTHONPATH: test this checkout
TRIALS="${1:-12}"
READER="${2:-sparkonce}"
case "$READER" in
  sparkonce) NAME=kafka-campaign ;;
  spark) NAME=kafka-campaign-spark-reader ;;
  *) echo "usage: $0 [TRIALS] [sparkonce|spark] [VERIFY OPTIONS...]" >&2; exit 2 ;;
esac
NAME="${SPARKONCE_CAMPAIGN_NAME:-$NAME}"
SEED="${SPARKONCE_CAMPAIGN_SEED:-7}"
WORK=.cache/$NAME
PY=.venv/bin/python
rm -rf "$WORK"
mkdir -p "$WORK/out" benchmarks/results
BOOT=$($PY -m tests.services.kafka start .services/$NAME | tail -1)
trap '$PY -m tests.services.kafka stop .services/$NAME' EXIT
# 1,800 records over 3 partitions, 150 per partition per batch: 4 batches.
if [ "$READER" = spark ]; then
  SOURCE="SparkKafkaSource(\"$BOOT\", \"kc-in\", max_records_per_batch=450)"
else
  SOURCE="KafkaSource(\"$BOOT\", \"kc-in\", max_records_per_partition=150)"
fi
SINK="KafkaSink(\"$BOOT\", \"kc-out\")"
.venv/bin/sparkonce kafka create "$BOOT" kc-in --partitions 3
.venv/bin/sparkonce kafka create "$BOOT" kc-out --partitions 3
seq 1 1800 | awk '{print "k" ($1 % 9) "\t" $1}' |
  .venv/bin/sparkonce kafka produce "$BOOT" kc-in --separator "$(printf '\t')"
cat > "$WORK/pipeline.py" <<PIPE
from pyspark.sql import functions as F
from sparkonce import KafkaSink, KafkaSource, Pipeline, SparkKafkaSource, sink_from_url

def copy(df):
    return df.select(
        F.col("record_id").alias("key"),
        F.concat_ws("/", F.col("partition").cast("string"), F.col("value").cast("string")).alias("value"),
    )

pipeline = Pipeline(
    name="kafka-campaign",
    source=$SOURCE,
    transform=copy,
    sink=$SINK,
    checkpoint="$PWD/$WORK/checkpoint",
)
PIPE
PYSPARK_PYTHON="$PWD/$PY" .venv/bin/sparkonce verify "$WORK/pipeline.py" --trials "$TRIALS" \
  --seed "$SEED" --out "$WORK/out" "${@:3}"
cp "$WORK/out/verify.json" "benchmarks/results/$NAME.json"
if [ -f "$WORK/out/recovery.png" ]; then cp "$WORK/out/recovery.png" "benchmarks/results/$NAME.png"; fi
