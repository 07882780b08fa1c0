#!/usr/bin/env bash
# One accelerator, under 10 minutes: the attention backends' numerics on this device
# (tests/attention_test.py: cudnn / pallas against xla), sampler tokens/s and HBM roofline
# fraction (static batches and the streaming sampler at 64 and 256 slots), trainer MFU,
# weight-sync time (benchmarks/accelerator.py, attention_impl auto, falling back to xla;
# then decode and the update with cuBLAS gemms in place of Triton's, decode profiled),
# each printed beside benchmarks/roofline.py's prediction for this chip
# (benchmarks/measured_vs_predicted.py), then a short asynchronous GSM8K-format run of a
# random-init model of RhoMath-1B's shape. Everything goes to ${OUT:-/tmp/tba_gpu}.
#
#   bash benchmarks/gpu.sh                    # H200 figures by default
#   CHIP=H100 HBM_GBPS=3350 bash benchmarks/gpu.sh
#   (TPU: benchmarks/tpu.sh, the same with a TPU chip's figures)
#
# Needs jax with the accelerator plugin, flax, optax, orbax-checkpoint, transformers,
# ml-collections, gguf, tensorboardX (pip install -e . on a machine with network; on an
# offline machine, carry wheels in .whl/ and they are installed first).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/tba_gpu}"
run="${RUN_DIR:-/tmp/tba_gpu_run}"  # checkpoints and all, outside $out
mkdir -p "$out"
rm -rf "$run"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/tba_site .whl/*.whl
  export PYTHONPATH="/tmp/tba_site:${PYTHONPATH:-}"
fi
export PYTHONUNBUFFERED=1
# Each part has its own time limit (a lent machine's minutes are few), so one that hangs or
# breaks leaves the others' figures; PREDICTED=file.json reuses a prediction computed
# beforehand on any CPU (the roofline part compiles on the host, a minute).
part() { local limit=$1; shift; timeout "$limit" "$@" || echo "== (that part ended with status $?)"; }
{
  echo "== $(date -u) $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true)"
  python3 -c "import jax, flax, optax, orbax.checkpoint as o; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'orbax', o.__version__, jax.devices())"
  echo "== attention backends on this device (tests/attention_test.py)"
  JAX_PLATFORMS="${JAX_PLATFORMS:-cuda}" part 120 python3 -m pytest -q -p no:cacheprovider tests/attention_test.py 2>&1 | tail -n 5
  acc=(python3 -m benchmarks.accelerator --hbm_gbps "${HBM_GBPS:-4800}" --peak_tflops "${PEAK_TFLOPS:-989}")
  part 300 "${acc[@]}" --attention_impl auto | tee "$out/accelerator.txt"
  grep -q RESULTS "$out/accelerator.txt" || part 200 "${acc[@]}" --attention_impl xla | tee "$out/accelerator.txt"
  echo "== cuBLAS gemms instead of Triton's (they read the layer scan's weight slices in place)"
  XLA_FLAGS="--xla_gpu_enable_triton_gemm=false ${XLA_FLAGS:-}" part 200 "${acc[@]}" \
    --parts sampler,trainer --sampler_batches 8,64 --profile "$run/profile" 2>&1 | { grep -v RESULTS || true; }
  echo "== measured beside predicted (${CHIP:-H200})"
  predicted="${PREDICTED:-$out/predicted.json}"
  [[ -f "$predicted" ]] || JAX_PLATFORMS=cpu python3 -m benchmarks.roofline --shapes rho-1b \
    --recipes accelerator --json "$predicted" > "$out/roofline.txt"
  python3 -m benchmarks.measured_vs_predicted "$out/accelerator.txt" "$predicted" \
    --chip "${CHIP:-H200}" || true
  echo "== short async run (random RhoMath-1B shape, arithmetic task, 20 steps)"
  part 200 python3 -m experiments.gsm8k --config configs/gsm8k.py:rho1b --workdir "$run" \
    --compilation_cache= --config.model.path=random --config.model.tokenizer=bytes \
    --config.model.random.vocab_size=32000 --config.model.random.dim=2048 \
    --config.model.random.mlp_dim=5632 --config.model.random.num_layers=22 \
    --config.model.random.num_heads=32 --config.model.random.num_kv_heads=4 \
    --config.model.random.head_dim=64 --config.task.name=arithmetic \
    --config.task.prompt_style="{question}" --config.task.max_prompt_len=32 \
    --config.sampler.max_new_tokens=256 --config.num_train_steps=20 --config.eval.every=0 \
    --config.eval.num_problems=64 --config.eval.max_new_tokens=256 --config.export=False \
    --config.buffer.prefill=140 2>&1 | tail -n 5
  cp "$run/metrics.jsonl" "$out/async_run_metrics.jsonl" || true
  [[ -f "$run/metrics.jsonl" ]] && python3 - "$run/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
train = [r for r in rows if "loss" in r]
print(f"async run: {len(train)} steps, median step {sorted(r['step_seconds'] for r in train)[len(train)//2]:.2f} s, "
      f"tokens/s {sorted(r['tokens_per_second'] for r in train)[len(train)//2]:.0f}, "
      f"staleness mean {sum(r['staleness_mean'] for r in train)/len(train):.2f}, "
      f"trainer idle {train[-1]['trainer_idle_fraction']:.2f}, searcher busy {train[-1]['searcher_busy_fraction']:.2f}")
PY
} 2>&1 | tee "$out/results.txt"
