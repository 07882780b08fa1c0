#!/usr/bin/env bash
# One accelerator, one command, one deadline: everything below finishes DEADLINE_S seconds
# (540 by default) after the script starts. Each part runs under the smaller of its own
# limit and the time left, and is skipped, saying so, when less than its minimum is left:
#   env            versions and devices
#   decode         benchmarks/accelerator.py on a random RhoMath-1B-shaped model: decode
#                  tok/s and HBM roofline fraction at batch 8/64/256 (each profiled: kernels
#                  a step), the TB update's MFU, the weight publish
#   decode_cublas  the same under XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
#   learn_tba      the embedded default (configs/gsm8k.py:cpu, SmolLM2-135M-Instruct) trained
#                  on this device for LEARN_S (120) seconds, or half of what is left, held-out
#                  evaluations (skipped under 60 s)
#   learn_trl      TRL's GRPOTrainer on the same model, task, prompts and evaluation on the
#                  same device for the same seconds (benchmarks/trl_grpo.py --device cuda)
#   attention      tests/attention_test.py's backends on this device
# then benchmarks/gpu_summary.py writes $OUT/summary.json (and prints it): each part's seconds
# and status, the figures beside benchmarks/results/predicted_rho1b.json (the roofline
# bound, computed on a CPU: benchmarks/roofline.py --shapes rho-1b --recipes accelerator).
#
#   bash benchmarks/gpu.sh                          # H200 figures by default
#   CHIP=H100 HBM_GBPS=3350 bash benchmarks/gpu.sh
#   DRY_RUN=1 OUT=/tmp/dry bash benchmarks/gpu.sh   # the same on this CPU at tiny shapes
#   TBA_OVERRIDES="model.dtype=bfloat16" bash benchmarks/gpu.sh  # tba_jax's arm changed
#
# The embedded model and TRL's wheels come first, in parts (benchmarks/gpu_files.py; the
# device commands are in docs/benchmarks.md, "The accelerator lease"); other wheels carried
# in .whl/ are installed too. The parts write into $RUN_DIR; ${OUT:-/tmp/tba_gpu} gets three
# files (a lent machine sends back at most 8): summary.json, results.txt (this script's
# output) and parts.tar.gz (each part's log and JSON, the learning runs' curves and metrics).
set -uo pipefail  # not -e: a part that fails leaves the others
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/tba_gpu}"
work="${RUN_DIR:-/tmp/tba_gpu_run}"
deadline="${DEADLINE_S:-540}"
reserve=20  # seconds kept for the summary and timeout's grace
dry="${DRY_RUN:-}"
rm -rf "$work"
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1
if [[ -n $dry ]]; then  # tiny shapes on the CPU: the script's plumbing, in a minute or two
  export JAX_PLATFORMS=cpu
  shapes=(--tiny --prompt_len 8 --new_tokens 8 --train_batch 4 --train_len 16 --repeats 1)
  tiny=(--tiny) learn_s="${LEARN_S:-10}" learn_min=5 overhead=40 samples=1 profile=()
else
  export PYTHONPATH="${SITE:-/tmp/tba_site}:${PYTHONPATH:-}"  # benchmarks/gpu_files.py's
  if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --target "${SITE:-/tmp/tba_site}" .whl/*.whl
  fi
  shapes=() tiny=() learn_s="${LEARN_S:-120}" learn_min=60 overhead=60 samples=8
  profile=(--profile "$work/profile")
fi

record() {  # NAME RC SECONDS LIMIT WHY: one line of $work/parts.jsonl
  printf '{"part": "%s", "rc": %s, "seconds": %s, "limit_s": %s, "why": "%s"}\n' "$@" \
    >> "$work/parts.jsonl"
}
skip() { echo "== $1: skipped ($2)"; record "$1" '"skipped"' 0 0 "$2"; }
part() {  # NAME LIMIT MIN COMMAND...: under min(LIMIT, time left); output in $work/NAME.log
  local name=$1 limit=$2 min=$3 left=$((deadline - reserve - SECONDS)) t0=$SECONDS rc=0
  shift 3
  ((limit > left)) && limit=$left
  ((limit < min)) && { skip "$name" "$left s left of the deadline, it needs $min s"; return; }
  echo "== $name (limit $limit s): $*"
  timeout -k 5 "$limit" "$@" > "$work/$name.log" 2>&1 || rc=$?
  tail -n 6 "$work/$name.log"
  record "$name" "$rc" $((SECONDS - t0)) "$limit" ""
}

{
  echo "== $(date -u) deadline $deadline s${dry:+ (dry run on the CPU)}"
  [[ -z $dry ]] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  part env 60 10 python3 -m benchmarks.gpu_summary "$work" --versions

  acc=(python3 -m benchmarks.accelerator --hbm_gbps "${HBM_GBPS:-4800}"
       --peak_tflops "${PEAK_TFLOPS:-989}" --parts sampler,trainer --sampler_batches 8,64,256
       --stream_slots "" "${shapes[@]}")
  part decode 150 60 "${acc[@]}" "${profile[@]}" --json "$work/decode.json"
  part decode_cublas 110 50 env XLA_FLAGS="--xla_gpu_enable_triton_gemm=false ${XLA_FLAGS:-}" \
    "${acc[@]}" --json "$work/decode_cublas.json"

  # Both arms train for the same seconds: LEARN_S, or half of what is left once each arm's
  # start-up and evaluations (overhead) are set aside (the attention tests get what remains).
  left=$((deadline - reserve - SECONDS))
  budget=$(((left - 2 * overhead) / 2))
  ((budget > learn_s)) && budget=$learn_s
  learn=(python3 -m benchmarks.trl_grpo --minutes "$(python3 -c "print($budget / 60)")"
         --eval_seconds $((budget / 3 > 1 ? budget / 3 : 1)) --eval_samples "$samples"
         --results_dir "$work/ledger")  # a validation run: its ledger line is in parts.tar.gz
  if ((budget < learn_min)); then
    skip learn_tba "$left s left: under $learn_min s of training for each arm"
    skip learn_trl "$left s left: under $learn_min s of training for each arm"
  else
    part learn_tba $((budget + overhead)) $((budget + 10)) "${learn[@]}" --tba_only \
      "${tiny[@]}" ${TBA_OVERRIDES:+--tba $TBA_OVERRIDES} --out "$work/learn_tba"
    if [[ -n $dry ]]; then
      skip learn_trl "dry run: TRL has no tiny model"
    elif ! why=$(python3 -c "import trl" 2>&1 | tail -n 1); then
      skip learn_trl "trl not importable: ${why//\"/\'}"
    else
      part learn_trl $((budget + overhead)) $((budget + 10)) \
        "${learn[@]}" --trl_only --device cuda --out "$work/learn_trl"
    fi
  fi

  if [[ -n $dry ]]; then
    skip attention "dry run: its backends' tests need a GPU"
  else
    part attention 120 40 env JAX_PLATFORMS=cuda python3 -m pytest -q -p no:cacheprovider \
      tests/attention_test.py
  fi

  predicted=()
  [[ -z $dry ]] && predicted=(--predicted benchmarks/results/predicted_rho1b.json)
  python3 -m benchmarks.gpu_summary "$work" --deadline_s "$deadline" --total_s "$SECONDS" \
    --chip "${CHIP:-H200}" "${predicted[@]}" ${dry:+--dry_run}
  cp "$work/summary.json" "$out/"
  tar czf "$out/parts.tar.gz" -C "$work" --exclude=checkpoints --exclude=tensorboard \
    --exclude=smollm2_hf --exclude=profile --exclude=eval_samples .
} 2>&1 | tee "$out/results.txt"
