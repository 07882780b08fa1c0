r"""benchmarks/gpu.sh's summary: its parts' outputs read into one JSON file and a few lines.

  python -m benchmarks.gpu_summary OUT --deadline_s 540 --total_s 512 \
      [--predicted benchmarks/results/predicted_rho1b.json --chip H200]

Reads OUT/parts.jsonl (one line a part, gpu.sh's `part`: name, exit code or "skipped",
seconds, limit), OUT/decode.json and OUT/decode_cublas.json (benchmarks/accelerator.py
--json under the default XLA flags and under --xla_gpu_enable_triton_gemm=false),
OUT/learn_tba/ and OUT/learn_trl/ (benchmarks/trl_grpo.py --tba_only / --trl_only), and
writes OUT/summary.json: per part its seconds and status (ok, failed N, timed out, skipped:
why); decode tok/s, step and fraction of the HBM roofline at each batch, beside the
roofline bound's tokens/s (--predicted: benchmarks/roofline.py --json, RhoMath-1B's shape)
and the fraction of it reached; the update's tokens/s and MFU; the weight publish beside
its floor (6 bytes a parameter over the HBM bandwidth: float32 read, bfloat16 written);
each learning arm's held-out accuracy start -> end, updates, training seconds, step time
(tba_jax: also staleness and the largest sampler_mismatch), its evaluations, and the ratio of the two arms' training times
to the best accuracy both reached. A part that wrote nothing leaves its figures null.
"""
import argparse
import json
import math
import os
import statistics

from benchmarks import roofline, trl_grpo

TIMED_OUT = (124, 137)  # timeout(1)'s TERM, then KILL
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "torch", "transformers", "trl",
            "accelerate", "datasets", "pyarrow")


def versions() -> dict:
  """The installed versions of the packages the parts use (None: absent), and JAX's devices."""
  import importlib.metadata
  out = {}
  for name in PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  import jax
  out["devices"] = [str(d) for d in jax.devices()]
  return out


def status(rc) -> str:
  if rc == "skipped":
    return "skipped"
  return "ok" if rc == 0 else "timed out" if rc in TIMED_OUT else f"failed {rc}"


def read_json(path: str):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def parts(out: str) -> dict:
  rows = {}
  path = os.path.join(out, "parts.jsonl")
  for line in open(path) if os.path.exists(path) else ():
    r = json.loads(line)
    rows[r["part"]] = {"status": status(r["rc"]), "seconds": r["seconds"],
                       "limit_s": r["limit_s"], **({"why": r["why"]} if r.get("why") else {})}
  return rows


def accelerator(measured: dict | None, predicted: dict | None, chip: dict) -> dict:
  """Decode per batch, the update and the sync of one accelerator.py run (None: no run)."""
  if not measured:
    return {"decode": {}, "update": None, "sync": None}
  decode = {}
  for key, m in measured.items():
    if key.startswith("sampler_b"):
      b = int(key[len("sampler_b"):])
      row = {k: m[k] for k in ("tokens_per_s", "step_ms", "hbm_roofline_fraction")}
      row["kernels_per_step"] = m.get("profile", {}).get("kernels_per_step")
      cost = (predicted or {}).get("costs", {}).get(f"decode{b}")
      row["predicted_tokens_per_s"] = b / roofline.seconds(cost, chip) if cost else None
      row["of_predicted"] = (m["tokens_per_s"] / row["predicted_tokens_per_s"]
                             if cost else None)
      decode[b] = row
  sync = measured.get("sync")
  if sync:
    floor = 6 * measured["params"] / (measured["hbm_gbps"] * 1e9)
    sync = {"seconds": sync["seconds"], "floor_seconds": floor,
            "times_floor": sync["seconds"] / floor}
  return {"decode": decode, "update": measured.get("trainer"), "sync": sync}


def learning_arm(folder: str, name: str) -> dict | None:
  """One arm's curves (trl_grpo's curves.json in `folder`) and its figures."""
  saved = read_json(os.path.join(folder, "curves.json")) or {}
  metrics = os.path.join(folder, "tba_jax", "metrics.jsonl")
  if name == "tba_jax" and name not in saved and os.path.exists(metrics):
    saved[name] = trl_grpo.tba_curves(os.path.dirname(metrics))  # a run cut off: its log
  if name not in saved:
    return None
  curves = saved[name]
  evals, train = curves["evals"], curves["train"]
  out = {"accuracy_start": evals[0]["accuracy"] if evals else None,
         "accuracy_end": evals[-1]["accuracy"] if evals else None,
         "updates": trl_grpo.summary(curves)["steps"] if evals else 0,
         "train_seconds": train[-1]["seconds"] if train else 0.0,
         "evals": [{k: e[k] for k in ("seconds", "updates", "accuracy", "se")} for e in evals]}
  out["step_seconds"] = out["train_seconds"] / out["updates"] if out["updates"] else None
  if name == "tba_jax" and os.path.exists(metrics):
    from tba_jax.metrics import read_jsonl
    rows = [r for r in read_jsonl(metrics) if "loss" in r]
    if rows:  # the first update's time holds the compilation: the median leaves it out
      out["step_seconds"] = statistics.median(r["step_seconds"] for r in rows)
      out["staleness_mean"] = statistics.mean(r["staleness_mean"] for r in rows)
      # the searchers' log-probs against the trainer's function on the same weights
      gaps = [g for g in (r.get("sampler_mismatch") for r in rows)
              if g is not None and not math.isnan(g)]  # (NaN: not checked at that step)
      out["sampler_mismatch_max"] = max(gaps, default=None)
  return out


def time_ratio(ours: dict | None, theirs: dict | None) -> dict | None:
  """Each arm's training seconds to the best accuracy both reached, and ours / theirs."""
  if not (ours and theirs and ours["evals"] and theirs["evals"]):
    return None
  target = min(max(e["accuracy"] for e in a["evals"]) for a in (ours, theirs))
  at = [next(e["seconds"] for e in a["evals"] if e["accuracy"] >= target)
        for a in (ours, theirs)]
  return {"accuracy": target, "tba_jax_s": at[0], "trl_s": at[1],
          "ratio": at[0] / at[1] if at[1] else None}


def summarize(out: str, deadline_s: float, total_s: float, predicted_path: str = "",
              chip: str = "H200", dry_run: bool = False) -> dict:
  predicted = read_json(predicted_path)["rho-1b/accelerator"] if predicted_path else None
  runs = {flags: accelerator(read_json(os.path.join(out, f"{part}.json")), predicted,
                             roofline.CHIPS[chip])
          for flags, part in (("default", "decode"), ("cublas_gemm", "decode_cublas"))}
  tba = learning_arm(os.path.join(out, "learn_tba"), "tba_jax")
  trl = learning_arm(os.path.join(out, "learn_trl"), "TRL GRPO")
  device = (read_json(os.path.join(out, "decode.json")) or {}).get("device")
  return {
      "dry_run": dry_run, "device": device, "chip": chip, "deadline_s": deadline_s,
      "total_s": total_s, "versions": read_json(os.path.join(out, "versions.json")),
      "parts": parts(out),
      "decode": {flags: r["decode"] for flags, r in runs.items()},
      "update": {flags: r["update"] for flags, r in runs.items()},
      "sync": runs["default"]["sync"],
      "learning": {"tba_jax": tba, "trl": trl, "time_to_common_accuracy": time_ratio(tba, trl)},
  }


def lines(s: dict) -> list[str]:
  f = lambda v, spec: "--" if v is None else format(v, spec)
  out = [f"== summary{' (dry run)' if s['dry_run'] else ''}: {s['device']}, "
         f"{s['total_s']:.0f} s of a {s['deadline_s']:.0f} s deadline"]
  for name, p in s["parts"].items():
    out.append(f"  {name:<14} {p['status']} ({p['why']})" if "why" in p else
               f"  {name:<14} {p['status']}, {p['seconds']:.0f} s (limit {p['limit_s']} s)")
  for flags, decode in s["decode"].items():
    for b, d in decode.items():
      out.append(f"  decode b{b:<4} {flags:<12} {d['tokens_per_s']:>10,.0f} tok/s, "
                 f"{d['hbm_roofline_fraction']:6.1%} of the HBM roofline, "
                 f"{f(d['of_predicted'], '.2f')} of the bound's tok/s" +
                 (f", {d['kernels_per_step']:.0f} kernels a step" if d["kernels_per_step"]
                  else ""))
  for flags, u in s["update"].items():
    if u:
      out.append(f"  update {flags:<12} MFU {u['mfu']:.1%}, {u['tokens_per_s']:,.0f} tok/s")
  if s["sync"]:
    out.append(f"  sync {s['sync']['seconds'] * 1e3:.2f} ms, floor "
               f"{s['sync']['floor_seconds'] * 1e3:.2f} ms ({s['sync']['times_floor']:.1f}x)")
  for name, arm in s["learning"].items():
    if name == "time_to_common_accuracy":
      if arm:
        out.append(f"  time to {arm['accuracy']:.3f}: tba_jax {arm['tba_jax_s']:.0f} s, TRL "
                   f"{arm['trl_s']:.0f} s, ratio {f(arm['ratio'], '.2f')}")
    elif arm:
      out.append(f"  {name:<8} accuracy {f(arm['accuracy_start'], '.3f')} -> "
                 f"{f(arm['accuracy_end'], '.3f')}, {arm['updates']} updates in "
                 f"{arm['train_seconds']:.0f} s, step {f(arm['step_seconds'], '.2f')} s" +
                 (f", staleness {arm['staleness_mean']:.2f}, sampler mismatch (max) "
                  f"{f(arm['sampler_mismatch_max'], '.2g')}" if "staleness_mean" in arm else ""))
    else:
      out.append(f"  {name:<8} no curves")
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("out", help="gpu.sh's output folder")
  parser.add_argument("--versions", action="store_true",
                      help="only write OUT/versions.json: packages and devices (gpu.sh's env)")
  parser.add_argument("--deadline_s", type=float, default=0.0)
  parser.add_argument("--total_s", type=float, default=0.0)
  parser.add_argument("--predicted", default="", help="benchmarks/roofline.py --json output")
  parser.add_argument("--chip", default="H200", choices=sorted(roofline.CHIPS))
  parser.add_argument("--dry_run", action="store_true")
  args = parser.parse_args(argv)
  if args.versions:
    found = versions()
    with open(os.path.join(args.out, "versions.json"), "w") as f:
      json.dump(found, f, indent=1)
    print(found)
    return
  s = summarize(args.out, args.deadline_s, args.total_s, args.predicted, args.chip,
                args.dry_run)
  with open(os.path.join(args.out, "summary.json"), "w") as f:
    json.dump(s, f, indent=1)
  print("\n".join(lines(s)))
  print(f"  -> {os.path.join(args.out, 'summary.json')}")


if __name__ == "__main__":
  main()
