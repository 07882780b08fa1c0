r"""A run's policy evaluated on its own, as the run evaluates it (tba_jax/evaluation.py): the
task's reward and headline metrics on the config's eval.split.

  tba eval EXPERIMENT --workdir DIR [--policy PATH] [--step N] [--config.eval.split=test]
  python -m experiments.evaluate_tldr --config configs/tldr.py:pythia410m --workdir DIR

The config is DIR/config.yaml, the run's own (tba_jax/run_config.py), unless --config names
another. --policy: a Hugging Face directory or hub id (default DIR/export, the policy the run
exported at its end; the starting model, e.g. an SFT checkpoint, gives the baseline). The
reference is the config's model.path (for `tiny` configs, the random initial policy of its
seed); data, reward stage and evaluation settings are the config's. --step picks the
sampling key the run uses at that step (default: the run's last step from
DIR/finished.json, or 0), so a run's export evaluated here reproduces the run's final eval/
metrics. The metrics are printed and appended to DIR/evaluation.jsonl (one line per
evaluation).
"""
import json
import os

from absl import flags

from tba_jax.errors import UserError

_POLICY = flags.DEFINE_string("policy", "", "Policy to evaluate ('' = WORKDIR/export).")
_STEP = flags.DEFINE_integer("step", -1, "Sampling key of the run's evaluation at this step "
                             "(-1 = WORKDIR/finished.json's step, else 0).")


def evaluate(config, workdir: str) -> dict:
  """launch.main's job: the evaluation of --policy under `config` (module doc)."""
  import jax

  from tba_jax import config_builders as build
  from tba_jax import hf_checkpoints, loop, sharding

  c = config
  devices = jax.local_devices()[:c.mesh.num_devices or None]
  mesh = sharding.make_mesh("searcher", devices, c.mesh.searcher_tensor)
  dtype = c.sync.weights_dtype or c.model.dtype  # what the run's evaluation samples with
  tokenizer = build.load_tokenizer(c.model)
  task = build.build_task(c.task, tokenizer)
  # The reference exactly as the run starts from it (a random one from the config's seed).
  cfg, reference = build.load_model(c.model, tokenizer, dtype,
                                    sharding.make_mesh("trainer", devices), c.seed)
  reference = jax.device_put(reference, sharding.param_shardings(cfg, "searcher", mesh))
  policy = _POLICY.value or os.path.join(workdir, "export")
  if not _POLICY.value and not os.path.isdir(policy):
    raise UserError(f"{policy} does not exist: a run exports its policy at its end; `tba "
                    "export` writes the newest checkpoint's there, or name one with --policy")
  _, params = hf_checkpoints.load(policy, dtype, mesh=mesh, role="searcher", model_config=cfg)
  step = _STEP.value
  if step < 0:
    finished = os.path.join(workdir, loop.FINISHED_FILE)
    step = json.load(open(finished))["step"] if os.path.exists(finished) else 0
  evaluator = build.evaluator(c.eval, c.sampler, task, tokenizer, cfg, mesh,
                              c.task.max_prompt_len, progress=True)
  metrics = evaluator(params, jax.random.fold_in(jax.random.key(c.seed + 1), step),
                      reference=reference)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "evaluation.jsonl"), "a") as f:
    f.write(json.dumps({"policy": policy, "step": step, **metrics}) + "\n")
  print(f"Evaluated {policy}: " + ", ".join(f"{k} {v:.3f}" for k, v in metrics.items()))
  return metrics
