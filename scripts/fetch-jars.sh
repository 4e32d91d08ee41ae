#!/usr/bin/env bash
# Fetch the Apache Kafka broker jars, the Spark Kafka connector jars, the Delta Lake jars, the
# PostgreSQL JDBC driver and the S3A jars (versions pinned in jars/pom.xml) from Maven Central
# into the git-ignored jar cache:
#
#   .cache/jars/broker/       single-node KRaft broker: java -cp '.cache/jars/broker/*' kafka.Kafka
#   .cache/jars/spark-kafka/  spark-sql-kafka connector + kafka-clients + commons-pool2, for
#                             spark.jars (nothing that pyspark already ships)
#   .cache/jars/delta/        delta-spark + delta-storage, for spark.jars (DeltaSink)
#   .cache/jars/jdbc/         the PostgreSQL JDBC driver, for spark.jars (the JDBC baseline of
#                             benchmarks/kafka.py only)
#   .cache/jars/s3/           hadoop-aws + the AWS SDK v2 bundle (about 690 MB, most of the
#                             download), for spark.jars: s3a:// paths
#
# Idempotent: a directory whose stamp file matches the current jars/pom.xml checksum is left
# alone. Set SPARKONCE_JAR_CACHE to use another cache directory; pass --force to refetch.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
POM="$ROOT/jars/pom.xml"
CACHE="${SPARKONCE_JAR_CACHE:-$ROOT/.cache/jars}"
FORCE=0
case "${1:-}" in
  "") ;;
  --force) FORCE=1 ;;
  -h | --help)
    sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "usage: $0 [--force]" >&2
    exit 2
    ;;
esac

die() {
  echo "fetch-jars: error: $*" >&2
  exit 1
}

command -v java >/dev/null 2>&1 || die "java not found on PATH; install a JDK 17+ (Debian: apt-get install openjdk-17-jdk-headless)"
command -v mvn >/dev/null 2>&1 || die "mvn (Apache Maven) not found on PATH; install it (Debian: apt-get install maven)"
[ -f "$POM" ] || die "$POM is missing"

java_major="$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')"
java_major="${java_major#1.}"
if [ -n "$java_major" ] && [ "$java_major" -lt 17 ] 2>/dev/null; then
  die "Java $java_major found; the Kafka 4.x broker needs Java 17 or newer"
fi

checksum="$(sha256sum "$POM" | cut -d' ' -f1)"

# fetch PROFILE DIR: copy the runtime dependencies of the pom's PROFILE into DIR.
fetch() {
  local profile="$1" dest="$2" stamp="$2/.stamp" tmp
  if [ "$FORCE" -eq 0 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$checksum" ]; then
    return 0
  fi
  echo "fetch-jars: downloading the '$profile' jars into $dest (first time takes a while)" >&2
  mkdir -p "$(dirname "$dest")"
  tmp="$(mktemp -d "$(dirname "$dest")/.${profile}.XXXXXX")"
  # Copy into a fresh directory and swap it in, so a changed pom leaves no stale jars behind
  # and an interrupted download never looks complete.
  if ! mvn -q -B -f "$POM" -P "$profile" dependency:copy-dependencies \
    -DoutputDirectory="$tmp" -Dmdep.useRepositoryLayout=false -DincludeScope=runtime \
    >"$tmp.log" 2>&1; then
    sed 's/\x1b\[[0-9;]*m//g' "$tmp.log" >&2
    rm -rf "$tmp" "$tmp.log"
    die "mvn could not fetch the '$profile' jars (Maven output above)"
  fi
  rm -f "$tmp.log"
  compgen -G "$tmp/*.jar" >/dev/null || {
    rm -rf "$tmp"
    die "mvn copied no jars for profile '$profile'"
  }
  echo "$checksum" >"$tmp/.stamp"
  rm -rf "$dest"
  mv "$tmp" "$dest"
}

fetch broker "$CACHE/broker"
fetch spark-kafka "$CACHE/spark-kafka"
fetch delta "$CACHE/delta"
fetch jdbc "$CACHE/jdbc"
fetch s3 "$CACHE/s3"

echo "broker jars:      $CACHE/broker   (java -cp '$CACHE/broker/*' kafka.Kafka server.properties)"
echo "spark-kafka jars: $CACHE/spark-kafka   (spark.jars = $(
  ls "$CACHE"/spark-kafka/*.jar | paste -sd, -
))"
echo "delta jars:       $CACHE/delta   (spark.jars = $(
  ls "$CACHE"/delta/*.jar | paste -sd, -
))"
echo "jdbc jars:        $CACHE/jdbc   (spark.jars = $(
  ls "$CACHE"/jdbc/*.jar | paste -sd, -
))"
echo "s3 jars:          $CACHE/s3   (spark.jars = $(
  ls "$CACHE"/s3/*.jar | paste -sd, -
))"
