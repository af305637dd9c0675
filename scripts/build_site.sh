#!/usr/bin/env bash
# Build the whole site: the English book at the root of _build/html/ and the Chinese edition
# (book/zh, a Jupyter Book of its own) under _build/html/zh/. Both builds are warning-free or
# this script fails: jupyter-book 1.x can exit 0 after "build finished with problems", so each
# log is checked too. The Chinese notebooks run the same code as the English ones; trained
# models come from the shared cache (POSENC_CACHE), so each build costs only the small cells and
# the figures, and the two builds run side by side (one per core).
#
#   bash scripts/build_site.sh            # both editions
#   bash scripts/build_site.sh --zh-only  # the Chinese edition only (the English one already built)
set -euo pipefail
cd "$(dirname "$0")/.."
# the notebooks' kernels must draw with matplotlib's inline backend, or no figure reaches the page
unset MPLBACKEND
export POSENC_CACHE="${POSENC_CACHE:-$PWD/.posenc_cache}"

mkdir -p _build
# the Chinese book builds into _build/zh-edition/_build/ (not book/zh/_build/): no build output
# ever lands among the sources, so nothing that walks book/ has to skip one
ZH_OUT=_build/zh-edition
build() {  # build <book dir> <output dir> <log>: jupyter-book's output goes to the log
  local start=$SECONDS
  if ! jupyter-book build "$1" --path-output "$2" -W -n --keep-going >"$3" 2>&1 \
      || grep -q "build finished with problems" "$3"; then
    tail -n 60 "$3" >&2
    echo "the build of $1 failed or reported warnings (see $3)" >&2
    return 1
  fi
  echo "built $1 in $((SECONDS - start)) s (log: $3)" >&2
}

if [[ "${1:-}" == "--zh-only" ]]; then
  build book/zh "$ZH_OUT" _build/build-zh.log
else
  # the two editions are independent books: build them side by side, one per core
  build . . _build/build.log & en=$!
  build book/zh "$ZH_OUT" _build/build-zh.log & zh=$!
  ok=0
  wait "$en" || ok=1
  wait "$zh" || ok=1
  [[ $ok == 0 ]] || exit 1
fi

rm -rf _build/html/zh
cp -r "$ZH_OUT/_build/html" _build/html/zh
echo "site: _build/html/index.html (English), _build/html/zh/index.html (中文)" >&2
