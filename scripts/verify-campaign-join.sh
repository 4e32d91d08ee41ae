#!/usr/bin/env bash
# A long, resumable `sparkonce verify` campaign on a pipeline with several sources: the
# stream-stream join of two Kafka topics (orders LEFT OUTER JOIN payments, watermarked, in
# append mode; tests/kafka/orders_payments.py has the join, its input and its plain-Python
# oracle) into SQLite. The three data batches and the join's own no-data batch (which
# emits the unmatched orders) all go through the commit protocol under every fault.
#
#   bash scripts/verify-campaign-join.sh [TRIALS] [VERIFY OPTIONS...]   (default 50)
#
# A throwaway broker (a new data directory) is started from the pinned jars for each call
# and stopped at its end; the input is produced again, identically (the same records at the same offsets), so a
# later call resumes the report in benchmarks/results/verify-join.json. Trials run two at
# a time, each on its own SQLite store (SPARKONCE_CAMPAIGN_STORES changes the count); both
# read the same topics. db-drop applies (SQLite), so the default fault kinds all run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/campaign-lib.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the pipeline imports tests.kafka
NAME=verify-join
WORK="$PWD/.cache/$NAME"
PY=.venv/bin/python
mkdir -p "$WORK"
# A new broker each call: one left from an earlier call holds the topics already, and
# producing into them again would double the input (the report would no longer resume).
rm -rf ".services/$NAME"
BOOT=$($PY -m tests.services.kafka start ".services/$NAME" | tail -1)
trap '$PY -m tests.services.kafka stop ".services/$NAME"' EXIT
for topic in orders payments; do
  .venv/bin/sparkonce kafka create "$BOOT" "$topic" --partitions 2
done
$PY -c "from tests.kafka.orders_payments import produce; produce('$BOOT', 'orders', 'payments', 2)"
cat > "$WORK/pipeline.py" <<PIPE
"""Orders joined with payments, two Kafka topics (scripts/verify-campaign-join.sh)."""
from sparkonce import KafkaSource, Pipeline, SQLiteSink
from tests.kafka.orders_payments import join

pipeline = Pipeline(
    name="verify-join",
    sources={
        "orders": KafkaSource("$BOOT", "orders", value_format="utf8",
                              max_records_per_partition=40),
        "payments": KafkaSource("$BOOT", "payments", value_format="utf8",
                                max_records_per_partition=40),
    },
    transform=join,
    sink=SQLiteSink("sqlite:///$WORK/joined.db", "joined"),
    checkpoint="$WORK/checkpoint",
    output_mode="append",
)
PIPE
SINKS=()
for i in $(seq 1 "${SPARKONCE_CAMPAIGN_STORES:-2}"); do SINKS+=(--sink "sqlite:///$WORK/store$i.db"); done
resumable_campaign "$NAME" "${1:-50}" "$WORK/pipeline.py" "${SINKS[@]}" -- "${@:2}"
