r"""Per-role costs for the pipeline model (benchmarks/pipeline_model.py): a searcher's batch,
an update and a publish as functions of rows, lengths and devices, on a chip, each figure
labelled with where it came from ("measured: <where>" / "predicted: <how>").

  role = pipeline_costs.role_model("rho-1b", "H200")      # measured on the H200 lent
  role = pipeline_costs.role_model("rho-1b", "A100")      # predicted: roofline x efficiency
  role.search_batch_s(rows=72, prompts=3, prompt_len=320, new_tokens=512)
  role.update_s(rows=140, seq_len=832, devices=1, microbatches=7)

Where nothing was measured, a program's time is benchmarks/roofline.py's bound
(`roofline.seconds` over the FLOPs and HBM bytes its 23-minute compile recorded, copied
below from benchmarks/results/LAB_LOG.md's "Cost model" tables) divided by the fraction
of the bound the H200 reached (the log's "One H200": decode 0.16 at 64 rows, 0.15 at 256;
the update 0.39), carried to other chips and shapes: an extrapolation, labelled so. A
forward pass (prefill, reference scoring) is taken as a third of an update's FLOPs per
token. Trainer devices beyond one add FSDP's collectives (per micro-batch two all-gathers
of the bfloat16 weights, forward and recomputed backward, and a reduce-scatter of float32
gradients), timed by `pod.collective_seconds`; not compiled.
"""
from __future__ import annotations

import dataclasses

from benchmarks import pod, roofline

# A100 80 GB SXM (not in roofline.CHIPS: the paper's GSM8K and TL;DR runs used it):
# https://www.nvidia.com/en-us/data-center/a100/ (312 TFLOP/s dense bfloat16, 2,039 GB/s,
# NVLink 600 GB/s both directions: 300 each way); DGX A100: 8 GPUs on NVSwitch, one 200 Gb/s
# HDR card each for compute (25 GB/s each way). Quoted as known, not re-fetched.
CHIPS = {**roofline.CHIPS,
         "A100": dict(tflops=312.0, hbm_gbps=2039.0, hbm_gb=80.0, link_gbps=300.0,
                      node_chips=8, net_gbps=25.0)}

# Parameters (bfloat16 weights are 2 bytes each): benchmarks/pod.py's printed counts
# (Qwen2.5-7B 7.62B) and LAB_LOG.md's "One H200" (RhoMath-1B shape 1.10B).
PARAMS = {"rho-1b": 1.10e9, "qwen2.5-1.5b": 1.54e9, "qwen2.5-7b": 7.62e9}

# benchmarks/roofline.py's compiled costs (LAB_LOG.md, "Cost model", 2026-12-04): per
# (shape, recipe) the GFLOP (XLA) and HBM GB (floor) of a decode step at 64 and 256 rows and
# of an update of the recipe's rows; the recipes' lengths with them.
ROOFLINE_RECIPES = {"gsm8k": dict(prompt_len=320, new_tokens=512, rows=140),
                    "tldr": dict(prompt_len=512, new_tokens=128, rows=20),
                    "redteam": dict(prompt_len=64, new_tokens=21, rows=128)}
ROOFLINE = {
    ("rho-1b", "gsm8k"): dict(decode64=(156.4, 3.41), decode256=(605.8, 7.04),
                              update=(760_811, 64.9)),
    ("qwen2.5-1.5b", "gsm8k"): dict(decode64=(225.8, 4.65), decode256=(875.6, 9.36),
                                    update=(1_069_467, 183.2)),
    ("qwen2.5-7b", "gsm8k"): dict(decode64=(991.1, 18.33), decode256=(3_829.9, 27.62),
                                  update=(4_919_032, 389.7)),
    ("rho-1b", "tldr"): dict(decode64=(152.4, 3.13), decode256=(590.0, 5.93),
                             update=(80_175, 38.4)),
    ("qwen2.5-7b", "tldr"): dict(decode64=(981.8, 17.62), decode256=(3_792.7, 24.80),
                                 update=(520_350, 263.6)),
    ("rho-1b", "redteam"): dict(decode64=(141.0, 2.33), decode256=(544.3, 2.73),
                                update=(65_001, 38.4)),
    ("qwen2.5-7b", "redteam"): dict(decode64=(955.0, 15.59), decode256=(3_685.3, 16.65),
                                    update=(436_632, 263.8)),
}
ROOFLINE_SOURCE = "LAB_LOG.md 'Cost model: python -m benchmarks.roofline' (2026-12-04)"

# What the H200 lent on 2026-12-04 measured (LAB_LOG.md "One H200", random RhoMath-1B
# shape in bfloat16, `auto` attention, 128-token prompts, 256 new tokens, medians of 3).
H200_SOURCE = "measured: LAB_LOG.md 'One H200, 2026-12-04' (benchmarks.accelerator, auto)"
H200_DECODE = ((8, 2.69e-3), (64, 3.43e-3), (256, 5.81e-3))  # (rows, seconds a step)
H200_UPDATE_TOK_S = 60_269.0                                # TB update, 16 x 640 tokens
H200_PUBLISH_S = 2.9e-3                                     # float32 read, bfloat16 written
# The fraction of the roofline bound the H200 reached (measured / predicted, same table).
EFFICIENCY = {"decode64": 0.16, "decode256": 0.15, "update": 0.39}

# benchmarks/pod.py's compiled trainer (LAB_LOG.md "Simulated pod", Qwen2.5-7B, 4 micro-batches
# of 64 rows, 384 + 512 tokens): collective seconds per update, where a layout was compiled
# (the 8 x 8 FSDP x tensor split of 64 chips; its v5p column, all-device rings: an
# optimistic bound on the ICI).
POD_COMPILED = {("qwen2.5-7b", "v5p"): ((64, 2.92),)}
POD_SOURCE = ("predicted: benchmarks/pod.py's compiled 8 x 8 trainer on 64 chips, v5p column "
              "(LAB_LOG.md 'Simulated pod')")


@dataclasses.dataclass(frozen=True)
class RoleModel:
  """One chip kind running one model shape: the per-role cost functions, with sources."""
  decode_points: tuple[tuple[int, float], ...]  # (rows, seconds a decode step), rising rows
  forward_tok_s: float                          # prefill and scoring tokens/s, one chip
  update_tok_s: float                           # training tokens/s, one chip
  publish_s: float                              # one weight publish to a searcher
  params: float
  chip: dict
  sources: tuple[tuple[str, str], ...]
  compiled: tuple[tuple[int, float], ...] = ()  # (trainer chips, collective s) pod.py compiled

  def decode_step_s(self, rows: int) -> float:
    """Seconds a decode step at `rows` rows: linear between the points, the first point's
    time below it (a step reads the weights whatever the rows), the last point's tokens/s
    above it."""
    pts = self.decode_points
    if rows <= pts[0][0]:
      return pts[0][1]
    for (r0, t0), (r1, t1) in zip(pts, pts[1:]):
      if rows <= r1:
        return t0 + (t1 - t0) * (rows - r0) / (r1 - r0)
    return pts[-1][1] * rows / pts[-1][0]

  def search_batch_s(self, rows: int, prompts: int, prompt_len: int, new_tokens: int,
                     reward_s_per_row: float = 0.0) -> float:
    """A static batch: each prompt prefilled once (shared prefills), `new_tokens` decode
    steps (the batch runs to its longest row), the reference's scoring pass over every row,
    the reward."""
    prefill = prompts * prompt_len / self.forward_tok_s
    scoring = rows * (prompt_len + new_tokens) / self.forward_tok_s
    return (prefill + new_tokens * self.decode_step_s(rows) + scoring
            + rows * reward_s_per_row)

  def update_s(self, rows: int, seq_len: int, devices: int = 1, microbatches: int = 1) -> float:
    """An update of rows x seq_len tokens on `devices` chips: FSDP's collectives (module doc),
    or pod.py's compiled program's where one was compiled for that many chips."""
    compiled = dict(self.compiled)
    return rows * seq_len / self.update_tok_s / devices + (
        compiled[devices] if devices in compiled else
        fsdp_seconds(self.params, self.chip, devices, microbatches))


def fsdp_seconds(params: float, chip: dict, devices: int, microbatches: int) -> float:
  """FSDP's collectives of one update on `devices` chips, by pod.collective_seconds."""
  if devices <= 1:
    return 0.0
  ops = [dict(kind="all-gather", count=2 * microbatches, bytes=2 * microbatches * 2 * params,
              groups=None),
         dict(kind="reduce-scatter", count=microbatches,
              bytes=microbatches * 4 * params / devices, groups=None)]
  return pod.collective_seconds(ops, chip, devices)


def role_model(shape: str, chip_name: str, recipe: str = "gsm8k") -> RoleModel:
  """Measured figures on the H200 for the RhoMath-1B shape; else the roofline's programs
  of (shape, recipe) on the chip, divided by the H200's fractions of the bound."""
  if chip_name not in CHIPS or shape not in PARAMS:
    raise ValueError(f"chip {chip_name!r} (one of {sorted(CHIPS)}), shape {shape!r} "
                     f"(one of {sorted(PARAMS)})")
  chip, params = CHIPS[chip_name], PARAMS[shape]
  publish = 2 * params / (chip["link_gbps"] * 1e9)  # bfloat16 weights over the chip's link
  publish_src = "predicted: bfloat16 weights / link_gbps (benchmarks/pod.py's publish)"
  if chip_name == "H200" and shape == "rho-1b":
    return RoleModel(
        H200_DECODE, 3 * H200_UPDATE_TOK_S, H200_UPDATE_TOK_S, H200_PUBLISH_S, params, chip,
        (("decode", H200_SOURCE), ("update", H200_SOURCE), ("publish", H200_SOURCE),
         ("forward", "predicted: 3 x the measured update tokens/s (a forward is a third "
          "of an update's FLOPs)"),
         ("trainer collectives", "predicted: FSDP's through pod.collective_seconds")))
  if (shape, recipe) not in ROOFLINE:
    raise ValueError(f"no roofline costs for ({shape!r}, {recipe!r}): "
                     f"{sorted(ROOFLINE)}")
  c, r = ROOFLINE[(shape, recipe)], ROOFLINE_RECIPES[recipe]
  cost = lambda key: dict(flops=c[key][0] * 1e9, bytes=c[key][1] * 1e9)
  decode = tuple((b, roofline.seconds(cost(f"decode{b}"), chip) / EFFICIENCY[f"decode{b}"])
                 for b in (64, 256))
  tokens = r["rows"] * (r["prompt_len"] + r["new_tokens"])
  update_tok_s = tokens * EFFICIENCY["update"] / roofline.seconds(cost("update"), chip)
  how = (f"predicted: roofline bound ({ROOFLINE_SOURCE}) on {chip_name} / the H200's "
         "measured fraction of it")
  compiled = POD_COMPILED.get((shape, chip_name), ())
  return RoleModel(decode, 3 * update_tok_s, update_tok_s, publish, params, chip,
                   (("decode", how), ("update", how), ("publish", publish_src),
                    ("forward", "predicted: 3 x the update's tokens/s"),
                    ("trainer collectives", (POD_SOURCE + f" at {compiled[0][0]} chips; "
                                             if compiled else "") +
                     "predicted: FSDP's through pod.collective_seconds")), compiled)


def host_chips(chip: dict) -> int:
  """Chips one host (one process) drives: 8 GPUs (an HGX node), 4 TPU chips (a v4 / v5p /
  v6e VM; TPUs are the chips here without a network figure). A host publishes to its own
  searchers one after another while the hosts run at once (searcher_pool.publish)."""
  return 4 if chip.get("net_gbps") is None else 8
