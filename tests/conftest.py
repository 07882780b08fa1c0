"""Test setup: 8 fake CPU devices, set BEFORE jax is imported anywhere."""
import os

# The tests' programs are compiled without LLVM's optimisation passes (the flag below, unless
# XLA_FLAGS sets a level; the runs the tests launch inherit it): their shapes are tiny, so
# compiling is most of their time; on a 2-core AVX2 EPYC the default suite took 20.5 min at
# XLA's default level, 13.2-18.1 at 0 over three runs (2026-12-06, LAB_LOG). Results can differ in the last bit (at 0, one of 2,048 bfloat16 AdamW moments
# in optim_test's comparison with torch), so a test that compares bits with a peer compiles
# at the level users run at (USER_LEVEL).
_flags = os.environ.get("XLA_FLAGS", "")
if "--xla_backend_optimization_level" not in _flags:
  _flags += " --xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402  (after the flags above)

# Repeated test runs reuse compiled programs: on a developer's machine this process and the
# runs it launches share one cache. Under CI (a fresh machine, nothing to reuse) only the
# launched runs use it: jaxlib 0.10's CPU executable serialisation aborted this process in
# two clean CI-style runs (writing, then reading, a 4-device AdamW update's program).
TEST_CACHE = os.path.expanduser(os.environ.get("TBA_JAX_TEST_CACHE", "~/.cache/tba_jax_test_xla"))
if not os.environ.get("CI"):
  jax.config.update("jax_compilation_cache_dir", TEST_CACHE)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

import pytest  # noqa: E402

# jax.jit(..., compiler_options=USER_LEVEL): XLA's default backend level, which runs outside
# the tests.
USER_LEVEL = {"xla_backend_optimization_level": 3}

from tba_jax.model import ModelConfig  # noqa: E402

# Parametrised cases that took over 11 s each on 2 cores (2026-12-04): slow-marked here to keep
# the default suite short; their other cases stay in it (the whole functions
# slow-marked for the same reason carry the marker themselves).
SLOW_CASES = {
    "loop_test.py::test_a_resumed_alternate_run_repeats_the_uninterrupted_one[vargrad]",
    "loop_test.py::test_evaluation_runs_where_eval_devices_says_and_logs_its_time[trainer]",
    "loop_test.py::test_a_searcher_failure_is_restarted_and_the_run_finishes[2]",
    "streaming_test.py::test_a_streaming_run_trains_to_the_end_through_a_restart_and_checkpoints"
    "[2-True]",
    "streaming_test.py::test_entries_equal_the_static_searchers_when_weights_do_not_change"
    "[full_rows]",
    "lora_test.py::test_lora_forward_equals_the_merged_weights_forward[gemma3_text]",
    "lora_test.py::test_lora_forward_equals_the_merged_weights_forward[llama]",
    "lora_test.py::test_tb_and_the_baselines_raise_the_rewarded_completions_on_4_devices[tb_loss]",
    "tools_experiment_test.py::test_tiny_tool_run_trains_to_the_end_calling_its_tool[overrides1]",
    "model_test.py::test_a_prompt_shared_by_k_rows_runs_once_with_the_same_logits_and_gradients"
    "[sliding_qk_norm_bias]",
    "paged_kv_test.py::test_paged_pool_outputs_equal_static_on_a_ragged_batch[tight]",
    "continuous_test.py::test_outputs_with_num_slots_equal_static_on_a_ragged_batch[greedy]",
    "continuous_test.py::test_outputs_with_num_slots_equal_static_on_a_ragged_batch"
    "[min_tokens_end_with_eos]",
    "model_families_test.py::test_greedy_generation_static_and_streaming_matches_transformers"
    "[gemma3]",
    # ~9-10 s each on 2 cores (2026-12-04); their other cases stay in the default suite
    "layers_test.py::test_the_forward_with_dropout_is_the_plain_one_when_nothing_is_dropped"
    "[neox_parallel]",
    "train_step_test.py::test_baselines_train_through_the_same_update[rloo_loss]",
    "train_step_test.py::test_baselines_train_through_the_same_update[ratio_loss]",
    # 10-22 s each alone on the Xeon (2026-12-06, default suite 868 s); the last three keep
    # their other cases in the default suite
    "loop_test.py::test_async_runtime_on_8_devices_learns_and_reports_staleness",
    "attention_test.py::test_pallas_training_gradients_equal_xla",
    "loop_test.py::test_sigterm_during_an_evaluation_abandons_it_and_saves_that_step_without_an_"
    "update",
    "suite_tasks_test.py::test_each_tasks_tiny_config_runs_end_to_end[long_chat]",
    "benchmarks_test.py::test_the_tldr_searcher_benchmark_times_each_part_at_tiny_shapes",
    "attention_test.py::test_auto_on_a_gpu_keeps_gemma3_sliding_windows_in_bfloat16",
    "lr_control_test.py::test_update_drift_is_the_mean_change_of_each_rows_log_pi[dropout]",
    "continuous_test.py::test_outputs_with_num_slots_equal_static_on_a_ragged_batch[sampled]",
    # 13-21 s each on a 2-core AVX2 EPYC (2026-12-06, default suite 1,230 s at XLA's default
    # level); their other cases stay in the default suite (lr_control's sharded, micro-batched
    # case measures the drift at 2 micro-batches)
    "turns_test.py::test_multi_turn_rows_with_kv_pages_give_the_tokens_of_full_rows[pages]",
    "train_step_test.py::test_loss_and_gradient_do_not_depend_on_the_number_of_microbatches"
    "[ratio]",
    "lr_control_test.py::test_update_drift_is_the_mean_change_of_each_rows_log_pi[plain]",
    "lr_control_test.py::test_update_drift_does_not_depend_on_the_number_of_microbatches",
    # 8-15 s each there at backend level 0 (default suite 975 s); qwen3 keeps its gradients test,
    # a LoRA policy's reference keeps tldr_test's case, the plot tool its smaller tests
    "experiment_test.py::test_plot_shows_each_task_s_headline_metrics_for_runs_side_by_side",
    "model_families_test.py::test_greedy_generation_static_and_streaming_matches_transformers"
    "[qwen3]",
    "evaluation_test.py::test_a_lora_policys_reference_is_the_base_sampled_with_its_own_config",
    "lr_control_test.py::test_a_learned_log_z_trains_beside_the_controlled_policy",
}


@pytest.hookimpl(tryfirst=True)  # before -m selects
def pytest_collection_modifyitems(items):
  for item in items:
    if item.nodeid.removeprefix("tests/") in SLOW_CASES:
      item.add_marker(pytest.mark.slow)

TINY_LLAMA = ModelConfig(vocab_size=128, dim=64, mlp_dim=128, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=16, norm_eps=1e-6)


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
  """Each test file's compiled programs are dropped after it: one process runs the whole
  suite, and with every program kept XLA's CPU compiler aborted the process near its end
  (in a 4-device AdamW update, the same test every time; the test passes on its own)."""
  yield
  import gc
  jax.clear_caches()
  gc.collect()


@pytest.fixture
def tiny_cfg():
  return TINY_LLAMA


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_command(experiment: str, workdir: str) -> list[str]:
  """README's smoke test of `experiment` (readme_test.py checks that README shows it so),
  with the tests' compilation cache."""
  import sys
  return [sys.executable, "-m", f"experiments.{experiment}", "--config",
          f"configs/{experiment}.py:tiny", "--workdir", workdir,
          f"--compilation_cache={TEST_CACHE}"]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
  """`tiny_run(experiment)` -> (workdir, completed process): README's smoke test of the
  experiment, run once per test session for every test that reads it."""
  import subprocess
  done = {}

  def run(experiment):
    if experiment not in done:
      workdir = str(tmp_path_factory.mktemp(f"{experiment}_tiny") / "run")
      env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as
      env.update(PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")  # a user's; the configs ask for 2
      out = subprocess.run(tiny_command(experiment, workdir), cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=900)
      assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
      done[experiment] = workdir, out
    return done[experiment]

  return run



def eos_searcher(c):
  """Config `c`'s searcher pool as the run builds it (one searcher on local device 1),
  sampling with its random policy made to emit EOS whenever it may (`favouring`); and
  (pool, the random policy's own params, the tokenizer). pool.publish(1, params) swaps
  the EOS-favouring weights for the random policy's."""
  from tba_jax import config_builders, sharding, weight_sync
  tok = config_builders.load_tokenizer(c.model)
  task = config_builders.build_task(c.task, tok)
  devices = jax.local_devices()
  cfg, params, _ = config_builders.load_policy(
      c.model, tok, "float32", sharding.make_mesh("trainer", devices[:1]), c.seed)
  mesh = sharding.make_mesh("searcher", devices[1:2])
  publish = lambda p, i: weight_sync.publish(p, sharding.param_shardings(cfg, "searcher", mesh))
  pool = config_builders.searcher_pool(c, task, tok, cfg, [mesh], publish=publish,
                                       params=favouring(cfg, params, tok.eos_ids[0]))
  return pool, params, tok


def favouring(cfg, params, token: int, margin: float = 50.0):
  """`params` (a decoder's, host or device arrays) made to emit `token` whenever it may:
  the final norm outputs the constant b = margin * w / |w|^2, w the token's output row,
  so its logit is `margin` and the others' are margin * cos * |w_v| / |w| (far below)."""
  import jax.numpy as jnp
  out = params["embed"][token] if cfg.tie_embeddings else params["lm_head"][:, token]
  norm = dict(params["final_norm"], scale=jnp.zeros_like(params["final_norm"]["scale"]),
              bias=margin * out / jnp.sum(out * out))
  return dict(params, final_norm=norm)
