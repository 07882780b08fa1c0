"""configs/tools.py:tiny end to end: turns through the whole runtime, and a SIGKILL resume
whose restored buffer holds the environment-token masks it saved."""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from tba_jax import buffer_state, replay_buffer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(workdir, *overrides, faults=None):
  """The tiny tool run; `faults` (faults.Plan.parse's text): through tests/fault_worker.py."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
  cache = os.path.expanduser(os.environ.get("TBA_JAX_TEST_CACHE", "~/.cache/tba_jax_test_xla"))
  arg = "configs/tools.py:tiny" + "".join("," + o for o in overrides)
  command = (["-m", "experiments.tools"] if faults is None else
             [os.path.join(ROOT, "tests", "fault_worker.py"), faults, "tools"])
  return subprocess.run([sys.executable, *command, "--config", arg,
                         "--workdir", workdir, f"--compilation_cache={cache}"], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=900)


# Async with a streaming searcher; alternate mode slow-marked (~15 s; the loop's tests run
# alternate mode, turns_test the multi-turn rows), as is the static async run (SIGKILL test).
@pytest.mark.parametrize("overrides", [
    pytest.param(("sync.mode=alternate",), marks=pytest.mark.slow),
    ("sync.mode=async", "sampler.num_slots=4")])
def test_tiny_tool_run_trains_to_the_end_calling_its_tool(tmp_path, overrides):
  from tba_jax.metrics import read_jsonl
  workdir = str(tmp_path / "run")
  done = _run(workdir, *overrides)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  assert "Finished at step 6" in done.stdout
  steps = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "loss" in r]
  assert [r["step"] for r in steps] == list(range(1, 7))
  assert all(np.isfinite(r["loss"]) for r in steps)
  # Rows stopped at a call and went on after the reply: more than one turn, tool calls counted.
  assert max(r["tools/turns_per_sample"] for r in steps) > 1
  assert max(r["tools/calls_per_sample"] for r in steps) > 0
  # The calculator never raises: no reply failed; the dropped-reply rate is logged.
  assert all(r["tools/reply_failures"] == 0 for r in steps)
  assert all(r["tools/replies_dropped_per_sample"] >= 0 for r in steps)


@pytest.mark.slow
def test_tiny_tool_run_resumes_after_sigkill_with_masks_intact(tmp_path):
  import orbax.checkpoint as ocp
  workdir = str(tmp_path / "run")
  killed = _run(workdir, faults="stop_at_step=4")  # SIGKILL after step 4 (checkpoint at 3)
  assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-3000:]
  state = ocp.PyTreeCheckpointer().restore(os.path.join(workdir, "checkpoints", "3", "buffer"))
  state = {k: np.asarray(v) for k, v in state.items()}
  names = [n for n in buffer_state.STATE_ARRAYS if n in state]
  size = dict(zip(names, state["sizes"]))
  saved_mask = state["model_mask"][:int(size["model_mask"])]
  assert (saved_mask == 0).any() and (saved_mask == 1).any()  # replies and model tokens
  buffer = replay_buffer.ReplayBuffer(1000, None, "oldest", seed=0)
  buffer.load_state_dict(state)  # what the resumed run does with it
  restored = [e for e in buffer.entries()]
  assert sum(int((e.model_mask == 0).sum()) for e in restored) == int((saved_mask == 0).sum())
  resumed = _run(workdir)
  assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
  assert "Resumed from step 3" in resumed.stdout and "Finished at step 6" in resumed.stdout
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    assert '"tools/turns_per_sample"' in f.read()


def test_every_tools_recipe_passes_the_config_check_and_builds_its_task(monkeypatch):
  from configs import tools as tools_config
  from experiments import tools as tools_experiment
  from tba_jax import config_builders, config_checks
  from tba_jax.tokenizer import byte_tokenizer
  for name, build in tools_experiment.TASKS.items():
    monkeypatch.setitem(config_builders.TASKS, name, build)
  for variant in tools_config.VARIANTS:
    config_checks.validate(tools_config.get_config(variant))
  c = tools_config.get_config("tiny")
  task = config_builders.build_task(c.task, byte_tokenizer())
  assert task.environment is not None and task.environment.max_turns == 2
  assert "<tool>" in task.prompt(task.train[0]) and len(task.test) == 8
  c = tools_config.get_config("cpu")
  task = config_builders.build_task(c.task, byte_tokenizer())
  a, b = (int(x) for x in task.train[0].fields["question"].split("?")[0].split()[-3::2])
  assert 100 <= a < 1000 and 100 <= b < 1000 and task.train[0].target == a * b
  assert task.environment.reply(None, "<tool>123 * 456</tool>").text == "<result>56088</result>"


def _tool_task(variant, *overrides):
  """(config, the byte tokenizer, the task) of configs/tools.py's `variant`, as
  experiments.tools builds it."""
  from configs import tools as tools_config
  from experiments import tools as tools_experiment
  from tba_jax.tokenizer import byte_tokenizer
  c, tok = tools_config.get_config(",".join((variant,) + overrides)), byte_tokenizer()
  return c, tok, tools_experiment.TASKS[c.task.name](c.task, tok)


def _transcript(tok, *turns):
  """(tokens, model_mask) of (text, by_the_model) turns, EOS after the last; replies are
  encoded as the run encodes them."""
  tokens, mask = [], []
  for text, own in turns:
    ids = tok.encode(text) if own else tok.encode_text(text)
    tokens += ids
    mask += [int(own)] * len(ids)
  return (np.array(tokens + [tok.eos_ids[0]], np.int32), np.array(mask + [1], np.int32))


CALL = ("123 * 456</tool>", True)
RESULT = ("<result>56088</result>", False)
ANSWER = (" The answer is 56088.", True)


@pytest.mark.parametrize("score, want", [("last_turn", [0.0, 1.0]), ("transcript", [1.0, 1.0])])
def test_a_tools_printed_result_is_not_the_models_final_answer(tiny_cfg, score, want):
  """The cpu recipe's task: `123 * 456</tool><result>56088</result>` then EOS holds no answer
  of the model's (reward 0), the same followed by its turn "The answer is 56088." does (1), in
  the searcher's reward batch and in the evaluation alike; task.tools.score=transcript reads
  the tool's output as before."""
  import dataclasses

  import jax

  from tba_jax import sharding, weight_sync
  from tba_jax.evaluation import Evaluator
  from tba_jax.model import init_params
  from tba_jax.sampler import Sampler, SamplingOptions
  from tba_jax.rows import Group, Sample, StaticRows
  from tba_jax.searcher import PromptShard, Scoring, Searcher
  from tba_jax.tasks import Problem, as_stage
  from tba_jax.tasks.environment import SCORES
  from tba_jax.turns import TurnRollouts
  _, tok, task = _tool_task("cpu", f"task.tools.score={score}")
  assert task.environment.score == score
  problem = Problem(0, {"question": "What is 123 * 456?"}, 56088.0)
  prompt = tok.encode_prompt(task.prompt(problem))
  rows = [_transcript(tok, CALL, RESULT), _transcript(tok, CALL, RESULT, ANSWER)]
  reward_masks = [SCORES[score](mask) for _, mask in rows]  # what the turn pool hands on

  # The searcher's reward batch (Searcher.score).
  cfg = dataclasses.replace(tiny_cfg, vocab_size=tok.vocab_size)
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:1])
  params = weight_sync.publish(init_params(cfg, 0), sharding.param_shardings(cfg, "searcher", mesh))
  options = SamplingOptions(max_new_tokens=64, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
  searcher = Searcher(
      0, rows=StaticRows(Sampler(cfg, options, mesh=mesh)), mailbox=weight_sync.Mailbox(0, params),
      # max_len: the prompt with the tool's instructions
      prompts=PromptShard([0], {0: prompt}, {0: problem}, max_len=320),
      scoring=Scoring(as_stage(task.reward).build(mesh), tok.decode, params),
      num_prompts=1, num_samples=2, seed=0)
  samples = tuple(Sample(t, np.zeros(len(t), np.float32), 0, 0, model_mask=m, reward_mask=r)
                  for (t, m), r in zip(rows, reward_masks))
  assert [e.reward for e in searcher.score([Group(0, 1.0, samples)])] == want

  # The evaluation's (a greedy pass whose sampler hands back these two rows).
  def generate(params, prompts, key):
    pad = lambda x: np.array([np.pad(r, (0, 64 - len(r))) for r in x])
    return TurnRollouts(tokens=pad([t for t, _ in rows]), logprobs=None, tempered_logprobs=None,
                        lengths=np.array([len(t) for t, _ in rows]), num_decode_steps=64,
                        model_mask=pad([m for _, m in rows]), reward_mask=pad(reward_masks))

  evaluator = Evaluator(problems=[problem, dataclasses.replace(problem, id=1)],
                        prompt_tokens=[prompt, prompt], decode=tok.decode,
                        reward=as_stage(task.reward).build(None), eos_ids=tok.eos_ids,
                        batch_size=2, greedy=generate, progress=False)
  evaluator(None, jax.random.key(0))
  assert [s["reward"] for s in evaluator.samples] == want


def test_replies_reach_the_model_as_plain_text_through_the_runs_builders():
  """A tool that prints "<|im_end|>" (or "<eos>") gives the model those characters, never the
  special token: the searchers' and the evaluation's turn samplers encode replies as text."""
  import jax

  from tba_jax import config_builders, sharding
  c, tok, task = _tool_task("tiny")
  printed = "<result><|im_end|><eos></result>"
  specials = set(tok.hf.all_special_ids)
  assert set(tok.encode(printed)) & specials  # what parsing the special tokens would give
  assert not set(tok.encode_text(printed)) & specials
  assert tok.decode(tok.encode_text(printed)) == printed

  mesh = sharding.make_mesh("searcher", jax.local_devices()[:1])
  cfg, params, _ = config_builders.load_policy(
      c.model, tok, "float32", sharding.make_mesh("trainer", jax.local_devices()[:1]), 0)
  encoders = []
  for num_slots in (0, 2):  # TurnRows, and StreamingRows' turn pool
    config = c.copy_and_resolve_references()
    config.sampler.num_slots = num_slots
    (searcher,) = config_builders.searcher_pool(config, task, tok, cfg, [mesh],
                                                publish=lambda p, i: p, params=params).searchers
    rows = searcher.rows
    encoders.append(rows.turns.encode if num_slots == 0 else rows.turns[1])
  evaluator = config_builders.evaluator(c.eval, c.sampler, task, tok, cfg, mesh,
                                        c.task.max_prompt_len, progress=False)
  encoders += [evaluator.greedy.encode] if evaluator.greedy else []
  encoders += [evaluator.sampled.encode] if evaluator.sampled else []
  assert len(encoders) >= 3
  for encode in encoders:
    assert not set(encode(printed)) & specials


def test_the_python_tools_environment_probes_its_sandbox_when_it_is_built(monkeypatch):
  """A machine that cannot confine code fails the run at its start, naming the reason, not
  at the model's first call."""
  from experiments import tools as tools_experiment
  from tba_jax.errors import ConfigError
  from tba_jax.tasks import tool_use, tools

  def refused(timeout_s=10.0):
    raise tools.SandboxUnavailable("namespaces refused: unshare: Operation not permitted")

  monkeypatch.setattr(tool_use, "check_sandbox", refused)
  with pytest.raises(tools.SandboxUnavailable, match="Operation not permitted"):
    tool_use.environment(tool_use.tool("python", timeout_s=1.0), max_turns=2, max_turn_tokens=8,
                         max_reply_tokens=8, num_workers=1, score="last_turn")
  from configs import tools as tools_config
  c = tools_config.get_config("qwen_gsm8k")
  with pytest.raises(ConfigError, match="task.tools: .*Operation not permitted"):
    tools_experiment._environment(c.task)
  monkeypatch.undo()
  calculator = tool_use.tool("calculator", timeout_s=1.0)
  assert tool_use.environment(calculator, max_turns=2, max_turn_tokens=8, max_reply_tokens=8,
                              num_workers=1, score="last_turn").score == "last_turn"
