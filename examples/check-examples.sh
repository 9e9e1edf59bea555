#!/usr/bin/env bash
# The main job on the bundled examples: verify every HLO pair under examples/hlo/ and compare
# the verdict with the one its expect.yaml states. Exits non-zero if any verdict differs.
set -uo pipefail
cd "$(dirname "$0")/.."
SHARDPROOF=${1:-shardproof}
mkdir -p out/examples
status=0
for dir in examples/hlo/*/; do
  name=$(basename "$dir")
  args=("$dir/baseline.hlo" "$dir/distributed.hlo" --relations "$dir/relations.yaml" --json "out/examples/$name.json")
  [ -f "$dir/sourcemap.json" ] && args+=(--sourcemap "$dir/sourcemap.json")
  echo "== $name"
  "$SHARDPROOF" check "${args[@]}"
  code=$?
  want=$(sed -n 's/^verdict: *//p' "$dir/expect.yaml")
  got=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['verdict'])" "out/examples/$name.json" 2>/dev/null || echo "error(exit $code)")
  if [ "$got" != "$want" ]; then
    echo "!! $name: expected $want, got $got"
    status=1
  fi
done
exit $status
