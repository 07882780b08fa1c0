"""LoRA: adapted forward = merged forward, only adapters train and sync, the reference
is the base, PEFT's format, every decoder architecture."""
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tba_jax import (config_builders, logprobs, lora, losses, model, optim, sampler, sharding,
                     train_state, train_step, weight_sync)
from tba_jax.config_checks import ConfigError
from tba_jax.model import LoRAConfig, ModelConfig

import hf_models
from train_step_test import TC, TEMPERATURE, equal_groups, favour_one_per_prompt, make_batch

ALL = ("q", "k", "v", "o", "gate", "up", "down")
_SMALL = dict(vocab_size=128, dim=64, mlp_dim=128, num_layers=2, num_heads=4, head_dim=16)
ARCHITECTURES = {  # the switches of model_config.ModelConfig's docstring
    "llama": ModelConfig(**_SMALL, num_kv_heads=2),
    "qwen2": ModelConfig(**_SMALL, num_kv_heads=2, qkv_bias=True, model_type="qwen2",
                         tie_embeddings=True),
    "gpt_neox": ModelConfig(**_SMALL, num_kv_heads=4, model_type="gpt_neox", norm="layer",
                            parallel_residual=True, rotary_fraction=0.25, activation="gelu",
                            gated_mlp=False, qkv_bias=True, bias=True),
    "gpt2": ModelConfig(**_SMALL, num_kv_heads=4, model_type="gpt2", norm="layer",
                        position_embedding="learned", activation="gelu_tanh", gated_mlp=False,
                        qkv_bias=True, bias=True, tie_embeddings=True),
    "qwen3": ModelConfig(**_SMALL, num_kv_heads=2, qk_norm=True, model_type="qwen3"),
    "gemma3_text": ModelConfig(**_SMALL, num_kv_heads=1, model_type="gemma3_text",
                               norm="rms_plus_one", qk_norm=True, post_norms=True,
                               embed_scale=True, activation="gelu_tanh", attn_scale=0.2,
                               sliding_window=3, sliding_layers=(0,), local_rope_theta=1e4,
                               final_logit_softcap=5.0, tie_embeddings=True),
}


def with_lora(cfg, rank=4, alpha=8.0, targets=None):
  return cfg.replace(lora=LoRAConfig(rank, alpha, targets or cfg.projections))


def trained_adapters(cfg, seed=1, scale=0.3):
  """Adapters as after some training: B no longer zero."""
  adapters = lora.init_adapters(cfg, seed)
  keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(adapters))))
  return jax.tree.map(lambda x: x + scale * jax.random.normal(next(keys), x.shape), adapters)


def rows(seed=0, lengths=(7, 4, 6)):
  return hf_models.left_padded_batch(np.random.default_rng(seed), lengths)


# ---------------------------------------------------------------------------
# The model.
# ---------------------------------------------------------------------------
# llama and gemma3_text by default; the other families (their norms, biases and positions
# differ, the adapted projections do not) are slow-marked, ~8 s each.
@pytest.mark.parametrize("name", [n if n in ("llama", "gemma3_text") else
                                  pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(ARCHITECTURES)])
def test_lora_forward_equals_the_merged_weights_forward(name):
  cfg = with_lora(ARCHITECTURES[name])
  base = model.init_params(lora.base_config(cfg), 0)
  params = lora.combine(base, trained_adapters(cfg))
  merged = lora.merge(cfg, params)
  tokens, mask = rows()
  adapted = model.logits(cfg, params, tokens, mask)
  # float32 round-off, which Qwen3's q/k norms amplify (measured up to 6.5e-5 on 4 of 2,688
  # logits): the parity bound the tests hold against transformers.
  np.testing.assert_allclose(adapted, model.logits(lora.base_config(cfg), merged, tokens, mask),
                             atol=1e-4, rtol=1e-5)
  assert np.abs(adapted - model.logits(lora.base_config(cfg), base, tokens, mask)).max() > 0.1
  # The cached decode (one token at a time: the unfused projections) adapts the same way.
  prompts = [[5, 6, 7], [8, 9]]
  greedy = functools.partial(sampler.generate, prompts=prompts, max_new_tokens=6, greedy=True)
  a, b = greedy(cfg, params), greedy(lora.base_config(cfg), merged)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_fresh_adapters_leave_the_model_as_it_was(tiny_cfg):
  cfg = with_lora(tiny_cfg)
  base = model.init_params(tiny_cfg, 0)
  tokens, mask = rows()
  np.testing.assert_array_equal(model.logits(cfg, lora.combine(base, lora.init_adapters(cfg)),
                                             tokens, mask),
                                model.logits(tiny_cfg, base, tokens, mask))


def test_adapter_shapes_and_what_rank_zero_leaves_alone(tiny_cfg):
  shapes = model.param_shapes(with_lora(tiny_cfg, rank=3, targets=("q", "o", "down")))
  base, adapters = lora.split(shapes)
  assert jax.tree.map(lambda x: x.shape, base) == \
      jax.tree.map(lambda x: x.shape, model.param_shapes(tiny_cfg))
  d, n, h, f = 64, 4, 16, 128
  assert jax.tree.map(lambda x: x.shape, adapters) == {"layers": {
      "attn": {"q_lora": {"lora_a": (2, d, 3), "lora_b": (2, 3, n * h)},
               "o_lora": {"lora_a": (2, n * h, 3), "lora_b": (2, 3, d)}},
      "mlp": {"down_lora": {"lora_a": (2, f, 3), "lora_b": (2, 3, d)}}}}
  assert lora.combine(*lora.split(shapes)) == shapes
  # Fused q/k/v (GPT-2, GPT-NeoX) take one adapter over the concatenated outputs.
  gpt2 = lora.split(model.param_shapes(with_lora(ARCHITECTURES["gpt2"], rank=3)))[1]
  assert sorted(gpt2["layers"]["attn"]) == ["o_lora", "qkv_lora"]
  assert gpt2["layers"]["attn"]["qkv_lora"]["lora_b"].shape == (2, 3, 3 * n * h)
  # model.lora.rank=0 is a model without adapters: full fine-tuning, nothing frozen.
  c = _tiny_config(rank=0)
  assert config_builders.lora_config(c.model.lora, tiny_cfg) is None
  assert lora.trained(tiny_cfg, shapes) is shapes and lora.frozen(tiny_cfg, shapes) == {}
  # Every adapter leaf has a sharding rule (FSDP on the trainer, tensor on searchers).
  mesh = sharding.make_mesh("trainer", jax.devices()[:2], tensor=2)
  specs = lora.split(sharding.param_specs(with_lora(tiny_cfg), "trainer", mesh))[1]
  assert specs["layers"]["mlp"]["up_lora"]["lora_b"] == sharding.P(None, None, "tensor")


@pytest.mark.parametrize("name,targets,error", [
    ("gpt2", "gate", "has no gate projection"),
    ("gpt_neox", "q,v", "one adapter; target all three"),
])
def test_targets_the_architecture_cannot_take_are_refused(name, targets, error):
  with pytest.raises(ValueError, match=error):
    ARCHITECTURES[name].replace(lora=LoRAConfig(4, 8.0, tuple(targets.split(","))))


def _tiny_config(rank=4, model=(), **sections):
  """configs/gsm8k.py:tiny with LoRA adapters of `rank` (0: none)."""
  from loop_test import tiny_config
  return tiny_config(model={"lora": dict(rank=rank, alpha=16.0, targets="all"), **dict(model)},
                     **sections)


def test_config_errors_name_the_lora_key():
  from tba_jax import config_checks
  c = _tiny_config()
  c.unlock()
  c.model.lora.targets = "q,value"
  with pytest.raises(ConfigError, match="model.lora.targets='q,value': must be 'all' or"):
    config_checks.validate(c)
  c.model.lora.targets, c.model.lora.alpha = "q", 0.0
  with pytest.raises(ConfigError, match="model.lora.alpha=0.0: must be > 0"):
    config_checks.validate(c)


# ---------------------------------------------------------------------------
# The trainer.
# ---------------------------------------------------------------------------
def _update(cfg, optimizer, num_devices=1, loss_fn=train_step.tb_loss):
  mesh = sharding.make_mesh("trainer", jax.devices()[:num_devices])
  objective = train_step.Objective(loss_fn, functools.partial(losses.constant_beta, beta=0.5),
                                   TEMPERATURE)
  update = train_step.make_update(cfg, optimizer, objective, mesh)
  place = lambda tree: jax.device_put(
      tree, lora.frozen(cfg, sharding.param_shardings(cfg, "trainer", mesh)))
  return update, train_state.state_shardings(cfg, optimizer, mesh), place


@pytest.mark.slow  # ~18 s on 2 cores (2026-12-04): out of the default suite
def test_only_the_adapters_train_and_their_gradient_is_the_merged_models(tiny_cfg):
  cfg = with_lora(tiny_cfg)
  base = jax.tree.map(np.asarray, model.init_params(tiny_cfg, 0))
  adapters = jax.tree.map(np.asarray, trained_adapters(cfg))
  batch = make_batch(tiny_cfg, 3, equal_groups(4, 4, seed=3), base)
  update, shardings, place = _update(cfg, optax.sgd(1.0))  # the change IS minus the gradient
  state = train_state.init_state(adapters, optax.sgd(1.0), shardings)
  frozen = place(base)
  state, metrics = update(state, batch, frozen)
  new = jax.tree.map(np.asarray, state.params)
  assert jax.tree.structure(new) == jax.tree.structure(adapters)  # the state holds adapters only
  for a, b in zip(jax.tree.leaves(frozen), jax.tree.leaves(base)):  # the base did not move
    np.testing.assert_array_equal(np.asarray(a), b)

  # The same loss through the merged weights: W + scale A B, differentiated w.r.t. A and B.
  def merged_loss(adapters):
    p = lora.merge(cfg, lora.combine(base, adapters))
    lp = model.completion_token_logprobs(tiny_cfg, p, batch.tokens, batch.attention_mask,
                                              TC, TEMPERATURE)
    return train_step.tb_loss(lp, batch, jnp.float32(0.5))[0]

  loss, grads = jax.value_and_grad(merged_loss)(adapters)
  np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
  for got, start, g in zip(jax.tree.leaves(new), jax.tree.leaves(adapters), jax.tree.leaves(grads)):
    np.testing.assert_allclose(start - got, g, atol=2e-5 * np.abs(g).max() + 1e-7)


def test_the_optimizer_state_holds_only_adapters(tiny_cfg):
  cfg = with_lora(tiny_cfg, targets=("q", "v"))
  optimizer = optim.make_optimizer(1e-3, 0.0, 1.0)
  _, shardings, _ = _update(cfg, optimizer)
  state = train_state.init_state(lora.init_adapters(cfg), optimizer, shardings)
  adapter_shapes = lora.split(jax.tree.map(lambda x: x.shape, model.param_shapes(cfg)))[1]
  mu, nu = state.opt_state[1][0].mu, state.opt_state[1][0].nu  # chain(clip, adamw)
  assert jax.tree.map(lambda x: x.shape, mu) == adapter_shapes == \
      jax.tree.map(lambda x: x.shape, nu)
  moments = sum(x.size for x in jax.tree.leaves(state.opt_state))
  assert moments == 2 * lora.count(cfg) + 1  # mu, nu and the step count: no base-sized leaf
  assert lora.count(cfg) == 2 * (64 * 4 + 4 * 64 + 64 * 4 + 4 * 32)  # 2 layers x (q + v)


@pytest.mark.parametrize("loss_fn", [  # the baselines slow-marked (~8 s each)
    train_step.tb_loss, pytest.param(train_step.rloo_loss, marks=pytest.mark.slow),
    pytest.param(train_step.grpo_loss, marks=pytest.mark.slow)])
def test_tb_and_the_baselines_raise_the_rewarded_completions_on_4_devices(tiny_cfg, loss_fn):
  cfg = with_lora(tiny_cfg, alpha=32.0)
  base = jax.tree.map(np.asarray, model.init_params(tiny_cfg, 0))
  ids = equal_groups(4, 4, seed=6)
  rewards, favoured = favour_one_per_prompt(ids)
  batch = make_batch(tiny_cfg, 6, ids, base, policy_params=base, rewards=rewards)
  optimizer = optim.make_optimizer(1e-3, 0.0, 1.0)
  update, shardings, place = _update(cfg, optimizer, num_devices=4, loss_fn=loss_fn)
  state, frozen = train_state.init_state(lora.init_adapters(cfg), optimizer, shardings), place(base)
  assert frozen["layers"]["mlp"]["up"].sharding.spec == sharding.P(None, "fsdp", None)
  for _ in range(4):
    state, metrics = update(state, batch, frozen)
  assert np.isfinite(float(metrics["loss"]))
  seq = lambda c, p: np.asarray(logprobs.masked_sum(
      model.completion_token_logprobs(c, p, batch.tokens, batch.attention_mask, TC,
                                           TEMPERATURE), batch.completion_mask))
  gain = seq(cfg, lora.combine(base, state.params)) - seq(tiny_cfg, base)
  others = np.setdiff1d(np.arange(len(ids)), favoured)
  assert gain[favoured].min() > gain[others].max(), gain


@pytest.mark.slow  # ~14 s on 2 cores (2026-12-04): out of the default suite
def test_sharded_lora_update_equals_single_device(tiny_cfg):
  cfg = with_lora(tiny_cfg)
  base = jax.tree.map(np.asarray, model.init_params(tiny_cfg, 0))
  adapters = jax.tree.map(np.asarray, trained_adapters(cfg))
  batch = make_batch(tiny_cfg, 4, equal_groups(4, 4, seed=4), base)
  out = []
  for n in (1, 4):
    update, shardings, place = _update(cfg, optax.sgd(1.0), num_devices=n)
    state, m = update(train_state.init_state(adapters, optax.sgd(1.0), shardings), batch,
                      place(base))
    out.append((jax.tree.map(np.asarray, state.params), float(m["loss"])))
  np.testing.assert_allclose(out[0][1], out[1][1], rtol=1e-5)
  for a, b, s in zip(jax.tree.leaves(out[0][0]), jax.tree.leaves(out[1][0]),
                     jax.tree.leaves(adapters)):
    # float32 sums in another order across 4 shards: measured up to 5.5e-5 of the largest step
    np.testing.assert_allclose(a - s, b - s, atol=1e-4 * max(np.abs(a - s).max(), 1e-6))


# ---------------------------------------------------------------------------
# Weight sync and the reference.
# ---------------------------------------------------------------------------
def _policy(tiny_cfg, mesh):
  cfg = with_lora(tiny_cfg, targets=("q", "v", "down"))
  trainer = sharding.param_shardings(cfg, "trainer", mesh)
  base = jax.device_put(model.init_params(tiny_cfg, 0), lora.frozen(cfg, trainer))
  return cfg, base, jax.device_put(trained_adapters(cfg), lora.trained(cfg, trainer))


@pytest.mark.parametrize("shared", [False, True])
def test_a_published_sync_carries_only_adapter_bytes(tiny_cfg, monkeypatch, shared):
  devices = jax.devices()
  trainer_mesh = sharding.make_mesh("trainer", devices[:1])
  searcher_mesh = sharding.make_mesh("searcher", devices[:1] if shared else devices[1:3])
  cfg, base, adapters = _policy(tiny_cfg, trainer_mesh)
  publish = config_builders.publisher(cfg, base, [searcher_mesh], "float32", trainer_mesh)
  moved = []
  real = weight_sync.publish
  monkeypatch.setattr(weight_sync, "publish",
                      lambda params, *a, **kw: moved.append(params) or real(params, *a, **kw))
  first, second = publish(adapters, 0), publish(jax.tree.map(lambda x: x + 1, adapters), 0)
  nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))
  assert [nbytes(t) for t in moved] == [nbytes(adapters)] * 2  # adapter bytes, nothing else
  assert nbytes(adapters) < 0.1 * nbytes(base)
  # Every version shares the searcher's one copy of the base ...
  for a, b in zip(jax.tree.leaves(lora.split(first)[0]), jax.tree.leaves(lora.split(second)[0])):
    assert a is b and a.sharding.mesh == searcher_mesh
  # ... which on a device shared with the trainer is the trainer's own base, not a copy.
  pointers = lambda tree: [s.data.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)
                           for s in x.addressable_shards]
  assert (pointers(lora.split(first)[0]) == pointers(base)) == shared
  np.testing.assert_array_equal(lora.split(second)[1]["layers"]["attn"]["q_lora"]["lora_a"],
                                np.asarray(adapters["layers"]["attn"]["q_lora"]["lora_a"]) + 1)


@pytest.mark.slow  # ~22 s on 2 cores (2026-12-04): out of the default suite
def test_the_reference_logprobs_with_lora_are_the_base_models(tiny_cfg):
  from tba_jax.tasks import Problem, Task
  devices = jax.devices()
  trainer_mesh = sharding.make_mesh("trainer", devices[:1])
  searcher_mesh = sharding.make_mesh("searcher", devices[1:2])
  cfg, base, adapters = _policy(tiny_cfg, trainer_mesh)
  problems = [Problem(i, {"question": f"q{i}"}, 0.0) for i in range(2)]
  task = Task(train=problems, test=problems, prompt=lambda p: p.fields["question"],
              reward=lambda text, gold: 0.0)
  publish = config_builders.publisher(cfg, base, [searcher_mesh], "float32", trainer_mesh)
  c = _tiny_config(searcher=dict(max_restarts=0, mismatch_every=0))
  pool = config_builders.searcher_pool(c, task, _ByteIds(), cfg, [searcher_mesh], publish=publish,
                                       params=adapters)
  searcher = pool.searchers[0]
  searcher.search_once()
  entries = searcher.buffer.drain_new()
  assert entries
  for e in entries:
    tokens = np.array([list(e.prompt) + list(e.completion)], np.int32)
    lp = lambda cfg, params: np.asarray(model.completion_token_logprobs(
        cfg, params, tokens, np.ones_like(tokens), e.completion.size, c.sampler.temperature))[0]
    np.testing.assert_allclose(e.ref_logprobs, lp(tiny_cfg, base), atol=1e-5)
    # The completions were sampled with the adapters on: their behaviour log-probs are the
    # adapted policy's, which the reference's differ from.
    np.testing.assert_allclose(e.behaviour_logprobs, lp(cfg, lora.combine(base, adapters)),
                               atol=1e-4)
  assert max(np.abs(e.ref_logprobs - e.behaviour_logprobs).max() for e in entries) > 1e-2


class _ByteIds:
  """What searcher_pool needs of a tokenizer, for the prompts "q0" and "q1"."""
  eos_ids, pad_id = (3,), 0

  def encode_prompt(self, text, templated=False):
    return {"q0": [5, 6, 7], "q1": [9, 8]}[text]

  def decode(self, ids):
    return " ".join(map(str, ids))


# ---------------------------------------------------------------------------
# PEFT's format.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name,targets", [
    ("llama", ALL), ("gpt2", ("q", "k", "v", "o", "down")), ("gpt_neox", ("q", "k", "v", "up")),
    ("qwen3", ALL), ("gemma3", ("q", "v", "o", "gate", "down"))])
def test_the_peft_export_loads_in_peft_and_matches_our_logits(tmp_path, name, targets):
  import peft
  import transformers
  from tba_jax import hf_checkpoints
  hf_models.make_model(name).save_pretrained(tmp_path / "base")
  base_cfg, base = hf_checkpoints.load(str(tmp_path / "base"))
  cfg = base_cfg.replace(lora=LoRAConfig(4, 8.0, targets))
  adapters = trained_adapters(cfg)
  hf_checkpoints.save_peft(cfg, adapters, str(tmp_path / "adapter"), base_model=str(tmp_path / "base"))
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
  adapted = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
  tokens, mask = rows(lengths=(9, 5))
  ours = np.asarray(model.logits(cfg, lora.combine(base, adapters), tokens, mask))
  real = mask.astype(bool)
  np.testing.assert_allclose(hf_models.hf_logits(adapted, tokens, mask)[real], ours[real],
                             atol=1e-4, rtol=0)
  # PEFT's own merge is our merge: the merged export is what the adapter describes.
  merged = lora.merge(cfg, lora.combine(base, adapters))
  hf_checkpoints.save_hf(base_cfg, jax.tree.map(np.asarray, merged), str(tmp_path / "merged"))
  theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
  np.testing.assert_allclose(hf_models.hf_logits(theirs, tokens, mask)[real], ours[real],
                             atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------
# The runtime.
# ---------------------------------------------------------------------------
_COMPARED = ("loss", "reward_mean", "kl", "staleness_mean", "searcher_samples", "buffer_entries")


@pytest.mark.slow  # ~45 s on 2 cores (2026-12-04): out of the default suite
def test_a_lora_run_resumes_exactly_and_exports_merged_weights_and_a_peft_adapter(
    tmp_path, monkeypatch):
  import peft
  import transformers
  from safetensors.numpy import load_file
  from loop_test import toy_task, _train_rows
  from tba_jax import hf_checkpoints, loop
  from tba_jax.checkpoint import Checkpointer
  # A Hugging Face base model (the byte tokenizer's 261 ids), as a run would load one.
  hf_models.make_model("llama", vocab_size=261).save_pretrained(tmp_path / "base")
  config = lambda steps: _tiny_config(
      num_train_steps=steps, mesh=dict(num_devices=2), sync=dict(mode="alternate", every=2),
      checkpoint=dict(every=100), buffer=dict(prefill=8), export=True,
      model=dict(path=str(tmp_path / "base"), tokenizer="bytes", dtype="float32",
                 lora=dict(rank=4, alpha=16.0, targets="q,v,o,down")),
      optim=dict(learning_rate=1e-2))
  saved, real_save = [], Checkpointer.save

  def save(self, step, state, *args, **kwargs):
    saved.append(jax.tree.map(lambda x: x.shape, state))
    return real_save(self, step, state, *args, **kwargs)

  monkeypatch.setattr(Checkpointer, "save", save)
  whole, parts = tmp_path / "whole", tmp_path / "parts"
  loop.run(config(4), str(whole), task=toy_task(config(4)))
  loop.run(config(2), str(parts), task=toy_task(config(2)))
  assert loop.run(config(4), str(parts), task=toy_task(config(4)))["step"] == 4
  want, got = _train_rows(str(whole)), _train_rows(str(parts))
  for a, b in zip(want[2:], got[2:]):  # the resumed steps are the uninterrupted run's
    assert {k: a[k] for k in _COMPARED} == {k: b[k] for k in _COMPARED}, a["step"]
  adapter = lambda run: load_file(run / "export" / loop.ADAPTER_DIR / "adapter_model.safetensors")
  a, b = adapter(whole), adapter(parts)
  assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
  # A checkpoint holds the adapters and their optimizer state, no base weight.
  base_cfg = hf_checkpoints.read_config(str(tmp_path / "base"))
  cfg = base_cfg.replace(lora=config_builders.lora_config(config(4).model.lora, base_cfg))
  adapter_shapes = lora.split(jax.tree.map(lambda x: x.shape, model.param_shapes(cfg)))[1]
  assert saved and all(s.params == adapter_shapes for s in saved)
  assert max(np.prod(x) for x in jax.tree.leaves(saved[0])) < 261 * 64  # not even the embedding
  # The export: merged weights for transformers, the adapter for peft onto the base.
  tokens, mask = hf_models.left_padded_batch(np.random.default_rng(0), [9, 5], vocab=261)
  merged = transformers.AutoModelForCausalLM.from_pretrained(whole / "export").eval()
  adapted = peft.PeftModel.from_pretrained(
      transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base"),
      whole / "export" / loop.ADAPTER_DIR).eval()
  real = mask.astype(bool)
  want = hf_models.hf_logits(merged, tokens, mask)[real]
  np.testing.assert_allclose(hf_models.hf_logits(adapted, tokens, mask)[real], want, atol=1e-4)
  base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
  assert np.abs(hf_models.hf_logits(base, tokens, mask)[real] - want).max() > 1e-3  # it trained



@pytest.mark.slow  # ~40 s; multi-host is in the default suite (distributed_test), LoRA too
def test_two_hosts_train_one_lora_policy_and_export_it(tmp_path):
  import json
  import socket
  import subprocess
  import sys
  from safetensors.numpy import load_file
  here = os.path.dirname(os.path.abspath(__file__))
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  procs = [subprocess.Popen([sys.executable, os.path.join(here, "lora_multihost_worker.py"),
                             str(port), str(i), str(tmp_path)], cwd=os.path.dirname(here),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  try:
    outputs = [p.communicate(timeout=420)[0] for p in procs]
  finally:
    for p in procs:  # never leave a process behind
      if p.poll() is None:
        p.kill()
        p.wait()
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-4000:]
  assert all("lora      rank 4" in out for out in outputs[:1])
  results = [json.loads(next(l[7:] for l in out.splitlines() if l.startswith("RESULT ")))
             for out in outputs]
  assert results[0]["buffer_digest"] == results[1]["buffer_digest"]  # one global buffer
  assert min(results[0]["max_version_by_searcher"].values()) > 0  # adapters reached both hosts
  adapter = load_file(tmp_path / "export" / "adapter" / "adapter_model.safetensors")
  assert any(np.abs(v).max() > 0 for k, v in adapter.items() if "lora_B" in k)  # trained
  assert (tmp_path / "export" / "model.safetensors").exists()
