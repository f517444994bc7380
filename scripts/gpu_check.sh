#!/usr/bin/env bash
# GPU checks of the learner (issue 19), one command on a machine with one or more NVIDIA GPUs:
#
#   bash scripts/gpu_check.sh [OUT_DIR]    # default OUT_DIR: bench/results/gpu_check/<UTC time>
#
# Parts, one after the other, each under its own time limit and all under GPU_CHECK_BUDGET_S
# (default 500 s, so the script ends within 9 minutes, under the device's 600 s a command; a part
# that would start with under 20 s left is skipped and listed as missing):
#   env         nvidia-smi and what torch sees                                   -> env.log
#   parity      SFT and SAO steps, CUDA bf16 vs CPU fp32, same batch and weights,
#               tiny model and Qwen2-0.5B shape (random weights, built here)     -> parity.json
#   throughput  learner tokens/s of the SFT and SAO steps, 0.5B shape, bf16      -> throughput.json
#   vllm        tests/gpu/test_vllm_cuda.py: vLLM logprobs vs the CUDA learner's  -> vllm.json
#   gateway     bench.gateway --engine vllm: gateway vs direct engine time per token
#               at 1, 8, 32 concurrent episodes (goal <= 1.2x), shared layout      -> gateway.json
#   ranks       with >= 2 GPUs: SAO step on 2 ranks (NCCL, FSDP2) vs 1 rank      -> ranks.json
#   summary     every check judged (tolerances in scripts/gpu_check.py, LIMITS)  -> gpu_check.json, summary.txt
# Each part's output is in OUT_DIR/<part>.log. The exit status is 0 when every check passed and no
# part is missing. Python: $PY, else .venv/bin/python, else python3. Nothing is downloaded; the
# models have random weights. KEEP_MODELS=1 keeps $OUT/models. GPU_CHECK_DEVICE=cpu is a dry run of
# the script itself on a machine without a GPU (tiny model only; the vllm part then skips; the
# gateway part runs the hf engine, 1 concurrency level, 1 round).
set -uo pipefail

OUT=${1:-bench/results/gpu_check/$(date -u +%Y%m%dT%H%M%SZ)}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || exit 2
case $OUT in /*) ;; *) [ -n "${1:-}" ] || OUT="$REPO/$OUT" ;; esac
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
cd "$REPO" || exit 2
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
BUDGET=${GPU_CHECK_BUDGET_S:-500}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
export PYTHONPATH="$REPO/src:$REPO${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
START=$SECONDS
: > "$OUT/parts.tsv"

# part NAME LIMIT_S COMMAND...: run COMMAND with at most LIMIT_S seconds (less if the budget is short).
part() {
  local name=$1 limit=$2 left rc t0
  shift 2
  left=$((BUDGET - (SECONDS - START)))
  if (( left < 20 )); then
    echo "skip  $name: ${left}s of the ${BUDGET}s budget left" | tee -a "$OUT/parts.tsv"
    return 0
  fi
  (( limit > left )) && limit=$left
  t0=$SECONDS
  echo "run   $name (at most ${limit}s)"
  timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  (( rc == 124 || rc == 137 )) && echo "      $name: stopped at its ${limit}s limit" >> "$OUT/$name.log"
  printf '%s\t%s\t%ss\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$OUT/parts.tsv"
}

part env 30 bash -c 'nvidia-smi; '"$PY"' -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])"'
if [ "$DEVICE" = cpu ]; then
  # A dry run of this script without a GPU: the same parts on the CPU (bf16 autocast), tiny model only.
  GPUS=2 PARITY_ARGS=(--shapes tiny) THROUGHPUT_ARGS=(--shape tiny --steps 1 --tokens 256)
  GATEWAY_ARGS=(--engine hf --concurrency 2 --rounds 1 --min-episodes 2 --turns 2 --tokens 8)
else
  GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  PARITY_ARGS=() THROUGHPUT_ARGS=()
  # Fewer episodes and rounds than the CPU defaults (bench.gateway), so the part fits its limit.
  GATEWAY_ARGS=(--engine vllm --concurrency 1 8 32 --rounds 3 --episodes-per-slot 1 --min-episodes 4)
  if [ "${GPUS:-0}" -lt 1 ]; then
    echo "no CUDA device visible to torch ($PY); nothing to check (see $OUT/env.log)" >&2
    exit 2
  fi
fi
# The models (tiny, and the 0.5B shape: 2 GB) are built once under $OUT/models and removed at the end.
part parity 150 "$PY" scripts/gpu_check.py parity "$OUT/parity.json" --device "$DEVICE" --models "$OUT/models" \
  ${PARITY_ARGS[@]+"${PARITY_ARGS[@]}"}
part throughput 80 "$PY" scripts/gpu_check.py throughput "$OUT/throughput.json" --device "$DEVICE" \
  --models "$OUT/models" ${THROUGHPUT_ARGS[@]+"${THROUGHPUT_ARGS[@]}"}
part vllm 150 env GPU_VLLM_RESULTS="$OUT/vllm.json" "$PY" -m pytest -q -s -m gpu -p no:cacheprovider \
  tests/gpu/test_vllm_cuda.py
# --no-docs: the results file only (docs/benchmarks.md is not touched); --out relative to the repository when
# OUT is inside it, so the recorded command names no path of the machine.
part gateway 150 "$PY" -m bench.gateway --out "${OUT#"$REPO"/}/gateway.json" --no-docs --layouts shared \
  "${GATEWAY_ARGS[@]}"
RANKS=()
if [ "$GPUS" -ge 2 ]; then
  RANKS=(--ranks)
  part ranks 90 "$PY" scripts/gpu_check.py ranks "$OUT/ranks.json" --device "$DEVICE" --models "$OUT/models"
else
  echo "skip  ranks: 1 GPU" | tee -a "$OUT/parts.tsv"
fi
"$PY" scripts/gpu_check.py summary "$OUT" ${RANKS[@]+"${RANKS[@]}"}
rc=$?
[ "${KEEP_MODELS:-0}" = 1 ] || rm -rf "$OUT/models"
echo "total $((SECONDS - START))s; results in $OUT/ (gpu_check.json, summary.txt, <part>.log)"
exit $rc
