r"""benchmarks/accelerator.py's measurements beside benchmarks/roofline.py's predictions.

  python -m benchmarks.accelerator ... | tee acc.txt      # the RESULTS {...} line
  JAX_PLATFORMS=cpu python -m benchmarks.roofline --shapes rho-1b --recipes accelerator \
      --json pred.json
  python -m benchmarks.measured_vs_predicted acc.txt pred.json --chip H200

(benchmarks/gpu.sh and tpu.sh run all three.) One markdown table: decode tokens/s at
batch 64 and 256, the update's tokens/s and MFU, the weight publish's seconds; measured,
predicted (the roofline bound: measured / predicted is the fraction of it reached). The
MFU row has no prediction: the bound is compute-bound for the update, so its MFU would
be 100% by construction; the update's measured / predicted tokens/s is the comparable
figure (accelerator.py's MFU counts 6 x params FLOPs a token, the bound XLA's FLOPs).
The publish's bound is roofline.sync_bytes (float32 read + bfloat16 written, 6 bytes a
parameter) over the HBM bandwidth.
"""
from __future__ import annotations

import argparse
import json

from benchmarks import roofline


def rows(measured: dict, predicted: dict, chip: dict) -> list[tuple[str, float, float | None]]:
  c = predicted["costs"]
  r = predicted["recipe"]
  out = []
  for b in roofline.DECODE_BATCHES:
    if f"sampler_b{b}" in measured:
      out.append((f"decode tok/s, batch {b}", measured[f"sampler_b{b}"]["tokens_per_s"],
                  b / roofline.seconds(c[f"decode{b}"], chip)))
  t = roofline.seconds(c["update"], chip)
  tokens = r["rows"] * r.get("train_len", r["prompt_len"] + r["new_tokens"])
  out.append(("update tok/s", measured["trainer"]["tokens_per_s"], tokens / t))
  out.append(("update MFU %", 100 * measured["trainer"]["mfu"], None))  # the bound's: 100%
  out.append(("weight publish s (float32 -> bfloat16)", measured["sync"]["seconds"],
              roofline.sync_bytes("rho-1b") / (chip["hbm_gbps"] * 1e9)))
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("measured", help="benchmarks/accelerator.py's output (its RESULTS line)")
  parser.add_argument("predicted", help="benchmarks/roofline.py --json output")
  parser.add_argument("--chip", default="H200", choices=sorted(roofline.CHIPS))
  parser.add_argument("--key", default="rho-1b/accelerator")
  args = parser.parse_args(argv)
  line = next(l for l in open(args.measured) if l.startswith("RESULTS "))
  measured = json.loads(line[len("RESULTS "):])
  predicted = json.load(open(args.predicted))[args.key]
  print(f"| {args.chip}: RhoMath-1B shape | measured | predicted (roofline bound) | "
        "measured / predicted |")
  print("|---|---|---|---|")
  for name, m, p in rows(measured, predicted, roofline.CHIPS[args.chip]):
    print(f"| {name} | {m:,.3g} | -- | -- |" if p is None else
          f"| {name} | {m:,.3g} | {p:,.3g} predicted | {m / p:.2f} |")


if __name__ == "__main__":
  main()
