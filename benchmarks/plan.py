r"""A planner: how to split N chips between TBA's trainer and searchers, and how to run them,
from the pipeline model (benchmarks/pipeline_model.py). Every figure it prints is predicted.

  python -m benchmarks.plan --model rho-1b --chip A100 --devices 4 --task gsm8k
  python -m benchmarks.plan --model qwen2.5-7b --chip v5p --devices 64 --task pod
  python -m benchmarks.plan --predictions        # the layouts users ask about

For each split (trainer chips t, N - t searchers of one chip each), sync period k, prompts
per searcher batch P and paced or not, it simulates the run and keeps the layouts whose m
branch trains on samples no staler on average than --max_staleness (default: the paper
split's); of those it recommends the one that trains the most fresh samples a second
(samples trained for the first time: in async mode the trainer never waits, so a trainer
faster than its searchers replays, which adds updates but not data). Beside it: the
paper's split (its trainer count, else a quarter of the chips; the recipe's P and k) and
synchronous on-policy training on all N chips (B x K rows spread over the N chips, then
the update on all N: sync.mode=alternate, k=1, m=1, S=K). Per-role costs:
benchmarks/pipeline_costs.py (measured on the H200 for RhoMath-1B's shape; elsewhere the
roofline bound over the H200's measured efficiency).
"""
from __future__ import annotations

import argparse
import dataclasses
import math

from benchmarks import pipeline_costs
from benchmarks.pipeline_model import Costs, Layout, RunConfig, simulate


@dataclasses.dataclass(frozen=True)
class Task:
  """A recipe's shape: the config keys the pipeline depends on, and the paper's layout."""
  num_prompts: int          # B
  samples_per_prompt: int   # K
  samples_per_search: int   # S
  prompts_per_search: int   # P (the recipe's)
  sync_every: int           # k (the recipe's)
  m: float
  prefill: int
  prompt_len: int           # tokens (the recipe's maximum: static batches are padded to it)
  new_tokens: int           # decode steps of a batch (it runs to its longest row)
  microbatches: int
  num_train_prompts: int
  recipe: str               # pipeline_costs.ROOFLINE's lengths
  reward_model: bool        # a reward model scores every row (a forward of the policy's shape)
  num_updates: int          # the run's length
  source: str
  paper_trainers: int = 0   # the paper's trainer chips (0: a quarter of them)
  max_per_prompt: int = 100
  # Red-teaming: each attack gets `victim_replies` replies of the victim's shape, and a judge
  # of that shape reads each (the search batch's scoring pass of the victim's role).
  victim: str = ""
  victim_replies: int = 0
  victim_prompt_len: int = 0
  victim_new_tokens: int = 0


TASKS = {
    "gsm8k": Task(7, 20, 24, 3, 2, 0.95, 500, 320, 512, 7, 7473, "gsm8k", False, 700,
                  "configs/gsm8k.py:rho1b (the paper's GSM8K run)"),
    "tldr": Task(8, 20, 20, 2, 10, 0.5, 10_000, 512, 128, 8, 116_722, "tldr", True, 256,
                 "configs/tldr.py (the paper's TL;DR run)"),
    # benchmarks/pod.py's trainer shape: 4 micro-batches of 64 rows, 384 + 512 tokens.
    "pod": Task(32, 8, 10, 8, 2, 0.95, 500, 384, 512, 4, 7473, "gsm8k", False, 700,
                "benchmarks/pod.py's shape (32 prompts x 8, 384 + 512 tokens), GSM8K's m, k"),
    # configs/redteam.py:llama: one prompt, 128 attacks an update, 16 a searcher batch, k 10,
    # m 0.5, 2 trainers + 6 searchers; Llama-3.2-1B as RhoMath-1B's shape, Llama-3.1-8B
    # (victim) and Llama-Guard-3-8B (judge) as Qwen2.5-7B's; LoRA trained as full weights.
    "redteam": Task(1, 128, 16, 1, 10, 0.5, 512, 64, 21, 1, 1, "redteam", False, 5000,
                    "configs/redteam.py:llama (the paper's Llama red-teaming run)",
                    paper_trainers=2, max_per_prompt=150_000, victim="qwen2.5-7b",
                    victim_replies=5, victim_prompt_len=96, victim_new_tokens=64),
}
SPLIT_KS = (1, 2, 4, 10)
SPLIT_PROMPTS = (1, 3, 8)


@dataclasses.dataclass(frozen=True)
class Choice:
  trainers: int
  searchers: int
  prompts_per_search: int
  sync_every: int
  paced: bool


@dataclasses.dataclass(frozen=True)
class Roles:
  """The models a layout runs: the policy's, and red-teaming's victim (and judge)."""
  policy: pipeline_costs.RoleModel
  victim: pipeline_costs.RoleModel | None = None

  @property
  def sources(self) -> tuple[tuple[str, str], ...]:
    return self.policy.sources + (() if self.victim is None else tuple(
        (f"victim {name}", how) for name, how in self.victim.sources))


def roles_for(model: str, chip: str, task: Task) -> Roles:
  return Roles(pipeline_costs.role_model(model, chip, task.recipe),
               pipeline_costs.role_model(task.victim, chip, task.recipe) if task.victim
               else None)


def costs(roles: Roles, task: Task, prompts: int, samples: int, trainers: int,
          searchers: int, spread: int = 1) -> Costs:
  """A layout's per-role seconds: a searcher batch of `prompts` x `samples` rows (spread
  over `spread` chips, data-parallel), an update on `trainers` chips, a publish to each
  searcher of a host (one after another, as searcher_pool.publish; hosts at once)."""
  policy, victim = roles.policy, roles.victim
  rows = math.ceil(prompts * samples / spread)
  per_prompt = math.ceil(prompts / spread)
  reward = ((task.prompt_len + task.new_tokens) / policy.forward_tok_s if task.reward_model
            else 0.0)
  search = policy.search_batch_s(rows, per_prompt, task.prompt_len, task.new_tokens, reward)
  if victim is not None:  # each attack's replies, and the judge's pass over them
    search += victim.search_batch_s(rows * task.victim_replies, rows, task.victim_prompt_len,
                                    task.victim_new_tokens)
  update = policy.update_s(task.num_prompts * task.samples_per_prompt,
                           task.prompt_len + task.new_tokens, trainers, task.microbatches)
  hosts = math.ceil((trainers + searchers) / pipeline_costs.host_chips(policy.chip))
  return Costs(search, update, math.ceil(searchers / hosts) * policy.publish_s, roles.sources)


def tba(roles: Roles, task: Task, choice: Choice, num_updates: int = 60):
  """The pipeline model's run of one TBA layout."""
  c = RunConfig(task.num_prompts, task.samples_per_prompt, task.samples_per_search,
                choice.prompts_per_search, choice.sync_every, task.m, task.prefill,
                paced=choice.paced, max_per_prompt=task.max_per_prompt,
                num_train_prompts=task.num_train_prompts)
  return simulate(Layout(num_searchers=choice.searchers), c,
                  costs(roles, task, choice.prompts_per_search, task.samples_per_search,
                        choice.trainers, choice.searchers), num_updates)


def synchronous(roles: Roles, task: Task, devices: int, num_updates: int = 8):
  """On-policy training on all `devices`: B x K fresh rows spread over them, then the
  update on all of them (alternate mode, k=1, m=1, S=K, nothing reused)."""
  b, k = task.num_prompts, task.samples_per_prompt
  c = RunConfig(b, k, k, b, 1, 1.0, b * k, max_per_prompt=k,
                num_train_prompts=task.num_train_prompts)
  return simulate(Layout(num_searchers=1, mode="alternate"), c,
                  costs(roles, task, b, k, devices, 0, spread=devices), num_updates)


def paper_choice(task: Task, devices: int) -> Choice:
  """The paper's split (or a quarter of the chips training), the recipe's P and k."""
  trainers = task.paper_trainers or max(1, devices // 4)
  return Choice(trainers, devices - trainers, task.prompts_per_search, task.sync_every, False)


def choices(task: Task, devices: int):
  trainers = sorted({t for t in (1, 2, 4, 8, 16, 32, devices // 4, devices // 2,
                                 3 * devices // 4) if 1 <= t < devices})
  for t in trainers:
    for k in SPLIT_KS:
      for p in SPLIT_PROMPTS:
        for paced in (False, True):
          yield Choice(t, devices - t, p, k, paced)


def plan(roles: Roles, task: Task, devices: int, max_staleness: float | None = None,
         num_updates: int = 60):
  """(best choice, its result, the paper's (choice, result), the synchronous result, the
  bound): the best trains the most fresh samples a second (each sample counted once: replay
  does not add throughput) with the m branch's mean staleness within `max_staleness` (None:
  the paper's split's), ties to the fresher; the paper's split is a candidate, so within its
  own staleness the best is never below it. None when no layout is within the bound."""
  if devices < 2:
    raise ValueError(f"devices={devices}: TBA's split needs at least 2 chips")
  paper = paper_choice(task, devices)
  paper_result = tba(roles, task, paper, num_updates)
  bound = paper_result.latest_staleness_mean if max_staleness is None else max_staleness
  best, best_result = None, None
  for choice in [paper, *choices(task, devices)]:
    r = paper_result if choice == paper else tba(roles, task, choice, num_updates)
    if r.latest_staleness_mean <= bound + 1e-9 and _better(r, best_result):
      best, best_result = choice, r
  return best, best_result, (paper, paper_result), synchronous(roles, task, devices), bound


def _better(r, than) -> bool:
  if than is None or r.fresh_per_second > than.fresh_per_second * (1 + 1e-3):
    return True
  return (r.fresh_per_second >= than.fresh_per_second * (1 - 1e-3) and
          r.latest_staleness_mean < than.latest_staleness_mean)


def describe(choice: Choice, r) -> str:
  return (f"{choice.trainers} trainer + {choice.searchers} searcher chips, "
          f"P={choice.prompts_per_search}, k={choice.sync_every}, "
          f"{'paced' if choice.paced else 'unpaced'}: {r.seconds_per_update:.2f} s an update, "
          f"{r.fresh_per_second:.1f} fresh samples/s ({r.trained_per_second:.1f} trained), "
          f"staleness mean {r.staleness_mean:.2f}, of the m branch "
          f"{r.latest_staleness_mean:.2f}; trainer idle {r.trainer_idle:.2f}, searchers idle "
          f"{r.searcher_idle:.2f}, produced / trained "
          f"{r.samples_produced / max(r.samples_trained, 1):.2f}")


def report(model: str, chip: str, devices: int, task_name: str,
           max_staleness: float | None = None, num_updates: int = 60) -> list[str]:
  """The planner's printout (every figure predicted)."""
  task = TASKS[task_name]
  chosen = roles_for(model, chip, task)
  best, r, (paper, pr), sync, bound = plan(chosen, task, devices, max_staleness, num_updates)
  minutes = lambda run: (run.prefill_seconds + task.num_updates * run.seconds_per_update) / 60
  lines = [f"# plan (predicted): {model} on {devices} x {chip}, task {task_name} "
           f"({task.source}: B {task.num_prompts} x K {task.samples_per_prompt}, S "
           f"{task.samples_per_search}, {task.prompt_len} + {task.new_tokens} tokens, m "
           f"{task.m}); the m branch's staleness bound {bound:.2f}"
           f"{' (the paper split' + chr(39) + 's)' if max_staleness is None else ''}; "
           f"{num_updates} simulated updates a layout; minutes for the task's "
           f"{task.num_updates} updates, pre-fill included"]
  lines += [f"- per-role costs: {name}: {how}" for name, how in chosen.sources]
  if best is None:
    lines.append(f"- recommended: none keeps the m branch's staleness within {bound}")
  else:
    lines.append(f"- recommended: {describe(best, r)}; {minutes(r):.0f} min")
  lines.append(f"- the paper's split: {describe(paper, pr)}; {minutes(pr):.0f} min")
  lines.append(f"- synchronous on-policy on all {devices}: {sync.seconds_per_update:.2f} s an "
               f"update, {sync.fresh_per_second:.1f} fresh samples/s; {minutes(sync):.0f} min")
  if best is not None:
    lines.append(f"- speed-up in fresh samples/s: "
                 f"{r.fresh_per_second / sync.fresh_per_second:.2f}x over synchronous, "
                 f"{r.fresh_per_second / pr.fresh_per_second:.2f}x over the paper's split")
  return lines


# The layouts users ask about (docs/pipeline_model.md quotes them): (model, chip, devices, task).
PREDICTIONS = (("rho-1b", "A100", 4, "gsm8k"), ("rho-1b", "A100", 4, "tldr"),
               ("rho-1b", "A100", 8, "redteam"), ("rho-1b", "H200", 4, "gsm8k"),
               ("qwen2.5-7b", "v5p", 64, "pod"))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="rho-1b", choices=sorted(pipeline_costs.PARAMS))
  parser.add_argument("--chip", default="A100", choices=sorted(pipeline_costs.CHIPS))
  parser.add_argument("--devices", type=int, default=4)
  parser.add_argument("--task", default="gsm8k", choices=sorted(TASKS))
  parser.add_argument("--max_staleness", type=float, default=None,
                      help="the largest mean staleness (updates) of the m branch's samples; "
                      "default: the paper's split's")
  parser.add_argument("--updates", type=int, default=60, help="simulated updates a layout")
  parser.add_argument("--predictions", action="store_true",
                      help="print the plan of every layout in PREDICTIONS")
  args = parser.parse_args(argv)
  todo = PREDICTIONS if args.predictions else ((args.model, args.chip, args.devices, args.task),)
  for model, chip, devices, task in todo:
    print("\n".join(report(model, chip, devices, task, args.max_staleness, args.updates)) + "\n",
          flush=True)


if __name__ == "__main__":
  main()
