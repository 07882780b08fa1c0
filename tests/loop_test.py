"""The runtime: async on 8 devices, synchronous equivalence, failures, resume checks."""
import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from configs import gsm8k as gsm8k_config
from tba_jax import (config_builders, faults, hf_checkpoints, loop, model, optim, run_checkpoints,
                     sharding, train_state, train_step)
from tba_jax import tokenizer as tokenizer_lib
from tba_jax import verifiers, weight_sync
from tba_jax.checkpoint import ConfigMismatchError
from tba_jax.kv_cache import KVCache
from tba_jax.metrics import read_jsonl
from tba_jax.model import ModelConfig, init_params
from tba_jax.run_evaluation import RunEvaluation
from tba_jax.sampler import Sampler, SamplingOptions
from tba_jax.searcher import PromptStream, Searcher
from tba_jax.tasks import Task


def digit_reward(text: str, gold: float) -> float:
  """A trivially learnable toy reward: the fraction of digit characters."""
  return sum(ch.isdigit() for ch in text) / 4


def toy_task(config) -> Task:
  base = config_builders.build_task(config.task, tokenizer_lib.byte_tokenizer())
  return Task(train=base.train, test=base.test, prompt=base.prompt, reward=digit_reward)


def tiny_config(**sections):
  c = gsm8k_config.get_config("tiny")
  c.unlock()
  c.eval.update(every=0, num_problems=2, num_samples=0)
  c.export = False
  for name, values in sections.items():
    if isinstance(values, dict):
      c[name].update(values)
    else:
      c[name] = values
  c.lock()
  return c


def test_async_runtime_on_8_devices_learns_and_reports_staleness(tmp_path):
  # Thread timing makes async runs differ; with these settings 11 runs (2 cores and 1) ended at
  # last-6 reward 0.57-0.85 from a start of 0.02-0.04 (24 steps at 3e-3 gave 0.15-0.57).
  c = tiny_config(num_train_steps=32, mesh=dict(num_devices=8, num_trainer_devices=4),
                  sync=dict(mode="async", every=2), optim=dict(learning_rate=6e-3),
                  loss=dict(beta_start=0.05, beta_end=0.05),
                  buffer=dict(num_prompts=4, samples_per_prompt=4, prefill=16),
                  sampler=dict(num_samples_per_prompt=4, num_prompts_per_batch=2))
  loop.run(c, str(tmp_path), task=toy_task(c))
  rows = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "reward_mean" in r]
  assert [r["step"] for r in rows] == list(range(1, 33))
  for key in ("staleness_mean", "staleness_max", "staleness_hist", "fraction_from_latest",
              "trainer_idle_fraction", "searcher_busy_fraction", "sync_seconds", "kl", "lr"):
    assert key in rows[-1], key
  assert all(r["staleness_max"] >= 0 for r in rows)
  assert any(r["staleness_max"] > 0 for r in rows)  # searchers ran ahead on older weights
  first = np.mean([r["reward_mean"] for r in rows[:6]])
  last = np.mean([r["reward_mean"] for r in rows[-6:]])
  assert last > first + 0.2, (first, last)


def _sync_config():
  return tiny_config(num_train_steps=3, mesh=dict(num_devices=2, num_trainer_devices=1),
                     sync=dict(mode="alternate", every=1), optim=dict(learning_rate=3e-3),
                     buffer=dict(num_prompts=2, samples_per_prompt=4, m=1.0, prefill=8,
                                 dedup=False, max_per_prompt=4),
                     sampler=dict(num_samples_per_prompt=4, num_prompts_per_batch=2),
                     export=True)


def _plain_synchronous_loop(c, task, tokenizer):
  """On-policy training written directly: sample B x K, score, update; repeat."""
  devices = jax.local_devices()
  trainer_mesh = sharding.make_mesh("trainer", devices[:1])
  searcher_mesh = sharding.make_mesh("searcher", devices[1:2])
  cfg = ModelConfig(**c.model.random.to_dict(), dtype="float32")
  params = init_params(cfg, c.seed, sharding.param_shardings(cfg, "trainer", trainer_mesh))
  optimizer = optim.make_optimizer(c.optim.learning_rate, c.optim.weight_decay,
                                   c.optim.grad_clip_norm, c.optim.b1, c.optim.b2)
  state = train_state.init_state(params, optimizer,
                                train_state.state_shardings(cfg, optimizer, trainer_mesh))
  objective = train_step.Objective(config_builders.loss_fn(c.loss),
                                   config_builders.beta_schedule(c.loss), c.sampler.temperature)
  update = train_step.make_update(
      cfg, optimizer, objective, trainer_mesh,
      forward=train_step.Forward(prompt_group=c.buffer.samples_per_prompt))
  to_searcher = lambda p: weight_sync.publish(p, sharding.param_shardings(cfg, "searcher",
                                                                          searcher_mesh))
  ref = to_searcher(state.params)
  sampler = Sampler(cfg, SamplingOptions(
      max_new_tokens=c.sampler.max_new_tokens, temperature=c.sampler.temperature,
      eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id), mesh=searcher_mesh)
  stream = PromptStream([p.id for p in task.train], seed=c.seed)
  golds = {p.id: p.target for p in task.train}
  key = jax.random.fold_in(jax.random.key(c.seed), 0)
  tp, tc, k = c.task.max_prompt_len, c.sampler.max_new_tokens, c.buffer.samples_per_prompt
  for step in range(c.num_train_steps):
    ids = stream.take(c.buffer.num_prompts)
    rows = [i for i in ids for _ in range(k)]
    prompts = [tokenizer.encode(task.prompt(task.train[i])) for i in rows]
    out = sampler(to_searcher(state.params), prompts, jax.random.fold_in(key, step))
    completions = [tuple(out.tokens[r, :out.lengths[r]]) for r in range(len(rows))]
    assert len(set(zip(rows, completions))) == len(rows)  # no duplicates to de-duplicate
    n = len(rows)
    tokens = np.full((n, tp + tc), tokenizer.pad_id, np.int32)
    attn = np.zeros((n, tp + tc), np.int32)
    for r, p in enumerate(prompts):
      tokens[r, tp - len(p):tp], attn[r, tp - len(p):tp] = p, 1
      tokens[r, tp:], attn[r, tp:tp + out.lengths[r]] = out.tokens[r], 1
    completion_mask = attn[:, tp:].astype(np.float32)
    # Each group's prompt runs once, in the searchers' scoring as in the update: Adam turns
    # even rounding-level gradients into steps of lr, so both sides compute alike.
    ref_lp = np.asarray(jax.jit(model.completion_token_logprobs, static_argnums=(0, 4, 5, 6, 7, 8))(
        cfg, ref, tokens, attn, tc, c.sampler.temperature, False, None, k)) * completion_mask
    rewards = np.array([digit_reward(tokenizer.decode(out.tokens[r, :out.lengths[r]]),
                                     golds[i]) for r, i in enumerate(rows)], np.float32)
    batch = train_step.TrainBatch(
        tokens=tokens, attention_mask=attn, completion_mask=completion_mask,
        ref_logprobs=ref_lp, behaviour_logprobs=out.tempered_logprobs * completion_mask,
        rewards=rewards, group_ids=np.repeat(np.arange(len(ids), dtype=np.int32), k),
        prompt_ids=np.repeat(np.array(ids, np.int32), k), versions=np.full(n, step, np.int32))
    state, _ = update(state, batch)
  return jax.device_get(state.params)


@pytest.mark.slow  # ~33 s on 2 cores (2026-12-04): out of the default suite
def test_synchronous_mode_equals_a_plain_synchronous_loop(tmp_path):
  c = _sync_config()
  task = toy_task(c)
  loop.run(c, str(tmp_path), task=task)
  rows = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "reward_mean" in r]
  assert all(r["staleness_max"] == 0 and r["fraction_from_latest"] == 1.0 for r in rows)
  _, ours = hf_checkpoints.load(str(tmp_path / "export"))
  want = _plain_synchronous_loop(c, task, tokenizer_lib.byte_tokenizer())
  # Equal up to float rounding, which differs between CPUs (XLA's kernels block their sums
  # by instruction set) and which Adam amplifies where a gradient is near 0: at most 0.1% of
  # the weights differ by more than 2e-6, none by 1% of one update (lr 3e-3). Another
  # reference, version or batch would move most weights by ~lr.
  moved, loose, total = 0.0, 0, 0
  for a, b, init in zip(jax.tree.leaves(ours), jax.tree.leaves(want),
                        jax.tree.leaves(init_params(ModelConfig(**c.model.random.to_dict()), 0))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=3e-5, rtol=0)
    loose += int((np.abs(np.asarray(a) - np.asarray(b)) > 2e-6).sum())
    total += np.asarray(a).size
    moved = max(moved, float(np.abs(np.asarray(b) - np.asarray(init)).max()))
  assert loose <= 1e-3 * total, (loose, total)
  assert moved > 1e-3  # training really changed the parameters


def _faulty(num_train_steps, num_devices=2):
  return tiny_config(num_train_steps=num_train_steps, max_train_seconds=120.0,
                     mesh=dict(num_devices=num_devices, num_trainer_devices=1),
                     sync=dict(mode="async", every=2), buffer=dict(prefill=8),
                     searcher=dict(max_restarts=2))


@pytest.mark.parametrize("num_devices", [2, 1])  # async; alternate (batch 3 in a round)
def test_a_searcher_failure_is_restarted_and_the_run_finishes(tmp_path, capsys, num_devices):
  c = _faulty(8, num_devices)
  plan = faults.Plan(searcher_fail_at=3)
  assert loop.run(c, str(tmp_path), task=toy_task(c), fault_plan=plan)["step"] == 8
  rows = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "loss" in r]
  assert [r["step"] for r in rows] == list(range(1, 9))
  assert rows[-1]["searcher_restarts"] == 1
  err = capsys.readouterr().err
  assert "searcher 0 raised on prompt id(s)" in err and "restarted (1 of searcher.max_restarts=2)" in err
  assert "InjectedFault: injected failure (searcher_fail_at=3) in reward batch 3" in err


def test_a_failure_that_repeats_on_its_prompt_stops_the_run_naming_it(tmp_path):
  # The trainer never waits for searchers, so it gets more steps than it can take before the
  # failure; the time limit ends the run (and fails the test) if the searcher never gives up.
  c = _faulty(100_000)
  plan = faults.Plan(searcher_fail_at=3, searcher_fail_repeats=True)
  task = toy_task(c)
  stream = PromptStream([p.id for p in task.train], seed=c.seed)  # searcher 0's whole shard
  third = sorted([stream.take(2) for _ in range(3)][-1])
  with pytest.raises(loop.SearcherError) as e:
    loop.run(c, str(tmp_path), task=task, fault_plan=plan)
  assert f"searcher 0: prompt id(s) {third} failed again after a restart" in str(e.value)
  assert "InjectedFault" in str(e.value)
  saved = sorted(os.listdir(tmp_path / "checkpoints"))
  assert saved and all(s.isdigit() for s in saved)


def test_sigterm_while_the_buffer_prefills_checkpoints_step_0_and_the_resume_fills_on(
    tmp_path, monkeypatch, capsys):
  import signal
  from tba_jax.searcher_pool import SearcherPool
  merge, merged = SearcherPool.merge, []

  def merge_then_signal(self, buffer):
    merged.append(merge(self, buffer))
    if len(merged) % 3 == 0:  # the third round of each run's pre-fill (the handler is set)
      os.kill(os.getpid(), signal.SIGTERM)
    return merged[-1]

  monkeypatch.setattr(SearcherPool, "merge", merge_then_signal)
  # A pre-fill that never ends by itself: 1 device, one batch (2 prompts x 4) per round.
  c = tiny_config(num_train_steps=2, mesh=dict(num_devices=1),
                  buffer=dict(prefill=10**6, dedup=False))
  for run in (1, 2):
    assert loop.run(c, str(tmp_path), task=toy_task(c)) == {
        "step": 0, "terminated": True, "signal": "SIGTERM",
        **run_checkpoints.buffer_summary(_saved_buffer(tmp_path, 0))}
    assert merged == [8] * 3 * run and os.listdir(tmp_path / "checkpoints") == ["0"]
    assert len(_saved_buffer(tmp_path, 0)) == 24 * run  # the resume went on filling
  assert "Resumed from step 0 (24 buffer entries" in capsys.readouterr().out


def test_sigterm_during_an_evaluation_abandons_it_and_saves_that_step_without_an_update(
    tmp_path, monkeypatch, capsys):
  """SIGTERM in the 2nd of the 4 batches of step 2's evaluation: that batch is not waited
  for (it blocks until the run has returned), no batch after it starts, no update 3 runs,
  step 2 is saved, and the rerun resumes from it."""
  import signal
  import threading
  batches, release, finished = [], threading.Event(), []
  real = config_builders.evaluator

  def evaluator(*args, **kw):
    ev = real(*args, **kw)
    greedy = ev.greedy

    def generate(params, prompts, key):
      batches.append(len(prompts))
      if len(batches) == 4 + 2:  # step 0's evaluation ran 4; this is step 2's 2nd batch
        os.kill(os.getpid(), signal.SIGTERM)
        release.wait(timeout=120)
        finished.append(True)
      return greedy(params, prompts, key)

    ev.greedy = generate
    return ev

  monkeypatch.setattr(config_builders, "evaluator", evaluator)
  c = tiny_config(num_train_steps=4, mesh=dict(num_devices=1), checkpoint=dict(every=1000),
                  eval=dict(every=2, num_problems=4, batch_size=1))
  try:
    out = loop.run(c, str(tmp_path), task=toy_task(c))
    assert not finished  # the batch in flight was left running
  finally:
    release.set()
  assert batches == [1] * 6  # step 2's evaluation: 2 of its 4 batches started
  assert out["step"] == 2 and out["terminated"] and out["signal"] == "SIGTERM"
  assert os.listdir(tmp_path / "checkpoints") == ["2"]
  rows = read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in rows if "loss" in r] == [1, 2]  # no update after the request
  assert [r["step"] for r in rows if "eval/greedy_pass@1" in r] == [0]  # nothing half-written
  said = capsys.readouterr()
  assert "step 2: evaluation abandoned after" in said.out
  assert "SIGTERM: saved a checkpoint at step 2 in" in said.out
  # The rerun resumes from step 2 and trains to the end.
  assert loop.run(c, str(tmp_path), task=toy_task(c))["step"] == 4
  assert "Resumed from step 2 (" in capsys.readouterr().out
  rows = read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]


def _saved_buffer(workdir, step):
  import orbax.checkpoint as ocp
  from tba_jax.replay_buffer import ReplayBuffer
  manager = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"))
  state = manager.restore(step, args=ocp.args.Composite(buffer=ocp.args.StandardRestore()))
  manager.close()
  buffer = ReplayBuffer(max_per_prompt=10**9, dedup=False)
  buffer.load_state_dict(state["buffer"])
  return buffer


@pytest.mark.slow  # ~22 s on 2 cores (2026-12-04): out of the default suite
def test_resuming_under_a_different_config_is_refused(tmp_path):
  c = tiny_config(num_train_steps=2, mesh=dict(num_devices=1), buffer=dict(prefill=8))
  loop.run(c, str(tmp_path), task=toy_task(c))
  changed = tiny_config(num_train_steps=4, mesh=dict(num_devices=1), buffer=dict(prefill=8),
                        loss=dict(beta_start=0.5))
  with pytest.raises(ConfigMismatchError, match=r"loss.beta_start: 0.1 -> 0.5"):
    loop.run(changed, str(tmp_path), task=toy_task(changed))
  # Only observation / length keys may change: this resumes.
  longer = tiny_config(num_train_steps=3, mesh=dict(num_devices=1), buffer=dict(prefill=8))
  assert loop.run(longer, str(tmp_path), task=toy_task(longer))["step"] == 3


_COMPARED = ("loss", "reward_mean", "kl", "staleness_mean", "staleness_max", "staleness_hist",
             "searcher_samples", "fraction_from_latest", "buffer_entries")


def _alternate(num_train_steps, log_z="vargrad"):
  return tiny_config(num_train_steps=num_train_steps, mesh=dict(num_devices=2),
                     sync=dict(mode="alternate", every=2), checkpoint=dict(every=100),
                     buffer=dict(prefill=8), loss=dict(log_z=log_z))


def _train_rows(workdir):
  return [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "loss" in r]


@pytest.mark.parametrize("log_z", ["vargrad", pytest.param("learned", marks=pytest.mark.slow)])
def test_a_resumed_alternate_run_repeats_the_uninterrupted_one(tmp_path, log_z):
  whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
  loop.run(_alternate(8, log_z), whole, task=toy_task(_alternate(8)))
  # Stopped at step 4 (a sync step: the resumed run's first step has a search round), then
  # resumed with a raised num_train_steps.
  loop.run(_alternate(4, log_z), parts, task=toy_task(_alternate(4)))
  assert loop.run(_alternate(8, log_z), parts, task=toy_task(_alternate(8)))["step"] == 8
  want, got = _train_rows(whole), _train_rows(parts)
  assert [r["step"] for r in got] == list(range(1, 9))
  for a, b in zip(want[4:], got[4:]):  # with a learned log Z, its value was saved too
    assert {k: a[k] for k in _COMPARED + ("log_z_mean",)} == \
        {k: b[k] for k in _COMPARED + ("log_z_mean",)}, a["step"]
  if log_z == "learned":  # the table learns from 0
    assert want[0]["log_z_mean"] == 0.0 and want[-1]["log_z_mean"] != 0.0
  # Wall-clock continues across the resume (the checkpoint holds the elapsed time).
  rows = read_jsonl(os.path.join(parts, "metrics.jsonl"))
  assert [r["step"] for r in rows] == list(range(9))
  times = [r["wall_time"] for r in rows]
  assert times == sorted(times) and times[5] > times[4] > 0


@pytest.mark.slow  # ~18 s on 2 cores (2026-12-04): out of the default suite
def test_rerunning_a_finished_run_does_nothing_and_a_raised_step_count_trains_on(tmp_path, capsys):
  c = tiny_config(num_train_steps=2, mesh=dict(num_devices=1), export=True)
  result = loop.run(c, str(tmp_path), task=toy_task(c))
  before = {p: os.path.getmtime(tmp_path / p) for p in ("metrics.jsonl", "export/config.json")}
  again = loop.run(c, str(tmp_path), task=toy_task(c))
  assert "this run finished at step 2" in capsys.readouterr().out
  assert again == {k: v for k, v in result.items() if k == "step" or k.startswith("eval/")}
  assert {p: os.path.getmtime(tmp_path / p) for p in before} == before
  longer = tiny_config(num_train_steps=3, mesh=dict(num_devices=1), export=True)
  assert loop.run(longer, str(tmp_path), task=toy_task(longer))["step"] == 3
  assert [r["step"] for r in _train_rows(str(tmp_path))] == [1, 2, 3]


@pytest.mark.slow  # ~12 s on 2 cores (2026-12-04): out of the default suite
def test_a_run_killed_before_its_final_export_finishes_it_on_rerun(tmp_path, monkeypatch):
  c = tiny_config(num_train_steps=2, mesh=dict(num_devices=1), export=True)

  def killed(*args, **kwargs):
    raise KeyboardInterrupt  # stands in for a kill after the final checkpoint

  with monkeypatch.context() as m:
    m.setattr(loop, "_export", killed)
    with pytest.raises(KeyboardInterrupt):
      loop.run(c, str(tmp_path), task=toy_task(c))
  assert not (tmp_path / "export").exists() and not (tmp_path / loop.FINISHED_FILE).exists()
  assert loop.run(c, str(tmp_path), task=toy_task(c))["step"] == 2  # evaluates, exports
  assert (tmp_path / "export" / "model.safetensors").exists()
  assert (tmp_path / loop.FINISHED_FILE).exists()
  assert [r["step"] for r in _train_rows(str(tmp_path))] == [1, 2]  # no step trained again


@pytest.mark.slow  # ~13 s on 2 cores (2026-12-04): out of the default suite
def test_every_run_records_its_setup_in_its_first_metrics_row(tmp_path, capsys):
  c = tiny_config(num_train_steps=1, mesh=dict(num_devices=1), sync=dict(mode="async"))
  task = toy_task(c)
  # A verifier's task, one of its train golds without a number: paper_regex never matches it.
  first = task.train[0]
  task = dataclasses.replace(task, reward=verifiers.VerifierReward("paper_regex"), train=[
      dataclasses.replace(first, target="none"), *task.train[1:]])
  loop.run(c, str(tmp_path), task=task)
  with open(tmp_path / "metrics.jsonl") as f:
    first = json.loads(f.readline())
  setup = first["run"]
  assert first["step"] == 0 and setup["mode"] == "alternate"
  assert "one device" in setup["mode_note"]  # async was asked for
  assert setup["devices"] == {"count": 8, "platform": "cpu", "kind": "cpu", "processes": 1}
  assert setup["trainer"]["devices"] == 1 and setup["searchers"]["shared_with_trainer"]
  assert setup["model"]["parameters"] == sum(
      x.size for x in jax.tree.leaves(init_params(ModelConfig(**c.model.random.to_dict()), 0)))
  # The Task passed in is named as itself (not as the config's task.name), with the
  # metrics that show whether a run learned (a reward-scored task's defaults).
  assert setup["task"] == {"name": "custom", "train_problems": 8, "validation_problems": 0,
                           "test_problems": 4, "eval_split": "test",
                           "eval_problems": 2, "eval_devices": "trainer", "metrics": [
                               {"key": "reward_mean", "label": "train reward (mean of the "
                                "trained batch)", "unit": ""},
                               {"key": "eval/sampled_pass@1", "label": "held-out reward, "
                                "sampled (mean)", "unit": ""},
                               {"key": "eval/greedy_pass@1", "label": "held-out reward, greedy "
                                "(mean)", "unit": ""}],
                           "unparseable_golds": {"train": 1, "test": 0}}
  said = capsys.readouterr()
  assert "\n  task      custom: 8 train / 0 validation / 4 test problems, 2 test" in said.out
  assert ("task.verifier='paper_regex' can never match the gold answer of 1 of 8 train "
          "problems (e.g. 'none')") in said.err
  assert setup["beta"] == "0.1 at every step (tb)"
  assert setup["lr"] == "0.001 at every step (constant)"


def test_the_export_holds_the_tokenizer_and_generate_stops_at_its_eos_ids(tmp_path):
  import torch
  import transformers
  c = gsm8k_config.get_config("tiny")
  cfg = ModelConfig(**c.model.random.to_dict())
  tok = tokenizer_lib.byte_tokenizer()
  end_of_turn = tok.eos_ids[1]  # <|im_end|>: an EOS id that is not the tokenizer's EOS token
  # A model that always predicts <|im_end|>: the residual stream is the embedding (attention
  # and MLP outputs zeroed), every embedding points along dimension 0, and only the
  # <|im_end|> column of the head reads that dimension.
  params = jax.tree.map(np.asarray, init_params(cfg, 0))
  params["layers"]["attn"]["o"] = np.zeros_like(params["layers"]["attn"]["o"])
  params["layers"]["mlp"]["down"] = np.zeros_like(params["layers"]["mlp"]["down"])
  params["embed"] = np.zeros_like(params["embed"])
  params["embed"][:, 0] = 1.0
  params["lm_head"] = np.zeros_like(params["lm_head"])
  params["lm_head"][0, end_of_turn] = 10.0
  loop._export(cfg, params, tok, str(tmp_path), is_main=True)

  hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  for text in ("1+2=", "Natalia sold 48 clips ✓<|im_end|>", tok.chat_prompt(" a  b\n")):
    assert hf_tok(text)["input_ids"] == tok.encode(text)
  model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path))
  assert list(model.generation_config.eos_token_id) == list(tok.eos_ids)
  prompt = torch.tensor([tok.encode("1+2=")])
  out = model.generate(prompt, max_new_tokens=8, do_sample=False)
  assert out[0, prompt.shape[1]:].tolist() == [end_of_turn]  # stopped at the first EOS id
def test_one_device_alternate_mode_trains_on_the_latest_sync_with_probability_m(tmp_path):
  # The m rule in alternate mode: a round searches k x B x m prompts, so k steps find
  # fresh prompts (before: one round of B prompts per window gave ~0.5 here). Also: the
  # logged lr is the one update u applies, lr(u) > 0 from the first warmup step.
  c = tiny_config(num_train_steps=12, mesh=dict(num_devices=1),
                  sync=dict(mode="alternate", every=2),
                  buffer=dict(num_prompts=4, samples_per_prompt=4, m=0.95, prefill=8),
                  sampler=dict(num_samples_per_prompt=4, num_prompts_per_batch=2),
                  optim=dict(schedule="wsd", warmup_steps=4, stable_steps=100, decay_steps=100))
  loop.run(c, str(tmp_path), task=toy_task(c))
  rows = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "reward_mean" in r]
  assert len(rows) == 12
  assert np.mean([r["fraction_from_latest"] for r in rows]) >= 0.9
  lr = c.optim.learning_rate
  assert [r["lr"] for r in rows[:5]] == pytest.approx([lr / 4, lr / 2, 3 * lr / 4, lr, lr])


@pytest.mark.slow  # ~22 s on 2 cores (2026-12-04): out of the default suite
def test_searchers_sample_in_the_model_dtype_under_float32_master_weights(tmp_path, monkeypatch):
  seen = {"configs": [], "params": set()}

  class Recording(Sampler):
    def __init__(self, model_config, *args, **kw):
      seen["configs"].append(model_config)
      super().__init__(model_config, *args, **kw)

    def __call__(self, params, prompts, key, **kw):
      seen["params"] |= {x.dtype for x in jax.tree.leaves(params)}
      return super().__call__(params, prompts, key, **kw)

  monkeypatch.setattr(config_builders, "Sampler", Recording)
  c = tiny_config(num_train_steps=2, mesh=dict(num_devices=2, num_trainer_devices=1),
                  sync=dict(mode="alternate"), buffer=dict(prefill=8),
                  model=dict(dtype="bfloat16"), optim=dict(master_weights_fp32=True))
  loop.run(c, str(tmp_path), task=toy_task(c))
  assert seen["configs"] and {cfg.dtype for cfg in seen["configs"]} == {"bfloat16"}
  assert seen["params"] == {jax.numpy.dtype("bfloat16")}
  # ... so the KV cache a searcher allocates is bfloat16, not the master weights' float32.
  assert KVCache.init(seen["configs"][0], 1, 8).k.dtype == jax.numpy.bfloat16


@pytest.mark.slow  # ~24 s on 2 cores (2026-12-04): out of the default suite
def test_resume_restores_the_reference_in_use_after_a_reset(tmp_path, monkeypatch):
  references = []
  original = Searcher.set_reference

  def recording(self, params):
    references.append(jax.tree.map(np.asarray, params))
    original(self, params)

  monkeypatch.setattr(Searcher, "set_reference", recording)
  # A reset at step 2, the checkpoint at step 3: the reference in use is neither the
  # initial model nor the checkpointed policy.
  c = tiny_config(num_train_steps=3, mesh=dict(num_devices=1), buffer=dict(prefill=8),
                  loss=dict(ref_reset_every=2), optim=dict(learning_rate=1e-2))
  loop.run(c, str(tmp_path), task=toy_task(c))
  assert len(references) == 1  # the reset at step 2
  in_use = references[0]
  longer = tiny_config(num_train_steps=4, mesh=dict(num_devices=1), buffer=dict(prefill=8),
                       loss=dict(ref_reset_every=2), optim=dict(learning_rate=1e-2))
  assert loop.run(longer, str(tmp_path), task=toy_task(longer))["step"] == 4
  assert len(references) == 3  # set on resume, then the reset at step 4
  for a, b in zip(jax.tree.leaves(references[1]), jax.tree.leaves(in_use)):
    np.testing.assert_array_equal(a, b)
  initial = init_params(ModelConfig(**c.model.random.to_dict()), c.seed)
  assert max(float(np.abs(a - np.asarray(b)).max()) for a, b in
             zip(jax.tree.leaves(in_use), jax.tree.leaves(initial))) > 1e-4


@pytest.mark.slow  # ~13 + 24 s on 2 cores (2026-12-04): out of the default suite
@pytest.mark.parametrize("mode", ["async", "alternate"])
def test_a_reward_model_scores_the_run_through_the_reward_stage(tmp_path, monkeypatch, mode):
  # A tiny random GPT-NeoX reward model (sharing the byte tokenizer's ids) scores every
  # completion on the searchers' devices; the trainer's buffer must hold exactly its scores.
  from hf_models import make_model
  from tba_jax import model
  from tba_jax.tasks import model_rewards
  path = str(tmp_path / "rm")
  make_model("gpt_neox", head="classifier", num_labels=1, vocab_size=261,
             seed=3).save_pretrained(path)
  buffers = []

  class Kept(loop.ReplayBuffer):
    def __init__(self, *args, **kw):
      super().__init__(*args, **kw)
      buffers.append(self)

  monkeypatch.setattr(config_builders, "ReplayBuffer", Kept)  # the global buffer's builder
  c = tiny_config(num_train_steps=4, mesh=dict(num_devices=2, num_trainer_devices=1),
                  sync=dict(mode=mode, every=2), buffer=dict(prefill=8))
  base = toy_task(c)
  task = Task(train=base.train, test=base.test, prompt=base.prompt,
              reward=model_rewards.ModelReward(path))
  assert loop.run(c, str(tmp_path / "run"), task=task)["step"] == 4
  entries = buffers[0].entries()
  assert len(entries) >= 8
  rm_cfg, rm = hf_checkpoints.load(path)
  for e in entries:
    tokens = np.concatenate([e.prompt, e.completion])[None]
    want = model.scores(rm_cfg, rm, tokens, np.ones_like(tokens))[0, 0]  # (may sample the pad id)
    assert e.reward == pytest.approx(float(want), abs=1e-4)
  assert len({round(e.reward, 4) for e in entries}) > 2  # real scores, not a constant


@pytest.mark.parametrize("where", ["trainer", pytest.param("searcher", marks=pytest.mark.slow)])
def test_evaluation_runs_where_eval_devices_says_and_logs_its_time(tmp_path, monkeypatch, where):
  seen = []
  real = config_builders.evaluator

  def recording(*args, **kw):
    seen.append(set(args[5].devices.flat))  # the evaluation mesh
    return real(*args, **kw)

  monkeypatch.setattr(config_builders, "evaluator", recording)
  c = tiny_config(num_train_steps=2, mesh=dict(num_devices=3, num_trainer_devices=1,
                                               num_searchers=2),
                  sync=dict(mode="async", every=2), buffer=dict(prefill=8),
                  eval=dict(every=1, devices=where))
  loop.run(c, str(tmp_path), task=toy_task(c))
  devices = jax.devices()
  assert seen == [{devices[0]} if where == "trainer" else {devices[1]}]
  evals = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "eval/greedy_pass@1" in r]
  assert [r["step"] for r in evals] == [0, 1, 2]
  assert all(r["eval_seconds"] > 0 for r in evals)


@pytest.mark.slow  # ~11 s on 2 cores (2026-12-04): out of the default suite
def test_evaluations_do_not_count_against_max_train_seconds(tmp_path, monkeypatch):
  """Each evaluation takes 1,000 s on the loop's clock; 500 s of training still trains on."""
  import time as real_time
  skipped = [0.0]
  monkeypatch.setattr(loop, "time", type("Clock", (), {
      "perf_counter": staticmethod(lambda: real_time.perf_counter() + skipped[0])}))
  evaluate = RunEvaluation.__call__

  def slow(self, *args, **kw):
    skipped[0] += 1000.0
    return evaluate(self, *args, **kw)

  monkeypatch.setattr(RunEvaluation, "__call__", slow)
  c = tiny_config(num_train_steps=4, max_train_seconds=500.0, eval=dict(every=1),
                  sync=dict(mode="alternate", every=1), mesh=dict(num_devices=1))
  assert loop.run(c, str(tmp_path), task=toy_task(c))["step"] == 4
  rows = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "loss" in r]
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
