#!/usr/bin/env bash
# Everything that needs a GPU, in one go, from a checkout on a CUDA machine:
#   OUT=results/ bash benchmarks/gpu_all.sh [steps...]
# Steps (default: all, in this order): tests host replay calibrate bench lce model moe; also: probe, portable.
#   tests      the whole suite with Triton's interpreter off (kernels run on CUDA)
#   host       host microseconds per tiny call, ours vs aten (benchmarks/host_overhead.py),
#              and the Python part alone with the launch stubbed (benchmarks/launch_overhead.py)
#   replay     python -m python_native bench --prove-replay (replayed calls against Python-served ones;
#              writes the proof that turns replay on here), then host_overhead.py --no-calibration:
#              tiny hits with replay on against aten (the compiled front is built first)
#   probe      host time stage by stage (benchmarks/host_breakdown.py) and the kernels of the rows
#              named in PROFILE_ROWS ("op mode MxN dtype;..."), with the overrides on and off
#   calibrate  python -m python_native bench --calibrate: this GPU's calibration table
#   bench      python -m python_native bench (JSON, table and plots), with the table just written in force
#   portable   python -m python_native bench --dtypes bfloat16 under the portable policy (tables ignored)
#   lce        the fused linear cross-entropy against the unfused path (and Liger-Kernel's), peak memory and time
#              for an LLM head (benchmarks/linear_cross_entropy.py)
#   model      one training step of a Llama-shaped stack, unpatched, pn.patch-ed and with Liger-Kernel's
#              patch: step time and peak memory (benchmarks/model_step.py)
#   moe        one mixture-of-experts layer forward and backward: transformers' experts, the package's
#              MoE ops and Liger-Kernel's (benchmarks/moe_layer.py)
# Wheels under .whl/ (Liger-Kernel, ...) are installed into /tmp/site first.
# Each step has its own time limit (seconds): TESTS_S, HOST_S, CALIBRATE_S, BENCH_S, LCE_S, MODEL_S, MOE_S.
# BENCH_ARGS adds options to the bench step (e.g. "--dtypes bfloat16 --no-inductor"), CALIBRATE_ARGS to
# the calibrate step (e.g. "--dtypes bfloat16 --ops rms_norm"), TEST_ARGS replaces pytest's "-q"
# (e.g. '-v -m "not slow"': one line per test, so a run cut by its limit still names its failures).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHON_NATIVE_TRITON_INTERPRET=0 TRITON_INTERPRET=0
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
# Installed (editable, no network) so that the tests' fresh processes find it as users do: the
# `import torch` entry point that mounts the panel, and python_native_dsls.
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 \
    || echo "note: the editable install failed; tests that start a fresh 'import torch' will fail"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests host replay calibrate bench lce model moe)
table="$OUT/calibration.json"

for step in "${steps[@]}"; do
    echo "=== $step $(date -u +%H:%M:%S)"
    case "$step" in
    tests)
        # Ops no GPU has timed yet are installed for the suite, so that their kernels are tested here.
        eval "PYTHON_NATIVE_UNMEASURED=1 timeout ${TESTS_S:-240} python3 -m pytest ${TEST_ARGS:--q} -p no:cacheprovider -n ${TEST_WORKERS:-8} --timeout 120 tests" \
            2>&1 | tee "$OUT/tests.log" | tail -40 ;;
    replay)
        timeout "${HOST_S:-120}" python3 -m python_native precompile --dsl front 2>&1 | tee "$OUT/replay.txt"
        timeout "${HOST_S:-120}" python3 -m python_native bench --prove-replay 2>&1 | tee -a "$OUT/replay.txt"
        timeout "${HOST_S:-120}" python3 benchmarks/host_overhead.py --no-calibration --rounds 5 2>&1 \
            | tee -a "$OUT/replay.txt" ;;
    host)
        timeout "${HOST_S:-120}" python3 benchmarks/host_overhead.py 2>&1 | tee "$OUT/host.txt"
        timeout "${HOST_S:-120}" python3 benchmarks/launch_overhead.py --cuda --number 500 2>&1 | tee -a "$OUT/host.txt" ;;
    probe)
        timeout "${HOST_S:-120}" python3 benchmarks/host_breakdown.py 2>&1 | tee "$OUT/probe.txt"
        IFS=';' read -ra rows <<< "${PROFILE_ROWS:-}"
        for row in "${rows[@]}"; do
            # shellcheck disable=SC2086
            timeout "${HOST_S:-120}" python3 benchmarks/profile_case.py $row 2>&1 | tee -a "$OUT/probe.txt"
        done ;;
    calibrate)
        timeout "${CALIBRATE_S:-200}" python3 -m python_native bench --calibrate --output "$table" ${CALIBRATE_ARGS:-} \
            2>"$OUT/calibrate.log"
        tail -3 "$OUT/calibrate.log"; grep -c loses "$OUT/calibrate.log" ;;
    bench)
        [ -f "$table" ] && export PYTHON_NATIVE_CALIBRATION="$table"
        # shellcheck disable=SC2086
        timeout "${BENCH_S:-240}" python3 -m python_native bench --plot "$OUT/bench.png" --save-json "$OUT/bench.json" ${BENCH_ARGS:-} \
            2>&1 | tee "$OUT/bench.txt" ;;
    portable)
        # The portable policy forced (the measured tables ignored): no fired row may be below 0.97x aten.
        PYTHON_NATIVE_CALIBRATION=portable timeout "${BENCH_S:-240}" python3 -m python_native bench --dtypes bfloat16 \
            --save-json "$OUT/bench_portable.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_portable.txt" ;;
    lce)
        timeout "${LCE_S:-240}" python3 benchmarks/linear_cross_entropy.py 2>&1 | tee "$OUT/lce.txt" ;;
    model)
        timeout "${MODEL_S:-300}" python3 benchmarks/model_step.py 2>&1 | tee "$OUT/model.txt" ;;
    moe)
        timeout "${MOE_S:-240}" python3 benchmarks/moe_layer.py 2>&1 | tee "$OUT/moe.txt" ;;
    *) echo "unknown step $step" ;;
    esac
done
