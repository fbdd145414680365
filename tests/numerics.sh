#!/usr/bin/env bash
# The numerically sensitive tests (pytest marker `numerics`: a training run judged against a
# threshold, the tiny-local pre-training, the smoke reproductions) under several CPU kernel paths
# and at shifted seeds, one after another, each with a fresh model cache so that tiny-local is
# pre-trained again on that path. Another processor (vector width, MKL's code path on another
# vendor) changes a tiny training run the way these settings do, but only as far as the kernels
# here can imitate it: they cannot imitate wider vectors than this CPU has. A seed shift
# (LADDER_TEST_SEED_SHIFT, tests/conftest.py) perturbs every trial more than any processor does;
# a test that passes under all of them does not depend on the CPU it was tuned on.
#
#   tests/numerics.sh [PYTEST ARGS...]      (or: make test-numerics)
#
# NUMERICS_SETTINGS overrides the list: settings separated by ';', each a space-separated list of
# VAR=VALUE ("native" for none), e.g. NUMERICS_SETTINGS="native;ATEN_CPU_CAPABILITY=default".
set -uo pipefail
cd "$(dirname "$0")/.."
BIN="${VENV:-.venv}/bin"
native="$("$BIN/python" -c 'import torch; print(torch.backends.cpu.get_cpu_capability())')"
if [ -n "${NUMERICS_SETTINGS:-}" ]; then
  IFS=';' read -r -a settings <<< "$NUMERICS_SETTINGS"
else
  # ATen's portable kernels instead of its vectorized ones, MKL's conditional numerical
  # reproducibility mode (its vendor-neutral code path), and two seed shifts (10 and 20: apart
  # from the judged seeds 0-4, the calibration seeds 100-109 and the seeds 0-8 that the tests'
  # margins were measured on); on an AVX-512 machine also AVX2.
  settings=("native" "ATEN_CPU_CAPABILITY=default" "MKL_CBWR=COMPATIBLE"
            "LADDER_TEST_SEED_SHIFT=10" "LADDER_TEST_SEED_SHIFT=20")
  if [ "$native" = "AVX512" ]; then settings+=("ATEN_CPU_CAPABILITY=avx2"); fi
fi
root="$(mktemp -d "${TMPDIR:-/tmp}/ladder-numerics.XXXXXX")"
echo "numerics check: native CPU capability $native; settings: ${settings[*]}; logs in $root"
failed=0
summary=()
for i in "${!settings[@]}"; do
  setting="${settings[$i]}"
  vars=()
  [ "$setting" != "native" ] && read -r -a vars <<< "$setting"
  log="$root/setting-$i.log"
  echo "== $setting"
  start=$SECONDS
  env -u LADDER_CACHE "${vars[@]}" "$BIN/pytest" -q -m numerics -n "${TEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder -p no:cacheprovider \
    --basetemp "$root/tmp-$i" "$@" > "$log" 2>&1
  rc=$?
  line="$(grep -E '(passed|failed|error)' "$log" | tail -n 1)"
  summary+=("$setting: ${line:-no summary, see $log} ($((SECONDS - start)) s)")
  if [ "$rc" -ne 0 ]; then
    failed=1
    grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/   /'
  fi
  echo "   ${line} ($((SECONDS - start)) s)"
done
echo
echo "numerics check summary (native capability $native):"
printf '  %s\n' "${summary[@]}"
exit "$failed"
