#!/usr/bin/env bash
# The README's two commands on a fresh clone, as a machine with a single Python would run them.
#
#   .ci/one-python.sh 3.12 /path/to/python3.12   (any supported minor and its interpreter)
#
# Builds a PATH with every program of /usr/bin except Pythons, plus the given interpreter as
# python3.X/python3/python, and no pyenv; clones this repository's HEAD into a temporary folder
# and times `pip install nox`, `nox -s demo` (first and warm) and `nox`. Logs go to $OUT
# (default: a new temporary folder). Exits non-zero if a command fails.
set -euo pipefail
minor=$1
python=$2
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/one-python-$minor.XXXX")
out=${OUT:-$work/logs}
mkdir -p "$work/bin" "$out"
for program in /usr/bin/*; do
  case $(basename "$program") in python*|pydoc*|pip*|idle*|2to3*) ;; *) ln -s "$program" "$work/bin/";; esac
done
for name in "python$minor" python3 python; do ln -s "$python" "$work/bin/$name"; done
git clone -q "$repo" "$work/clone"
"$work/bin/python3" -m venv "$work/nox"
export PATH="$work/nox/bin:$work/bin"
unset CI PYENV_VERSION VIRTUAL_ENV
cd "$work/clone"
timed() { local label=$1; shift; local start=$SECONDS; "$@" > "$out/$label.log" 2>&1; echo "$label: ok in $((SECONDS - start)) s"; }
timed pip-install-nox pip install -q nox
timed demo-first nox -s demo
timed demo-warm nox -s demo
timed nox-first nox
echo "logs: $out; clone: $work/clone"
