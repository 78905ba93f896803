#!/usr/bin/env bash
# clang-tidy 14 with the repo's .clang-tidy over our C++ files (never generated *.pb.* files:
# only files git knows are checked). Every finding is an error (exit 1).
#
#   scripts/tidy.sh               files changed since the base revision (see below), plus
#                                 uncommitted and untracked changes
#   scripts/tidy.sh --base REV    files changed since REV
#   scripts/tidy.sh --all         every C++ file (minutes: each file parses gRPC/Abseil headers)
#   scripts/tidy.sh FILE...       these files
#
# Default base: `git merge-base HEAD origin/main` when origin/main exists and HEAD is not on
# it; else HEAD~1 (the last commit's files); in a clone whose HEAD has no parent (shallow, depth
# 1) nothing is known to have changed, so only uncommitted changes are checked, and it says so.
# Uses build/compile_commands.json (--build-dir DIR to change); configures the default preset
# and generates the protobuf headers first if they are missing (a fresh clone). JOBS=N sets
# the parallelism (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
TIDY=${CLANG_TIDY:-clang-tidy-14}
BUILD=build
mode=changed
base=""
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --all) mode=all ;;
    --base) base=${2:?--base needs a revision}; shift ;;
    --build-dir) BUILD=${2:?--build-dir needs a directory}; shift ;;
    -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "usage: scripts/tidy.sh [--all | --base REV | FILE...] [--build-dir DIR]" >&2; exit 64 ;;
    *) mode=files; files+=("$1") ;;
  esac
  shift
done

# kernels/cpu uses GCC-only vector builtins (__builtin_shuffle, __builtin_cpu_supports("f16c"))
# that clang cannot parse, so clang-tidy reports compile errors there, not findings. Drop this
# exclusion once kernels/cpu builds with clang (scripts/tsa_check.sh has the same one).
# CUDA sources (.cu/.cuh) need nvcc's environment and are not checked.
excluded='^kernels/cpu/'
cxx=('*.cc' '*.h')

case "$mode" in
  all) mapfile -t files < <(git ls-files -- "${cxx[@]}") ;;
  changed)
    if [ -z "$base" ]; then
      if git rev-parse -q --verify origin/main >/dev/null &&
        [ "$(git merge-base HEAD origin/main)" != "$(git rev-parse HEAD)" ]; then
        base=$(git merge-base HEAD origin/main)
      elif git rev-parse -q --verify 'HEAD~1^{commit}' >/dev/null; then
        base=HEAD~1
      else
        echo "tidy: HEAD has no parent commit here (shallow clone?): checking uncommitted" \
          "changes only; scripts/tidy.sh --all checks everything"
        base=HEAD
      fi
    fi
    mapfile -t files < <({
      git diff --name-only --diff-filter=ACMR "$base" -- "${cxx[@]}"
      git ls-files --others --exclude-standard -- "${cxx[@]}"
    } | sort -u)
    ;;
esac

checked=()
for f in "${files[@]}"; do
  [[ "$f" =~ $excluded ]] && continue
  case "$f" in *.cc | *.h) [ -f "$f" ] && checked+=("$f") ;; esac
done
if [ ${#checked[@]} -eq 0 ]; then
  echo "tidy: no C++ file to check${base:+ (changed since $base)}"
  exit 0
fi

if [ ! -f "$BUILD/compile_commands.json" ]; then
  [ "$BUILD" = build ] || { echo "tidy: $BUILD/compile_commands.json missing" >&2; exit 1; }
  cmake --preset default >/dev/null
fi
# Sources include generated protobuf headers: generate them (protoc only, seconds).
mapfile -t generated < <(ninja -C "$BUILD" -t targets rule CUSTOM_COMMAND | grep -E '\.pb\.(h|cc)$')
if [ ${#generated[@]} -gt 0 ]; then ninja -C "$BUILD" "${generated[@]}" >/dev/null; fi

# What clang-tidy runs on: a .cc that the compilation database has (one this configuration
# does not build, e.g. the CUDA backend without nvcc, cannot be parsed with the right flags);
# for a header, a .cc that includes it (its own foo.cc when that does) -- a header alone gets
# guessed flags -- and HeaderFilterRegex reports the header's findings. With --all only the
# .cc files run: every header is seen through them.
mapfile -t targets < <(python3 - "$BUILD/compile_commands.json" "$mode" "$excluded" \
  "${checked[@]}" <<'PY'
import collections, json, os, re, subprocess, sys
db_path, mode, excluded, files = sys.argv[1], sys.argv[2], re.compile(sys.argv[3]), sys.argv[4:]
in_db = {f for f in (os.path.relpath(os.path.join(e["directory"], e["file"]))
                     for e in json.load(open(db_path))) if not excluded.search(f)}
tracked = subprocess.run(["git", "ls-files", "*.cc", "*.h"], capture_output=True, text=True,
                         check=True).stdout.split()
include = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
included_by = collections.defaultdict(set)  # header -> files that #include it
def build_graph():
    by_name = collections.defaultdict(list)
    for t in tracked:
        parts = t.split("/")
        for i in range(len(parts)):
            by_name["/".join(parts[i:])].append(t)
    for src in tracked:
        with open(src, errors="replace") as f:
            for inc in include.findall(f.read()):
                local = os.path.join(os.path.dirname(src), inc)
                for h in [local] if local in tracked else by_name.get(inc, []):
                    included_by[h].add(src)
def user_of(header):  # its own .cc, else the nearest .cc that includes it, maybe indirectly
    if not included_by:
        build_graph()
    own = os.path.splitext(header)[0] + ".cc"
    seen, queue = {header}, collections.deque([header])
    found = []
    while queue:
        for u in sorted(included_by[queue.popleft()]):
            if u in seen:
                continue
            seen.add(u)
            if u.endswith(".cc") and u in in_db:
                found.append(u)
            else:
                queue.append(u)
        if found:
            break
    if own in in_db and own in seen:
        return own
    return found[0] if found else header
out = []
for f in files:
    if f.endswith(".cc"):
        if f in in_db:
            out.append(f)
        else:
            print(f"tidy: skipping {f} (not compiled in this build)", file=sys.stderr)
    elif mode != "all":
        out.append(user_of(f))
for t in dict.fromkeys(out):
    print(t)
PY
)
if [ ${#targets[@]} -eq 0 ]; then
  echo "tidy: nothing to check"
  exit 0
fi

echo "tidy: $TIDY on ${#targets[@]} files${base:+ changed since $base} (-j $JOBS)"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The database without g++'s precompiled header (tests/CMakeLists.txt, KVC_TEST_PCH): clang
# cannot read a .gch, and without it each file is checked on the includes it names.
mkdir -p "$out/db"
python3 - "$BUILD/compile_commands.json" "$out/db/compile_commands.json" <<'PY'
import json, re, sys
db = json.load(open(sys.argv[1]))
for e in db:
    e["command"] = re.sub(r" -Winvalid-pch -include \S*/cmake_pch\.hxx", "", e["command"])
json.dump(db, open(sys.argv[2], "w"))
PY
export TIDY out
printf '%s\0' "${targets[@]}" | xargs -0 -n 1 -P "$JOBS" bash -c '
  log="$out/$(echo "$1" | tr / _).log"
  "$TIDY" -p "$out/db" --quiet "$1" >"$log" 2>&1 || touch "$log.failed"' _

# One line per finding (a header included by many files reports once). Unless --all, only
# findings in the files being checked count -- a changed file must not fail on what an
# unchanged header it includes already had -- but a compile error anywhere always does (the
# analysis of that file is incomplete). A header is reported by the path it was included
# through, a symlink in the build tree's include roots (cmake/KvcHelpers.cmake, kvc_expose):
# realpath turns that back into its path in the repository.
printf '%s\n' "${checked[@]}" >"$out/checked"
cat "$out"/*.log | python3 -c 'import os, re, sys
mode, checked = sys.argv[1], set(open(sys.argv[2]).read().split())
for line in sys.stdin:
    m = re.match(r"([^ :]+):[0-9]+:[0-9]+: (warning|error): ", line)
    if not m:
        continue
    path = os.path.relpath(os.path.realpath(m.group(1)))
    if mode == "all" or path in checked or line.rstrip().endswith("[clang-diagnostic-error]"):
        print(path + line[len(m.group(1)):], end="")' "$mode" "$out/checked" |
  sort -u >"$out/findings"
crashed=0
for marker in "$out"/*.failed; do
  [ -e "$marker" ] || continue
  log=${marker%.failed}
  if ! grep -qE '^[^ :]+:[0-9]+:[0-9]+: (warning|error): ' "$log"; then
    cat "$log"  # clang-tidy failed without a diagnostic: show what it said
    crashed=1
  fi
done
if [ -s "$out/findings" ] || [ "$crashed" -ne 0 ]; then
  cat "$out/findings"
  echo "tidy: $(wc -l <"$out/findings") findings (.clang-tidy); fix them or, for a false" \
    "positive, add // NOLINT(check-name) with the reason"
  exit 1
fi
echo "tidy: ${#targets[@]} files OK"
