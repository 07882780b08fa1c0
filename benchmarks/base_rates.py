r"""Base rates: the untrained policy's validation accuracy on configs/suite.py's tasks.

  python -m benchmarks.base_rates --tasks all --num_problems 32
  python -m benchmarks.base_rates --tasks two_op,two_digit --num_problems 128 \
      --override task.arithmetic.high=5

Each task's config (configs/suite.py:NAME, or NAME,tiny with --tiny) through the run's own
pieces (config_builders: tokenizer, model, task, evaluator), its evaluation settings (the
cpu recipe's: 32 new tokens, sampled pass@1 over 2 samples at T = 0.7) plus greedy pass@1,
on the first --num_problems problems of the validation split: what a run's step-0
evaluation would print, without starting a run. Never the test split (it is read once,
through benchmarks.suite). The model is loaded once, on one device, for every task.
"""
import argparse
import time


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tasks", default="all", help="'all' or NAME,NAME (configs/suite.py)")
  parser.add_argument("--num_problems", type=int, default=32)
  parser.add_argument("--override", action="append", default=[],
                      help="KEY=VALUE for every task's config (repeatable)")
  parser.add_argument("--tiny", action="store_true", help="the tasks' tiny configs (tests)")
  args = parser.parse_args(argv)

  import jax
  from configs import suite
  from tba_jax import config_builders as build, sharding, weight_sync

  names = list(suite.TASKS) if args.tasks == "all" else args.tasks.split(",")
  arg = lambda name: ",".join([name, *(["tiny"] if args.tiny else []), "eval.greedy=true",
                               "eval.split=validation", f"eval.num_problems={args.num_problems}",
                               *args.override])
  first = suite.get_config(arg(names[0]))
  if "target_distance" in first.eval:  # only the accuracy: no reference passes
    args.override.append("eval.target_distance=false")
  tokenizer = build.load_tokenizer(first.model)
  devices = jax.local_devices()[:1]
  model_config, params = build.load_model(first.model, tokenizer, "float32",
                                          sharding.make_mesh("trainer", devices), first.seed)
  mesh = sharding.make_mesh("searcher", devices)
  params = weight_sync.publish(params, sharding.param_shardings(model_config, "searcher", mesh))
  rates = {}
  for name in names:
    c = suite.get_config(arg(name))
    task = build.build_task(c.task, tokenizer)
    evaluator = build.evaluator(c.eval, c.sampler, task, tokenizer, model_config, mesh,
                                c.task.max_prompt_len, progress=False)
    start = time.perf_counter()
    metrics = evaluator(params, jax.random.key(c.seed + 1))
    rates[name] = {k: metrics[f"eval/{k}"] for k in ("greedy_pass@1", "sampled_pass@1")}
    print(f"{name:<12} {len(evaluator.problems)} validation problems: greedy "
          f"{rates[name]['greedy_pass@1']:.3f}, sampled {rates[name]['sampled_pass@1']:.3f} "
          f"({time.perf_counter() - start:.0f} s)", flush=True)
  return rates


if __name__ == "__main__":
  main()
