#!/usr/bin/env bash
# A long, resumable `sparkonce verify` campaign on a stateful pipeline (per-key sums,
# embedded log -> SQLite). Each call runs the trials not yet in the report; the report is
# kept in benchmarks/results/verify-campaign.json so a campaign can span sessions.
# Trials run two at a time, each on its own SQLite store (on 2 cores this is about 1.8x
# the trials per hour of one at a time); SPARKONCE_CAMPAIGN_STORES changes the count.
#
#   bash scripts/verify-campaign.sh [TRIALS] [VERIFY OPTIONS...]   (default 1000)
#
# Kills are planned on the oracle time recorded in the report; add --retime-oracle to
# measure it again (only on an otherwise quiet machine: load makes it too long).
#
# SPARKONCE_CAMPAIGN_NAME names another report (benchmarks/results/NAME.json, working copy in
# .cache/NAME). The recovery measurement runs one trial at a time, as its oracle does:
#   SPARKONCE_CAMPAIGN_NAME=verify-recovery SPARKONCE_CAMPAIGN_STORES=1 \
#     bash scripts/verify-campaign.sh 15 --faults kill,crash-point,zombie
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/campaign-lib.sh
NAME="${SPARKONCE_CAMPAIGN_NAME:-verify-campaign}"
WORK=".cache/$NAME"
STORES="${SPARKONCE_CAMPAIGN_STORES:-2}"
mkdir -p "$WORK"
if [ ! -f "$WORK/log/events.db" ]; then
  .venv/bin/sparkonce log create "$WORK/log" events --partitions 3
  seq 1 1200 | awk '{print "k" ($1 % 6) "\t" $1}' |
    .venv/bin/sparkonce log produce "$WORK/log" events --separator "$(printf '\t')"
fi
cat > "$WORK/pipeline.py" <<PIPE
from pyspark.sql import functions as F
from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink

def sums(df):
    v = df.select(F.col("key").cast("string").alias("key"),
                  F.col("value").cast("string").cast("long").alias("value"))
    return v.groupBy("key").agg(F.sum("value").alias("total"), F.count("*").alias("n"))

pipeline = Pipeline(
    name="campaign",
    source=EmbeddedLogSource("$PWD/$WORK/log", "events", max_records_per_partition=200),
    transform=sums,
    sink=SQLiteSink("sqlite:///$PWD/$WORK/sink.db", "sums", mode="upsert", keys=["key"]),
    checkpoint="$PWD/$WORK/checkpoint",
)
PIPE
SINKS=(--sink "sqlite:///$PWD/$WORK/sink.db")
for i in $(seq 2 "$STORES"); do SINKS+=(--sink "sqlite:///$PWD/$WORK/sink$i.db"); done
resumable_campaign "$NAME" "${1:-1000}" "$WORK/pipeline.py" "${SINKS[@]}" -- "${@:2}"
