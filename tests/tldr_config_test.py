"""configs/tldr.py: Table 3's settings, the beta and lr schedules at the spec's steps, the
Table-1 run's layout, and every variant passing the config check."""
import jax
import pytest

from configs import tldr
from tba_jax import config_builders, config_checks


@pytest.mark.parametrize("variant", tldr.VARIANTS)
def test_every_variant_passes_the_config_check(variant):
  config_checks.validate(tldr.get_config(variant))


def test_table3_settings():
  for variant, size, prompts in (("pythia410m", "410m", 2), ("pythia1b", "1b", 1),
                                 ("pythia2p8b", "2.8b", 1)):
    c = tldr.get_config(variant)
    assert c.model.path == f"mnoukhov/pythia{size}-sft-tldr"
    assert c.task.reward_model == f"mnoukhov/pythia{size}-rm-tldr6.9b"
    assert c.task.gold_reward_model == "cleanrl/EleutherAI_pythia-6.9b-deduped__reward__tldr"
    assert (c.model.dtype, c.model.remat) == ("float32", size == "2.8b")
    assert (c.num_train_steps, c.buffer.num_prompts, c.buffer.samples_per_prompt) == (256, 8, 20)
    assert c.num_train_steps * 8 * 20 == 40960  # episodes
    assert (c.sampler.num_samples_per_prompt, c.sampler.temperature, c.sampler.top_p,
            c.sampler.max_new_tokens, c.sampler.num_prompts_per_batch) == (20, 0.7, 1.0, 128,
                                                                             prompts)
    assert (c.buffer.m, c.sync.every, c.mesh.num_searchers, c.mesh.num_trainer_devices) == \
        (0.5, 10, 3, 1)
    assert (c.buffer.reward_weight, c.buffer.reward_tau, c.buffer.max_per_prompt) == (1.0, 1.0, 100)
    assert c.buffer.prefill == (20000 if size == "2.8b" else 10000)
    assert (c.optim.learning_rate, c.optim.schedule, c.optim.warmup_steps, c.optim.weight_decay,
            c.optim.grad_clip_norm, c.optim.num_microbatches) == (3e-6, "linear", 0, 0.0, 0.0, 8)
    assert (c.loss.name, c.loss.include_eos, c.loss.ratio_clip) == ("tb", True, 0.0)
    assert (c.task.max_prompt_len, c.eval.temperature, c.eval.max_new_tokens,
            c.eval.num_samples, c.eval.greedy) == (512, 0.010001, 128, 1, False)


def test_beta_switches_abruptly_at_step_32_and_lr_decays_from_the_first_update():
  c = tldr.get_config("pythia410m")
  beta = config_builders.beta_schedule(c.loss)
  # (tldr_spec.md) beta = 0.05 (u-1)/128 + (1 - (u-1)/128) for u < 32, then 0.05.
  assert float(beta(1)) == 1.0
  assert float(beta(31)) == pytest.approx(0.05 * 30 / 128 + (1 - 30 / 128), rel=1e-6)
  assert float(beta(31)) == pytest.approx(0.77734375, rel=1e-6)
  assert float(beta(32)) == pytest.approx(0.05) and float(beta(256)) == pytest.approx(0.05)
  lr = config_builders.lr_schedule(c.optim, c.num_train_steps)
  # The scheduler steps before each update: update 1 uses 3e-6 * 255/256, update 256 uses 0.
  assert float(lr(1)) == pytest.approx(3e-6 * 255 / 256, rel=1e-6)
  assert float(lr(256)) == 0.0
  assert float(jax.jit(lr)(256)) == 0.0  # as the jitted update computes it


def test_table1_run_is_625_steps_with_two_searchers_on_three_devices():
  c = tldr.get_config("pythia410m_table1")
  assert (c.num_train_steps, c.mesh.num_searchers, c.mesh.num_devices) == (625, 2, 3)
  assert (c.loss.beta_anneal_steps, c.loss.beta_switch_step) == (312, 78)
  trainer, searchers, mode = config_builders.meshes(c.mesh, c.sync.mode)
  assert (trainer.devices.size, [m.devices.size for m in searchers], mode) == (1, [1, 1], "async")


def test_tiny_is_async_on_two_cpu_devices_with_local_data_and_random_models():
  c = tldr.get_config("tiny")
  assert (c.sync.mode, c.mesh.num_cpu_devices, c.model.path, c.model.tokenizer) == \
      ("async", 2, "random", "pythia_bytes")
  assert (c.task.reward_model, c.task.gold_reward_model) == ("random", "random")
  assert c.task.data_path.endswith("configs/data/tldr_tiny")


def test_tldr_only_keys_are_checked_for_tldr():
  c = tldr.get_config("tiny").unlock()
  c.task.reward_dtype = "float16"
  with pytest.raises(config_checks.ConfigError, match="task.reward_dtype='float16': must be one"):
    config_checks.validate(c)
