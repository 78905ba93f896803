#!/usr/bin/env bash
# Fails when a tracked source file is over the size cap (CONTRIBUTING.md "Where things go"):
# a file that long holds more than one concept. Generated code and data are not counted.
set -euo pipefail
cd "$(dirname "$0")/.."
cap=${KVC_MAX_FILE_LINES:-800}
over=0
while IFS= read -r f; do
  n=$(wc -l < "$f")
  if (( n > cap )); then
    echo "check_sizes: $f has $n lines (cap $cap): split it by concept" >&2
    over=1
  fi
done < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' '*.py' '*.sh' | grep -v '/_proto/')
if (( over )); then exit 1; fi
echo "check_sizes: every source file within $cap lines"
