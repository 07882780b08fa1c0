"""Attention backends (tba_jax/attention.py): every backend that runs on CPU (the
Pallas GPU kernels in interpret mode) equals the xla path, for every architecture
family, with LoRA, static and streaming; backends that cannot run here, or cannot apply a
model's sliding windows, are refused; `auto` on a GPU (faked) keeps the windows."""
import jax
import numpy as np
import pytest

from hf_models import make_model, padded_batch
from tba_jax import attention, continuous, hf_checkpoints, logprobs, lora, model, sampler
from tba_jax.model_config import LoRAConfig, ModelConfig

# Llama (rope), GPT-NeoX (partial rotary, parallel residual, biases), GPT-2 (learned
# positions), Qwen2 (q/k/v biases).
FAMILIES = ["llama", "gpt_neox", "gpt2", "qwen2"]

# A tiny Gemma 3: sliding layers 0 and 2 with a window of 8, far shorter than the rows.
TINY_GEMMA3 = ModelConfig(
    vocab_size=128, dim=64, mlp_dim=128, num_layers=4, num_heads=4, num_kv_heads=2,
    head_dim=16, norm="rms_plus_one", qk_norm=True, post_norms=True, embed_scale=True,
    activation="gelu_tanh", attn_scale=24 ** -0.5, final_logit_softcap=5.0, rope_theta=1e6,
    sliding_window=8, sliding_layers=(0, 2), local_rope_theta=1e4, model_type="gemma3",
    dtype="bfloat16")


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
  """(name, cfg with LoRA on every projection, params with trained-looking adapters)."""
  hf = make_model(request.param, seed=3)
  path = str(tmp_path_factory.mktemp(request.param))
  hf.save_pretrained(path)
  cfg, base = hf_checkpoints.load(path)
  cfg = cfg.replace(lora=LoRAConfig(4, 8.0, cfg.projections))
  adapters = lora.init_adapters(cfg, 1)
  keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(adapters))))
  adapters = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape), adapters)
  return request.param, cfg, lora.combine(base, adapters)


def _impl(cfg, impl):
  return cfg.replace(attention_impl=impl)


def _assert_as_exact_as_xla(got, run_xla, atol, rtol=0.0):
  """`got` (a pytree) equals `run_xla()` at the highest matmul precision within atol/rtol on
  CPU. On a GPU the Triton kernels round float32 dots' inputs to TF32, so there `got` may
  be as far from it as twice xla's own TF32 result is, plus atol."""
  with jax.default_matmul_precision("highest"):
    want = run_xla()
  if jax.default_backend() == "gpu":
    with jax.default_matmul_precision("tensorfloat32"):
      tf32 = run_xla()
    atol += 2 * max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                    for a, b in zip(jax.tree.leaves(tf32), jax.tree.leaves(want)))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=atol, rtol=rtol), got, want)


def test_pallas_logits_equal_xla_left_and_right_padded(family):
  _, cfg, params = family
  for side in ("left", "right"):
    tokens, mask = padded_batch(np.random.default_rng(0), [11, 6, 1], side)
    real = mask.astype(bool)
    logits = lambda impl: np.asarray(model.logits(_impl(cfg, impl), params, tokens, mask))[real]
    _assert_as_exact_as_xla(logits("pallas"), lambda: logits("xla"), atol=2e-5)


@pytest.mark.slow  # interpret-mode decode kernels over four families: minutes on 2 cores
def test_pallas_greedy_tokens_equal_xla_static_and_streaming(family):
  name, cfg, params = family
  prompts = [[5, 9, 17, 33, 4, 8, 60], [7, 11, 3], [99]]
  options = sampler.SamplingOptions(max_new_tokens=8, greedy=True)
  want = sampler.generate(_impl(cfg, "xla"), params, prompts, options)
  got = sampler.generate(_impl(cfg, "pallas"), params, prompts, options)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-4)
  streamed = continuous.generate(sampler.Sampler(_impl(cfg, "pallas"), options), params, prompts,
                                 jax.random.key(0), num_slots=2, window_step=16)
  np.testing.assert_array_equal(streamed.tokens, want.tokens)
  assert len(set(want.tokens.ravel().tolist())) > 4, name  # the tokens depend on the context


@pytest.mark.slow  # ~10 s in interpret mode; the logits and gradients tests stay default
def test_pallas_greedy_tokens_equal_xla_on_a_tiny_lora_llama(tiny_cfg):
  cfg = tiny_cfg.replace(lora=LoRAConfig(4, 8.0, tiny_cfg.projections))
  params = model.init_params(cfg, 2)
  params = {**params, "lm_head": params["lm_head"] * 4.0}  # peaked: greedy ties are rare
  prompts = [[5, 9, 17, 33], [7, 11], [99]]
  options = sampler.SamplingOptions(max_new_tokens=6, greedy=True)
  want = sampler.generate(_impl(cfg, "xla"), params, prompts, options)
  np.testing.assert_array_equal(sampler.generate(_impl(cfg, "pallas"), params, prompts,
                                                 options).tokens, want.tokens)
  streamed = continuous.generate(sampler.Sampler(_impl(cfg, "pallas"), options), params, prompts,
                                 jax.random.key(0), num_slots=2, window_step=16)
  np.testing.assert_array_equal(streamed.tokens, want.tokens)


def test_pallas_training_gradients_equal_xla(tiny_cfg):
  params = model.init_params(tiny_cfg, 0)
  tokens, mask = padded_batch(np.random.default_rng(1), [9, 5], "left")

  def loss(p, cfg):
    lp = model.completion_token_logprobs(cfg, p, tokens, mask, 4, 1.0)
    return logprobs.masked_sum(lp, mask[:, -4:]).sum()

  got = jax.grad(loss)(params, _impl(tiny_cfg, "pallas"))
  _assert_as_exact_as_xla(got, lambda: jax.grad(loss)(params, _impl(tiny_cfg, "xla")),
                          atol=2e-5, rtol=1e-4)


on_gpu = pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN runs on a GPU alone "
                            "(benchmarks/gpu.sh runs this file there)")


@on_gpu
def test_cudnn_is_as_exact_as_xla_in_bfloat16_at_odd_lengths(tiny_cfg):
  """cuDNN takes bfloat16 alone: its logits are no further from float32 xla's than bfloat16
  xla's are, over odd lengths (it needs even ones: attention.causal_attention pads), and
  its prefills into odd-length caches give xla's first greedy token. (Later tokens come
  from the shared decode path but over caches whose deeper layers differ in bfloat16
  rounding: on an H200 one row of three took another token at its fifth.)"""
  params = model.init_params(tiny_cfg, 2)
  params = {**params, "lm_head": params["lm_head"] * 4.0}  # peaked: greedy ties are rare
  bf16 = tiny_cfg.replace(dtype="bfloat16")
  half = jax.tree.map(lambda x: x.astype("bfloat16"), params)
  for side in ("left", "right"):
    tokens, mask = padded_batch(np.random.default_rng(0), [11, 6, 1], side)
    real = mask.astype(bool)
    exact = np.asarray(model.logits(_impl(tiny_cfg, "xla"), params, tokens, mask))[real]
    err = {impl: np.abs(np.asarray(model.logits(_impl(bf16, impl), half, tokens, mask))[real]
                        - exact).max() for impl in ("xla", "cudnn")}
    assert err["cudnn"] <= 2 * err["xla"] + 1e-3, err
  prompts = [[5, 9, 17, 33, 4, 8, 60], [7, 11, 3], [99]]
  for new in (7, 8):  # a 16-slot prompt bucket: caches of 22 and 23 slots
    options = sampler.SamplingOptions(max_new_tokens=new, greedy=True)
    want = sampler.generate(_impl(bf16, "xla"), half, prompts, options)
    got = sampler.generate(_impl(bf16, "cudnn"), half, prompts, options)
    np.testing.assert_array_equal(got.tokens[:, 0], want.tokens[:, 0])
    np.testing.assert_allclose(got.logprobs[:, 0], want.logprobs[:, 0], atol=0.05)


@on_gpu
def test_cudnn_applies_gemma3_sliding_windows():
  """cuDNN's bfloat16 logits for a model with sliding layers are no further from float32
  xla's than bfloat16 xla's are (attending globally misses by units), at an odd length."""
  cfg = TINY_GEMMA3
  params = model.init_params(cfg.replace(dtype="float32"), 0)
  half = jax.tree.map(lambda x: x.astype("bfloat16"), params)
  tokens, mask = padded_batch(np.random.default_rng(0), [41, 29], "left")
  real = mask.astype(bool)
  exact = np.asarray(model.logits(_impl(cfg.replace(dtype="float32"), "xla"), params, tokens,
                                  mask))[real]
  err = {impl: np.abs(np.asarray(model.logits(_impl(cfg, impl), half, tokens, mask))[real]
                      - exact).max() for impl in ("xla", "cudnn")}
  assert err["cudnn"] <= 2 * err["xla"] + 1e-3, err


def test_decode_split_fits_the_kernel():
  for s in (1, 15, 16, 37, 64, 200, 256, 300, 1024, 2100, 4096):
    splits, size = attention._decode_split(s)
    chunk = size // splits
    assert size >= s and size % splits == 0 and chunk >= 16 and splits <= 16
    # Triton's blocks are powers of two: a chunk is one block, or whole blocks of 256.
    assert (chunk <= 256 and chunk & (chunk - 1) == 0) or chunk % 256 == 0
  for n in (1, 11, 16, 17, 100, 128, 129, 300):
    size = attention.kernel_length(n, 128)
    assert size >= max(n, 16) and (size & (size - 1) == 0 if size <= 128 else size % 128 == 0)
  assert [attention.kernel_length(n, 128) for n in (11, 33, 129)] == [16, 64, 256]


def test_backends_that_cannot_run_here_are_refused(tiny_cfg):
  assert attention.resolve("auto", "cpu") == "xla"
  assert attention.resolve("auto", "tpu") == "pallas"
  assert attention.resolve("auto", "gpu") == "cudnn"
  assert attention.resolve("auto", "gpu", "float32") == "xla"  # cuDNN takes no float32
  # Pallas's kernels apply no window; cuDNN takes the layers' masks, windows included.
  assert attention.resolve("auto", "tpu", sliding=True) == "xla"
  assert attention.resolve("auto", "gpu", sliding=True) == "cudnn"
  with pytest.raises(ValueError, match="'cudnn' takes bfloat16 or float16, not float32"):
    attention.resolve("cudnn", "gpu", "float32")
  with pytest.raises(ValueError, match="'cudnn' needs a gpu device; .* backend is 'cpu'"):
    attention.resolve("cudnn", "cpu")
  with pytest.raises(ValueError, match="attention_impl='flash': must be one of"):
    tiny_cfg.replace(attention_impl="flash")
  sliding = tiny_cfg.replace(sliding_window=4, sliding_layers=(0,), attention_impl="pallas")
  with pytest.raises(ValueError, match="'pallas': its kernels apply no sliding window"):
    attention.check(sliding)
  with pytest.raises(ValueError, match="'pallas': its kernels apply no sliding window"):
    attention.resolve("pallas", "gpu", sliding=True)
  assert attention.check(sliding.replace(attention_impl="xla")) == {"float32": "xla"}


@pytest.fixture
def fake_gpu(monkeypatch):
  """This process reports a GPU, and cuDNN's attention runs as XLA's on the same
  arguments (mask included): a CPU run of what `auto` does on a GPU. Yields the list of
  implementations the forward asked jax.nn.dot_product_attention for (None: XLA's)."""
  asked, dot_product_attention = [], jax.nn.dot_product_attention

  def fake(*args, implementation=None, **kw):
    asked.append(implementation)
    return dot_product_attention(*args, implementation=None, **kw)

  # Programs traced for one backend are not reused for the other: caches dropped both ways.
  jax.clear_caches()
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(jax.nn, "dot_product_attention", fake)
  yield asked
  jax.clear_caches()


def test_auto_on_a_gpu_keeps_gemma3_sliding_windows_in_bfloat16(fake_gpu):
  """`auto` picks cuDNN on a GPU for bfloat16 queries: its forward must apply the
  sliding layers' windows as xla does (it once attended globally there while decode
  slid: the trainer's log-probs were not the sampling policy's), in training, scoring
  and the prefill of generation."""
  cfg = TINY_GEMMA3
  params = jax.tree.map(lambda x: x.astype("bfloat16"),
                        model.init_params(cfg.replace(dtype="float32"), 0))
  tokens, mask = padded_batch(np.random.default_rng(0), [40, 29], "left")
  logits = {impl: np.asarray(model.logits(_impl(cfg, impl), params, tokens, mask))
            for impl in ("xla", "auto")}
  assert fake_gpu.count("cudnn") == 1  # auto's forward ran cuDNN's arguments
  np.testing.assert_array_equal(logits["auto"], logits["xla"])
  prompts = [list(range(3, 43)), [5, 9, 17, 33, 4, 8, 60]]  # a cache of 40 + 5 slots (odd)
  options = sampler.SamplingOptions(max_new_tokens=6, greedy=True)
  want = sampler.generate(_impl(cfg, "xla"), params, prompts, options)
  got = sampler.generate(_impl(cfg, "auto"), params, prompts, options)
  assert fake_gpu.count("cudnn") == 2  # the prefill's
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.logprobs, want.logprobs)


def test_check_picks_the_forwards_backend_in_every_dtype_the_run_computes_in(tiny_cfg, fake_gpu):
  """float32 master weights with bfloat16 compute: check answers for both dtypes what
  the forward then runs (it once resolved with the master dtype alone: xla, while the
  bfloat16 forward ran cuDNN)."""
  master = tiny_cfg.replace(attention_impl="auto")
  params = model.init_params(master, 0)
  tokens = np.arange(3, 15)[None]
  ran = {}
  for dtype in ("float32", "bfloat16"):
    fake_gpu.clear()
    model.logits(master.replace(dtype=dtype), jax.tree.map(lambda x: x.astype(dtype), params),
                 tokens)
    ran[dtype] = "xla" if set(fake_gpu) == {None} else fake_gpu[0]
  assert attention.check(master, ("bfloat16",)) == ran == {"float32": "xla", "bfloat16": "cudnn"}
  with pytest.raises(ValueError, match="'cudnn' takes bfloat16 or float16, not float32"):
    attention.check(master.replace(attention_impl="cudnn"), ("bfloat16",))


@pytest.mark.slow
def test_smollm2_pallas_greedy_32_tokens_equal_xla_static_and_streaming():
  from tba_jax import tokenizer as tokenizer_lib
  path = hf_checkpoints.smollm2_gguf_path()
  tok = tokenizer_lib.from_gguf(path)
  cfg, params = hf_checkpoints.load(path)
  rows = [tok.encode(tok.chat_prompt(q)) for q in
          ("What is 17 times 23?", "Name three prime numbers.")]
  options = sampler.SamplingOptions(max_new_tokens=32, greedy=True, eos_ids=tok.eos_ids,
                                    pad_id=tok.pad_id)
  want = sampler.generate(_impl(cfg, "xla"), params, rows, options)
  got = sampler.generate(_impl(cfg, "pallas"), params, rows, options)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  streamed = continuous.generate(sampler.Sampler(_impl(cfg, "pallas"), options), params, rows,
                                 jax.random.key(0), num_slots=2)
  np.testing.assert_array_equal(streamed.tokens, want.tokens)
  assert want.lengths.min() > 8
