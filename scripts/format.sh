#!/usr/bin/env bash
# clang-format (Google style, 100 columns; .clang-format) over our C++/CUDA sources.
#   scripts/format.sh          rewrite files in place
#   scripts/format.sh --check  list unformatted files and exit 1 if there are any
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh')
[ ${#files[@]} -eq 0 ] && exit 0
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if [ ${#bad[@]} -gt 0 ]; then
    printf 'format: not clang-formatted (run scripts/format.sh):\n'
    printf '  %s\n' "${bad[@]}"
    exit 1
  fi
  echo "format: ${#files[@]} files OK"
else
  clang-format -i "${files[@]}"
fi
