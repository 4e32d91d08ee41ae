# Two commands a user needs: `make demo` and `make test`. Everything else is a helper.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Our own runs install the exact versions of the lock (the wheel itself declares ranges, in
# pyproject.toml). `make lock` brings it up to date with pyproject.toml, keeping every
# version it can; `make lock UPGRADE=1` moves everything to the newest the ranges allow.
LOCK := requirements/lock.txt

.PHONY: demo test test-crash setup lock lint unit bench jars pg-start pg-stop kafka-start kafka-stop clean docs-serve

setup: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	@$(PYTHON) -c "import sys; assert sys.version_info[:2] == (3, 11), sys.version" || { echo "error: Python 3.11 is needed (set PYTHON=...)" >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c $(LOCK) -e ".[dev]"
	@# Byte-compile the installed packages: with PYTHONDONTWRITEBYTECODE set, nothing writes
	@# .pyc files, and every driver and Spark Python worker would recompile pandas, pyspark
	@# and numpy on start (about 2.5 s each here).
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null || true  # an optimisation only
	touch $(STAMP)

# The lock of our runs (Python 3.11, every extra), and the two ends of the ranges that the
# compatibility check installs (tests/packaging/test_compat.py): the lowest version of each
# direct requirement on Python 3.11, the newest on 3.13. uv resolves each.
lock: setup
	$(VENV)/bin/uv pip compile --quiet pyproject.toml --all-extras --python-version 3.11.7 \
		$(if $(UPGRADE),--upgrade) --output-file $(LOCK)
	$(VENV)/bin/uv pip compile --quiet pyproject.toml --extra postgres --extra kafka \
		--python-version 3.11.7 --resolution lowest-direct --output-file requirements/oldest.txt
	$(VENV)/bin/uv pip compile --quiet pyproject.toml --extra postgres --extra kafka \
		--python-version 3.13 $(if $(UPGRADE),--upgrade) --output-file requirements/newest-py313.txt

demo: setup
	PYSPARK_PYTHON=$(abspath $(PY)) $(VENV)/bin/sparkonce demo

# The docs site is built with --strict (a broken link, a missing page or API object fails),
# into a temp directory, never into the repository.
lint: setup
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir $(or $(TMPDIR),/tmp)/sparkonce-site

# Preview the docs site at http://127.0.0.1:8000/, rebuilt on every change.
docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# The tests start a throwaway PostgreSQL cluster, a single-node KRaft Kafka broker and an
# S3-compatible server (moto, from the dev extras) on 127.0.0.1 themselves (tests/services/);
# this only makes sure the PostgreSQL binaries and the pinned jars (Maven Central, cached in
# .cache/jars) are there, and Debian's Chromium, which the `sparkonce ui` browser tests drive
# headless (tests/ui).
#
# Three lanes, chosen by markers (pyproject.toml); every test is in exactly one:
#   make test           everything unmarked: unit, simulation, Spark, PostgreSQL and Kafka
#                       integration, one real-driver crash scenario per sink family (each
#                       fault kind once) and one `sparkonce verify` run; on two pytest-xdist
#                       workers (a file's tests on one), the other lanes on one process
#   make test-crash     `crash_lane`: the rest of the real-driver crash matrix (every crash
#                       point on every sink and inside a no-data batch, a SIGTERM stop, the
#                       multi-output crashes) and a verify campaign that must catch a
#                       planted bug
#   make test-campaign  `campaign_lane`: the other verify campaigns, zombie, signal and
#                       PostgreSQL repeats, the Spark standalone cluster suite, the wheel's
#                       clean-venv install test (tests/packaging), the benchmarks' smoke runs
# The crash and campaign lanes are also split into shards of at most about 15 minutes each
# (tests/shards.py; tests/shard-map.json pins each test to its shard, and a new test joins
# one by itself): make test-shard K=<k> runs shard k, make test-shard-list prints the map;
# PYTEST_ARGS=--record-durations writes a run's measured times into that file.
# CI (.ci/run) runs make test and one shard, rotating with the commit: `git rev-list --count
# HEAD` modulo the number of shards. make test-crash and make test-campaign run whole lanes.
# pytest's exit code 5 (no test selected) fails any of them, like any other failure. Each
# prints its wall time against its budget at its end; nothing fails on time.
LANE := crash_lane
CAMPAIGN := campaign_lane

test: setup lint jars
	bash scripts/ensure-postgres.sh
	bash scripts/ensure-chromium.sh
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 --lane-name="make test" --lane-budget=20 -m "not $(LANE) and not $(CAMPAIGN)" $(PYTEST_ARGS)

test-crash: setup jars
	bash scripts/ensure-postgres.sh
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q --durations=25 --lane-name="make test-crash" -m "$(LANE)" $(PYTEST_ARGS)

.PHONY: test-campaign
test-campaign: setup jars
	bash scripts/ensure-postgres.sh
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q --durations=25 --lane-name="make test-campaign" -m "$(CAMPAIGN)" $(PYTEST_ARGS)

.PHONY: test-shard test-shard-list test-shard-count
test-shard: setup jars
	@test -n "$(K)" || { echo "error: name the shard: make test-shard K=<k> (make test-shard-list prints the map)" >&2; exit 2; }
	bash scripts/ensure-postgres.sh
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q --durations=25 --shard=$(K) $(PYTEST_ARGS)

test-shard-list: setup
	$(PY) -m tests.shards --list

test-shard-count: setup
	@$(PY) -m tests.shards --count

unit: setup
	$(PY) -m pytest -q tests/unit

# Sinks side by side on 5 million records (a throwaway PostgreSQL server, Delta tables in a
# temp directory; about 25 minutes).
# Results: benchmarks/results/sinks.json and sinks.png. BENCH_ARGS="--records 500000" for less.
bench: setup jars
	bash scripts/ensure-postgres.sh
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/sinks.py $(BENCH_ARGS)

# IcebergSink append against the at-least-once foreachBatch that appends each batch with
# PyIceberg (no ledger), side by side on 5 million records (micro-batches of 500k, two rounds
# in alternating order, one session; SQL catalogs on SQLite in a temp directory), then the
# sink's commit time on tables of 10 to 10,000 snapshots (no Spark). About 15 minutes.
# Results: benchmarks/results/iceberg.json and iceberg-snapshots.json. The upsert pair:
# benchmarks/iceberg.py --mode upsert (see its docstring and docs/performance.md).
.PHONY: bench-iceberg
bench-iceberg: setup
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/iceberg.py --mode append --records 5000000 \
		--batch-records 500000 --rounds 2 --out benchmarks/results/iceberg.json $(BENCH_ARGS)
	$(PY) benchmarks/iceberg.py --mode snapshots --snapshots 10,100,1000,10000 \
		--out benchmarks/results/iceberg-snapshots.json
	$(PY) benchmarks/iceberg.py --mode retention --snapshots 100,1000,3000,10000 --young 100 \
		--commits 20 --out benchmarks/results/iceberg-retention.json

# Kafka pipelines side by side on 5 million records, each sparkonce sink against its
# at-least-once counterpart: KafkaSink (read by KafkaSource) against Spark's Kafka sink (read
# by KafkaSource, and by Spark's connector), PostgresTwoPhaseSink against foreachBatch with
# Spark's JDBC writer and with COPY, and its upsert against INSERT ... ON CONFLICT; on a
# throwaway broker (pinned jars) and PostgreSQL server. Results: benchmarks/results/kafka.json
# and kafka.png. BENCH_ARGS="--records 500000" for less, "--variants a,b" for some, "--repeat 3"
# for three interleaved runs of each, pooled (each round's ratio kept in the report).
.PHONY: bench-kafka
bench-kafka: setup jars
	bash scripts/ensure-postgres.sh
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/kafka.py $(BENCH_ARGS)

# Issue 44's broker-kill campaign: single brokers of a throwaway 3-node KRaft cluster killed
# with SIGKILL, by role in turn, under four running pipeline kinds (real drivers); an
# independent reader checks exactly-once output at the end (about 15 minutes). Results:
# benchmarks/results/kafka-broker-faults.json. BENCH_ARGS="--kills 4 --pipelines k2k" for a smoke run.
.PHONY: bench-broker-faults
bench-broker-faults: setup jars
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/kafka_broker_faults.py $(BENCH_ARGS)

# Issue 47's generic source: SparkSource over the user's own readStream.format("kafka") chain
# against SparkKafkaSource, the same topic (a throwaway broker, pinned jars), the same batch
# limit, into SQLiteSink, on one session in alternating rounds; each run's table checked with
# sqlite3. Results: benchmarks/results/generic-source.json. BENCH_ARGS="--records 100000
# --batch-records 10000 --repeat 1" for a smoke run.
.PHONY: bench-generic-source
bench-generic-source: setup jars
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/generic_source.py $(BENCH_ARGS)

# Issue 47's Delta to Delta: DeltaSource into DeltaSink against Delta's own foreachBatch with
# txnAppId/txnVersion, (a) throughput in alternating rounds on one session, (b) each one's rows
# after a lost checkpoint (bronze unchanged, then new appends), counted from the Delta log with
# pyarrow. Results: benchmarks/results/delta-to-delta.json. BENCH_ARGS="--versions 4 --rows
# 10000 --repeat 1" for a smoke run.
.PHONY: bench-delta-to-delta
bench-delta-to-delta: setup jars
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/delta_to_delta.py $(BENCH_ARGS)

# Issue 39's live-reader campaigns: `sparkonce verify` with readers that poll the store during
# every trial (aborted reads, duplicates, torn batches, rows that disappear), on one sink family
# (FAMILY: sqlite, postgres, twophase, kafka or delta), one trial at a time, about 40-100 s each.
# Resumable: each call runs the trials not yet in benchmarks/results/verify-live-FAMILY.json, up
# to TRIALS (default 50), so a campaign can span sessions. scripts/live-campaign.sh.
# CONNECT=1: the same on Spark Connect sessions (verify --remote local[2]; no task-failure),
# reported in benchmarks/results/verify-connect-FAMILY.json.
TRIALS ?= 50
CONNECT ?=
# Each sink on Spark Connect against the same sink on a classic session, side by side
# (benchmarks/connect.py: SQLite, Delta, PostgreSQL, two-phase PostgreSQL and Kafka, with a
# throwaway PostgreSQL server and Kafka broker). Results: benchmarks/results/connect.json.
# BENCH_ARGS="--records 4000 --batch-records 400 --repeat 2" for less (about 30 minutes),
# "--sinks sqlite" for one sink.
.PHONY: bench-connect
bench-connect: setup jars
	bash scripts/ensure-postgres.sh
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/connect.py $(BENCH_ARGS)

.PHONY: bench-live
bench-live: setup jars
	@test -n "$(FAMILY)" || { echo "make bench-live FAMILY=sqlite|postgres|twophase|kafka|delta [TRIALS=50]" >&2; exit 2; }
	SPARKONCE_CAMPAIGN_CONNECT=$(CONNECT) bash scripts/live-campaign.sh $(FAMILY) $(TRIALS)

# Stable batch output's cost: two outputs in two stores (PostgreSQL and SQLite) with and
# without it, interleaved, on 2 million records (3 rounds; about 20 minutes). Results:
# benchmarks/results/stable-output.json and stable-output.png. BENCH_ARGS="--repeat 1" for less.
.PHONY: bench-outputs
bench-outputs: setup
	bash scripts/ensure-postgres.sh
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/stable_output.py $(BENCH_ARGS)

# What dedupe costs: the same SQLite pipeline with and without it, RocksDB state at Spark's
# settings and tuned (and the in-memory state store and a bare dropDuplicatesWithinWatermark
# for context), on 10 million records with 1% re-sent copies (about 30 minutes). Results:
# benchmarks/results/dedup.json and dedup.png. BENCH_ARGS="--records 1000000" for less.
.PHONY: bench-dedup
bench-dedup: setup
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/dedup.py $(BENCH_ARGS)

# The protocol simulation at volume: SOAK_SCHEDULES seeded schedules (default 1,000,000)
# against SQLite on SOAK_WORKERS processes (default 2), from seed SOAK_SEED, with a
# progress bar; prints the rate and every failing seed with the command that replays
# it (the first one shrunk). SOAK_ARGS passes more, e.g. --store postgres --url URL --lanes 8.
SOAK_SCHEDULES ?= 1000000
SOAK_WORKERS ?= 2
SOAK_SEED ?= 0
.PHONY: soak
soak: setup
	$(PY) -m sparkonce.verify.sim --progress --schedules $(SOAK_SCHEDULES) \
		--workers $(SOAK_WORKERS) --seed $(SOAK_SEED) $(SOAK_ARGS)

# Mutation testing of the commit protocol (CI rotation, not make test): mutmut mutates
# src/sparkonce/commit/, offsets.py, protocol.py, the SQL ledger store (but its PostgreSQL-only
# code), the ledger entry and Kafka marker codecs and sinks/base.py ([tool.mutmut] in
# pyproject.toml) and runs the fast tests against each mutant (unit, the committer on
# SQLite, 300 simulation schedules on SQLite, one process; the mutation_pg tests on a
# PostgreSQL server of its own), niced, one mutant at a time
# (the machine is shared).
# Results, with every surviving mutant and the reason it is equivalent
# (tests/mutation-equivalent.json): benchmarks/results/mutation.json. Fails below 95%
# killed or on an unexplained survivor. mutmut keeps results in mutants/ and re-runs only
# what changed, but this target always starts afresh: 1766 mutants, never yet run in one
# go (the rotation's twenty groups, merged, are the report; their times:
# tests/shard-durations.json). The
# CI rotation runs the same in twenty groups (tests/mutation/test_mutation_score.py).
.PHONY: mutation
mutation: setup
	rm -rf mutants
	bash scripts/ensure-postgres.sh
	url=$$($(PY) -m tests.services.postgres start .services/mutation-pg | tail -n 1); \
	start=$$(date +%s); \
	SPARKONCE_TEST_PG_URL=$$url SPARKONCE_NO_CLASS_DATA=1 SPARKONCE_SIM_SCHEDULES=300 \
		SPARKONCE_SIM_WORKERS=1 nice -n 15 $(VENV)/bin/mutmut run --max-children 1; \
	$(PY) -m tests.services.postgres stop .services/mutation-pg; \
	$(PY) scripts/mutation-report.py --seconds $$(( $$(date +%s) - start ))

# Start / stop a PostgreSQL server by hand (same helper the tests use).
pg-start: setup
	bash scripts/ensure-postgres.sh
	$(PY) -m tests.services.postgres start .services/postgres

pg-stop: setup
	$(PY) -m tests.services.postgres stop .services/postgres

# Pinned Kafka broker, Spark Kafka connector, Delta Lake, PostgreSQL JDBC and S3A (hadoop-aws +
# AWS SDK) jars (jars/pom.xml), fetched once.
jars:
	bash scripts/fetch-jars.sh

# Start / stop a single-node Kafka broker by hand (same helper the tests use); prints the
# bootstrap address.
kafka-start: setup jars
	$(PY) -m tests.services.kafka start .services/kafka

kafka-stop: setup
	$(PY) -m tests.services.kafka stop .services/kafka

clean:
	rm -rf $(VENV) .demo .services .pytest_cache .mypy_cache .ruff_cache
