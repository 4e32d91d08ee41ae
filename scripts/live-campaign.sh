#!/usr/bin/env bash
# Issue 39's live-reader campaigns: `sparkonce verify` on one sink family, with its live readers
# on (a reader polls the store during every trial and checks each observation for aborted
# reads, duplicates, torn batches and rows that disappear). One pipeline per family, 1,200
# records in 4 batches (1,800 in 6 for Kafka), one trial at a time. Resumable: each call runs
# the trials not yet in benchmarks/results/verify-live-FAMILY.json, so a 50-trial campaign can
# span sessions (its store's server keeps its data in .services/, its input in .cache/).
#
#   bash scripts/live-campaign.sh FAMILY [TRIALS] [VERIFY OPTIONS...]
#       FAMILY: sqlite, postgres, twophase, kafka or delta; TRIALS: the total wanted (default 50)
#
# To stop a campaign between sessions, SIGTERM its `sparkonce verify` process (not this
# script): verify kills the running trial's drivers and exits 143, and the script copies the
# report (every finished trial) and stops the store's server.
#
# Faults: verify's five kinds (kill, crash-point, task-failure, db-drop, zombie); Kafka has no
# database to drop, so its campaign runs the other four. SPARKONCE_CAMPAIGN_SEED overrides the
# family's seed.
#
# SPARKONCE_CAMPAIGN_CONNECT=1: the same campaign on Spark Connect sessions (issue 46): every
# trial driver starts a Connect server of its own and runs as its client
# (`sparkonce verify --remote local[2]`). Injected task failures do not exist there, so
# task-failure is left out. Its report is benchmarks/results/verify-connect-FAMILY.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/campaign-lib.sh  # PYTHONPATH: test this checkout
FAMILY="${1:?usage: $0 sqlite|postgres|twophase|kafka|delta [TRIALS] [VERIFY OPTIONS...]}"
TRIALS="${2:-50}"
NAME="verify-live-$FAMILY"
REMOTE=()
if [ "${SPARKONCE_CAMPAIGN_CONNECT:-}" = 1 ]; then
  NAME="verify-connect-$FAMILY"
  REMOTE=(--remote "local[2]")
fi
WORK=".cache/$NAME"
SERVICES=".services/$NAME"
PY=.venv/bin/python
mkdir -p "$WORK"
case "$FAMILY" in
  sqlite) SEED=1 ;; postgres) SEED=2 ;; twophase) SEED=3 ;; delta) SEED=4 ;; kafka) SEED=7 ;;
  *) echo "error: unknown family '$FAMILY' (sqlite, postgres, twophase, kafka or delta)" >&2; exit 2 ;;
esac
export SPARKONCE_CAMPAIGN_SEED="${SPARKONCE_CAMPAIGN_SEED:-$SEED}"
FAULTS=()

# The input: an embedded log of 1,200 records over 3 partitions (made once).
if [ "$FAMILY" != kafka ] && [ ! -f "$WORK/log/events.db" ]; then
  .venv/bin/sparkonce log create "$WORK/log" events --partitions 3
  seq 1 1200 | awk '{print "k" ($1 % 6) "\t" $1}' |
    .venv/bin/sparkonce log produce "$WORK/log" events --separator "$(printf '\t')"
fi
SOURCE="EmbeddedLogSource(\"$PWD/$WORK/log\", \"events\", max_records_per_partition=100)"
TRANSFORM='df.select("record_id", F.col("key").cast("string").alias("key"), F.col("value").cast("string").cast("long").alias("value"))'

case "$FAMILY" in
  sqlite)
    SINK="SQLiteSink(\"sqlite:///$PWD/$WORK/sink.db\", \"events_out\")" ;;
  postgres | twophase)
    bash scripts/ensure-postgres.sh
    URL=$($PY -m tests.services.postgres start "$SERVICES" | tail -1)
    trap '$PY -m tests.services.postgres stop "$SERVICES"' EXIT
    if [ "$FAMILY" = postgres ]; then
      SINK="PostgresSink(\"$URL\", \"events_out\")"
    else
      SINK="PostgresTwoPhaseSink(\"$URL\", \"events_2pc\")"
    fi ;;
  delta)
    SINK="DeltaSink(\"$PWD/$WORK/tables\", table=\"events\")" ;;
  kafka)
    BOOT=$($PY -m tests.services.kafka start "$SERVICES" | tail -1)
    trap '$PY -m tests.services.kafka stop "$SERVICES"' EXIT
    if [ ! -f "$SERVICES/.topics-made" ]; then  # the broker keeps them across calls
      .venv/bin/sparkonce kafka create "$BOOT" kc-in --partitions 3
      .venv/bin/sparkonce kafka create "$BOOT" kc-out --partitions 3
      seq 1 1800 | awk '{print "k" ($1 % 9) "\t" $1}' |
        .venv/bin/sparkonce kafka produce "$BOOT" kc-in --separator "$(printf '\t')"
      touch "$SERVICES/.topics-made"
    fi
    SOURCE="KafkaSource(\"$BOOT\", \"kc-in\", max_records_per_partition=150)"
    SINK="KafkaSink(\"$BOOT\", \"kc-out\")"
    TRANSFORM='df.select(F.col("record_id").alias("key"), F.concat_ws("/", F.col("partition").cast("string"), F.col("value").cast("string")).alias("value"))'
    FAULTS=(--faults kill,crash-point,task-failure,zombie)
    if [ ${#REMOTE[@]} -gt 0 ]; then FAULTS=(--faults kill,crash-point,zombie); fi ;;
esac

cat > "$WORK/pipeline.py" <<PIPE
from pyspark.sql import functions as F
from sparkonce import (
    DeltaSink,
    EmbeddedLogSource,
    KafkaSink,
    KafkaSource,
    Pipeline,
    PostgresSink,
    PostgresTwoPhaseSink,
    SQLiteSink,
)


def transform(df):
    return $TRANSFORM


pipeline = Pipeline(
    name="$NAME",
    source=$SOURCE,
    transform=transform,
    sink=$SINK,
    checkpoint="$PWD/$WORK/checkpoint",
)
PIPE

# A report of another pipeline (an earlier hand-made one) is not resumed: it is replaced.
# This script's pipelines are known by their name, not by their file's path: a report made in
# another checkout (another session's work tree) is resumed.
RESULT="benchmarks/results/$NAME.json"
if [ -f "$RESULT" ] && [ ! -f "$WORK/out/verify.json" ] &&
  [ "$($PY -c 'import json, sys; print(json.load(open(sys.argv[1])).get("pipeline"))' "$RESULT")" != "$NAME" ]; then
  echo "$RESULT is another pipeline's report: starting this campaign afresh" >&2
  mkdir -p "$WORK/out"
  rm -f "$WORK/out/verify.json"
  mv "$RESULT" "$WORK/replaced-report.json"
fi
resumable_campaign "$NAME" "$TRIALS" "$WORK/pipeline.py" -- "${FAULTS[@]}" "${REMOTE[@]}" "${@:3}"
