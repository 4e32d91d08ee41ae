#!/usr/bin/env bash
# Pack the Python environment that Spark executors run sparkonce's code in, as one tar.gz to
# ship with `spark.archives=ARCHIVE#environment` (tests/services/spark_cluster.py shows the
# settings that go with it). Prints the archive's path on stdout.
#
#   scripts/pack-executor-env.sh [OUT_DIR]      (default OUT_DIR: .cache/executor-env)
#
# The environment is a slim virtualenv: sparkonce installed from this checkout (a normal,
# not editable, install: an editable one points back into the checkout, which executors on
# other machines do not have) and its runtime dependencies with the extras executors need
# (SPARKONCE_ENV_EXTRAS, default "postgres,kafka": the two-phase sink's COPY and the Kafka
# sink run inside tasks). Not the dev extras, and not PySpark itself: every executor's
# Python workers get PySpark and py4j from the Spark installation that runs them
# ($SPARK_HOME/python/lib/pyspark.zip and py4j-*.zip on PYTHONPATH), which is also what
# keeps the Python side and the JVM side of Spark at one version.
#
# The archive is named by a hash of what goes into it (this script, pyproject.toml, every
# file under src/, the interpreter's version and the extras), so it is rebuilt exactly when
# one of them changes; older archives in OUT_DIR are removed.
#
# venv-pack does not pack the interpreter: the archive's bin/python is a symlink to the
# interpreter the environment was made from (PYTHON, default: the one behind .venv, else
# python3.11). That suits a machine, or a cluster, where that interpreter is installed at
# the same path on every node. On a real cluster whose nodes have Python 3.11 elsewhere,
# pack with `venv-pack --python-prefix /path/on/the/nodes`; where the nodes have no Python
# 3.11 at all, ship an environment that carries its own interpreter instead (conda-pack, or
# a relocatable standalone CPython build with the same packages installed).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
SCRIPT="$ROOT/scripts/pack-executor-env.sh"
OUT_DIR="${1:-$ROOT/.cache/executor-env}"
EXTRAS="${SPARKONCE_ENV_EXTRAS:-postgres,kafka}"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3.11; fi
fi
VENV_PACK="${VENV_PACK:-}"
if [ -z "$VENV_PACK" ]; then
  if [ -x .venv/bin/venv-pack ]; then VENV_PACK=.venv/bin/venv-pack; else VENV_PACK=venv-pack; fi
fi
command -v "$VENV_PACK" >/dev/null || {
  echo "error: venv-pack not found (pip install venv-pack, or the dev extras)" >&2
  exit 1
}

mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
# One build at a time per cache directory (two test sessions may ask at once).
exec 9>"$OUT_DIR/.lock"
flock 9

WORK="$(mktemp -d "${TMPDIR:-/tmp}/sparkonce-pack.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# What is installed is a copy of the sources that are hashed, without caches and build
# leftovers (an egg-info directory appears under src/ after any in-tree build).
mkdir "$WORK/src"
cp pyproject.toml README.md "$WORK/src/"
tar -C "$ROOT" --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' -cf - src \
  | tar -C "$WORK/src" -xf -
py_version="$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
case "$py_version" in
  3.11.*) ;;
  *) echo "error: $PYTHON is Python $py_version; the executors need the driver's 3.11" >&2; exit 1 ;;
esac
key="$(
  {
    sha256sum "$SCRIPT" | cut -d' ' -f1
    echo "python $py_version extras $EXTRAS"
    # README.md is copied only because the build reads it (the package's description):
    # editing it changes nothing an executor runs, so it is not part of the key.
    (cd "$WORK/src" && find . -type f ! -path ./README.md -print0 | LC_ALL=C sort -z \
      | xargs -0 sha256sum)
  } | sha256sum | cut -c1-16
)"
ARCHIVE="$OUT_DIR/sparkonce-executor-env-$key.tar.gz"
if [ -f "$ARCHIVE" ]; then
  echo "$ARCHIVE"
  exit 0
fi

start=$SECONDS
echo "building $ARCHIVE (Python $py_version, extras $EXTRAS)" >&2
# The environment's own pip and setuptools are not needed on executors: install through
# the outer pip (--python), into an environment made without pip.
"$PYTHON" -m venv --without-pip "$WORK/env"
requirements="$(
  "$PYTHON" - "$WORK/src/pyproject.toml" "$EXTRAS" <<'EOF'
import re
import sys
import tomllib

project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = [e for e in sys.argv[2].split(",") if e]
wanted = list(project["dependencies"])
for extra in extras:
    wanted += project["optional-dependencies"][extra]
for requirement in dict.fromkeys(wanted):
    name = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()
    if name not in ("pyspark", "py4j"):  # from the Spark installation, see above
        print(requirement)
EOF
)"
pip=("$PYTHON" -m pip --python "$WORK/env/bin/python" --disable-pip-version-check)
# shellcheck disable=SC2086  # one requirement per line, none with spaces
"${pip[@]}" install --quiet $requirements
# Last and without dependencies, so that pip neither fetches PySpark nor reports it missing.
"${pip[@]}" install --quiet --no-deps "$WORK/src"
# Python workers start often (one per task slot, again after each failure): byte-compiled
# modules spare each start recompiling pandas and pyarrow.
"$WORK/env/bin/python" -m compileall -q -j 0 "$WORK/env/lib" >/dev/null || true
# Test suites and C headers are never imported by a task: about 65 MB unpacked, left out.
"$VENV_PACK" --prefix "$WORK/env" --output "$WORK/env.tar.gz" --format tar.gz --quiet \
  --exclude '*/site-packages/*/tests/*' --exclude '*/site-packages/pyarrow/include/*'
chmod 644 "$WORK/env.tar.gz"
mv "$WORK/env.tar.gz" "$ARCHIVE"
find "$OUT_DIR" -maxdepth 1 -name 'sparkonce-executor-env-*.tar.gz' ! -path "$ARCHIVE" -delete
echo "built $ARCHIVE: $(du -h "$ARCHIVE" | cut -f1) in $((SECONDS - start)) s" >&2
echo "$ARCHIVE"
