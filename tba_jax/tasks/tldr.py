"""Reddit TL;DR summarisation: the paper's preference fine-tuning task (tldr_spec.md).

Data. The dataset `vwxyzjn/summarize_from_feedback_tldr_3_filtered_oai_preprocessing_
1706381144` (or a local directory of `train` / `validation` .jsonl or .parquet files with
its field names). The prompt is the row's `query`, already formatted as
"SUBREDDIT: r/...\\n\\nTITLE: ...\\n\\nPOST: ...\\n\\nTL;DR:"; it is re-tokenized with no
special tokens and rows longer than `max_prompt_len` (512) tokens are dropped, in both
splits (bbartoldson/TBA tba_tldr.py L31-46, L86-91). Problem ids are row indices in the
split, so they survive the filter unchanged.

Tokens. The Pythia SFT tokenizers use <|endoftext|> = 0 as EOS and <|padding|> = 1 as pad
(async_rlhf sft.py L68 adds the pad token); `check_tokenizer` refuses a tokenizer without a
pad token of its own, which would silently pad with EOS.

Reward (the searcher's; TBA src/tba_trainer_tldr.py L447-486): the training reward model's
raw score of prompt + completion read at the completion's first EOS token, which the
completion ends with; -1 for a completion cut off at 128 tokens without EOS (TRL's
get_reward / non_eos_penalty). No whitening.

Evaluation (TBA eval_tldr/*, src/perplexity.py, src/kl.py), over the generations of one pass
(the configs: the validation split at T = 0.010001, 128 new tokens), with the text the
authors score: the query + the completion decoded with its special tokens
("...<|endoftext|>"), re-tokenized:
  win_rate              mean [gold(generation) > gold(reference summary)], the gold reward
                        model's score read at the token before the first EOS (their
                        pipeline pads with EOS = 0 and reads before the first 0), the
                        reference being query.strip() + reference_response;
  gold_reward, gold_reward_reference  the mean gold scores themselves;
  perplexity            Table 1's "perplexity" under the reference (SFT) policy, with its
                        quirk: per sample exp(NLL summed over the tokens after the last
                        "TL;DR:" / (all tokens - 1)), then averaged over samples;
  perplexity_per_token  the same NLL over the number of tokens it sums (a clean per-token
                        perplexity), averaged over samples;
  kl                    the KL the authors log: per sample, the full-vocabulary
                        KL(pi_ref || pi) of the next-token distributions at each token after
                        the last "TL;DR:" (the one after the final token included), averaged
                        over those positions, then over samples. Their pipeline batches 16
                        texts, right-pads them and also counts the padding positions up to
                        the batch's longest text; that part depends on how texts are batched
                        and on transformers' masking of padding queries, and is left out.
The gold reward model is sharded (tensor-parallel) over all of this process's devices when
the evaluation runs on a searcher of one device (the paper's layouts), else it stays on the
evaluation's devices (`Evaluation.build`). A row whose text has no "TL;DR:" gets
perplexity 1 (the authors' value: no label counts), a KL of 0 and a per-token perplexity
of 1.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from tba_jax import batch as batch_lib
from tba_jax import hf_checkpoints, model, sharding
from tba_jax.errors import ConfigError, DataError
from tba_jax.model_config import ModelConfig
from tba_jax.tasks import Metric, Problem, RewardBatch, Task, read_records
from tba_jax.tasks.model_rewards import ModelReward, Scorer

HUB_ID = "vwxyzjn/summarize_from_feedback_tldr_3_filtered_oai_preprocessing_1706381144"
MARKER = "TL;DR:"  # where the summary starts (the authors' prompt_template)
FIELDS = ("query", "reference_response")
# "random" reward models: a tiny GPT-NeoX classifier over the tokenizer's vocabulary, from
# RANDOM_SEED (the tiny config's training and gold reward models are then the same function).
RANDOM_CLASSIFIER = ModelConfig(
    vocab_size=0, dim=64, mlp_dim=256, num_layers=2, num_heads=4, num_kv_heads=4, head_dim=16,
    norm="layer", parallel_residual=True, rotary_fraction=0.25, activation="gelu",
    gated_mlp=False, qkv_bias=True, bias=True, model_type="gpt_neox", num_labels=1)
RANDOM_SEED = 1
# Evaluation batches: few shapes, so the 6.9B gold model and the policy / reference pair
# compile a handful of times per run, not once per length.
GOLD_ROWS, STATS_ROWS = 32, 16
LENGTH_BUCKETS = tuple(range(128, 8193, 128))


# ---------------------------------------------------------------------------
# Data.
# ---------------------------------------------------------------------------
def _hub_files(split: str) -> list[str]:
  try:
    import huggingface_hub
    root = huggingface_hub.snapshot_download(HUB_ID, repo_type="dataset",
                                             allow_patterns=[f"*{split}-*.parquet"])
  except Exception as e:
    raise DataError(f"could not fetch TL;DR ({HUB_ID}, {split}) from the Hugging Face hub "
                  f"({type(e).__name__}: {e}); pass a local directory with {split}.jsonl or "
                  f"{split}.parquet (--config.task.data_path)") from None
  files = sorted(glob.glob(os.path.join(root, "**", f"{split}-*.parquet"), recursive=True))
  if not files:
    raise OSError(f"{HUB_ID} has no {split}-*.parquet files")
  return files


def load_rows(split: str, path: str | None = None) -> list[dict]:
  """The rows of `split` ("train" / "validation"): from the hub, or a local directory
  holding `{split}.jsonl` or `{split}.parquet` with the dataset's field names."""
  if path is None:
    files = _hub_files(split)
  else:
    if not os.path.isdir(path):
      raise DataError(f"TL;DR data_path {path!r} is not a directory")
    files = [f for f in (os.path.join(path, f"{split}{ext}") for ext in (".jsonl", ".parquet"))
             if os.path.exists(f)][:1]
    if not files:
      raise DataError(f"{path}: no {split}.jsonl or {split}.parquet")
  rows = [row for f in files for row in read_records(f)]
  for i, row in enumerate(rows):
    missing = [k for k in FIELDS if not isinstance(row.get(k), str)]
    if missing:
      raise DataError(f"{files[0]}: row {i} lacks the text field(s) {missing} "
                       f"(keys: {sorted(row)})")
  return rows


def to_problems(rows: Sequence[dict], tokenizer,
                max_prompt_len: int) -> tuple[list[Problem], int]:
  """(Problems of the rows whose query is at most `max_prompt_len` tokens, number dropped).

  The query is tokenized with no special tokens, as the authors filter it; a Problem's
  fields are the `query` and the `reference` summary (" ...<|endoftext|>"); no target (a
  reward model scores the completions).
  """
  kept = [Problem(i, {"query": row["query"], "reference": row["reference_response"]})
          for i, row in enumerate(rows) if len(tokenizer.encode(row["query"])) <= max_prompt_len]
  return kept, len(rows) - len(kept)


def check_tokenizer(tokenizer, source: str) -> None:
  """Stops when the tokenizer lacks the EOS or a pad token of its own (module docstring)."""
  hf = tokenizer.hf
  if hf.eos_token_id is None or hf.pad_token_id is None or hf.pad_token_id == hf.eos_token_id:
    raise ConfigError(
        f"the TL;DR task needs the SFT tokenizer's special tokens, EOS <|endoftext|> (id 0) "
        f"and pad <|padding|> (id 1); the tokenizer from {source!r} has EOS "
        f"{hf.eos_token!r} ({hf.eos_token_id}) and pad {hf.pad_token!r} ({hf.pad_token_id}). "
        "Use the SFT model's tokenizer (model.tokenizer=mnoukhov/pythia410m-sft-tldr), which "
        "sets <|padding|> as its pad token")


# ---------------------------------------------------------------------------
# Reward models: a checkpoint, or "random".
# ---------------------------------------------------------------------------
def load_classifier(path: str, mesh, vocab_size: int, dtype: str = "float32"):
  """(config, params) on `mesh` of a ...ForSequenceClassification checkpoint, or of the
  random classifier (RANDOM_CLASSIFIER over `vocab_size` tokens) when path is "random"."""
  if path == "random":
    cfg = RANDOM_CLASSIFIER.replace(vocab_size=vocab_size, dtype=dtype)
    return cfg, jax.device_put(_random_params(cfg), sharding.param_shardings(cfg, "searcher", mesh))
  return hf_checkpoints.load(path, dtype, mesh=mesh, role="searcher")


@functools.lru_cache(maxsize=None)
def _random_params(cfg: ModelConfig):
  # Created (and its init compiled) once, then copied to each mesh that asks for it.
  return model.init_params(cfg, RANDOM_SEED)


@dataclasses.dataclass(frozen=True)
class Reward(ModelReward):
  """The training reward (module docstring); `path` may be "random"."""
  vocab_size: int = 0  # the tokenizer's: the random classifier's vocabulary

  def load(self, mesh):
    return load_classifier(self.path, mesh, self.vocab_size, self.dtype)


# ---------------------------------------------------------------------------
# Evaluation.
# ---------------------------------------------------------------------------
def last_marker_end(ids: Sequence[int], marker: Sequence[int]) -> int | None:
  """The index after the last occurrence of `marker` in `ids` (None: absent)."""
  n = len(marker)
  for start in range(len(ids) - n, -1, -1):
    if list(ids[start:start + n]) == list(marker):
      return start + n
  return None


def before_first(ids: Sequence[int], token: int) -> list[int]:
  """`ids` up to (without) the first `token`: the gold pipeline reads its score there."""
  ids = list(ids)
  return ids[:ids.index(token)] if token in ids else ids


@functools.partial(jax.jit, static_argnames=("model_config", "reference_config", "prefix_len"))
def _suffix_stats(params, reference, tokens, mask, *, model_config, reference_config, prefix_len):
  """Per row (NLL of the suffix tokens under `reference`, KL(ref || pi) summed over the
  suffix positions), for rows [prefix (left-padded) | suffix (right-padded)] at prefix_len.
  Each policy runs with its own config (a LoRA policy's reference is the base)."""
  positions = model.positions_from_mask(mask)

  def log_probs(cfg, p):  # [B, Tc + 1, V]: the distributions at positions prefix_len - 1 ...
    hidden, _ = model.forward(cfg, p, tokens, positions, mask)
    return jax.nn.log_softmax(model.unembed(cfg, p, hidden[:, prefix_len - 1:]), -1)

  ref, pi = log_probs(reference_config, reference), log_probs(model_config, params)
  suffix, counted = tokens[:, prefix_len:], mask[:, prefix_len:] > 0
  # ref[:, t] predicts suffix token t; ref[:, t + 1] is the distribution AT suffix token t,
  # where the authors' KL counts (their labels mask is not shifted).
  nll = -jnp.take_along_axis(ref[:, :-1], suffix[..., None], axis=-1)[..., 0]
  kl = jnp.sum(jnp.exp(ref[:, 1:]) * (ref[:, 1:] - pi[:, 1:]), axis=-1)
  return (jnp.sum(jnp.where(counted, nll, 0.0), axis=1),
          jnp.sum(jnp.where(counted, kl, 0.0), axis=1))


def suffix_stats(model_config, params, reference_config, reference,
                 rows: Sequence[tuple[list[int], list[int]]], mesh,
                 pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """(NLL sums [N], KL sums [N]) of the (prefix, suffix) token rows on `mesh` (params and
  reference already there, each of its config); one prefix / suffix bucket for all rows,
  so one compile."""
  tp = batch_lib.bucket(max(len(p) for p, _ in rows), LENGTH_BUCKETS, "TL;DR prefix length")
  tc = batch_lib.bucket(max(len(s) for _, s in rows), LENGTH_BUCKETS, "TL;DR summary length")
  b = -(-STATS_ROWS // sharding.batch_size_multiple("searcher", mesh)) * \
      sharding.batch_size_multiple("searcher", mesh)
  place = lambda x: jax.device_put(x, sharding.batch_sharding("searcher", mesh, 2))
  nll, kl = [], []
  for start in range(0, len(rows), b):
    chunk = list(rows[start:start + b])
    chunk += [([pad_id], [])] * (b - len(chunk))  # padding rows: nothing counted
    tokens, mask = batch_lib.token_rows([p for p, _ in chunk], [s for _, s in chunk],
                                        batch_lib.Layout(tp, tc, pad_id))
    out = _suffix_stats(params, reference, place(tokens), place(mask), model_config=model_config,
                        reference_config=reference_config, prefix_len=tp)
    n = min(b, len(rows) - start)
    nll.append(np.asarray(out[0])[:n])
    kl.append(np.asarray(out[1])[:n])
  return np.concatenate(nll).astype(np.float64), np.concatenate(kl).astype(np.float64)


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """Task.evaluation of TL;DR (module docstring): build(mesh) -> MetricsFn."""
  gold_path: str  # the gold reward model: a checkpoint, or "random"
  tokenizer: object  # the policy's (tokenizer.Tokenizer); Pythia models share one vocabulary
  dtype: str = "float32"

  def build(self, mesh):
    tok = self.tokenizer
    gold_mesh = mesh
    if mesh.devices.size == 1:
      # Searchers of one device each run no collectives, so a program over every device
      # (from the trainer's thread) cannot interleave with theirs in a different order on
      # two devices. With larger searchers the gold model stays on the evaluation's own.
      devices = jax.local_devices()
      gold_mesh = sharding.make_mesh("searcher", devices, tensor=len(devices))
    cfg, params = load_classifier(self.gold_path, gold_mesh, tok.vocab_size, self.dtype)
    gold = Scorer(cfg, params, gold_mesh, pad_id=tok.pad_id,
                          length_buckets=LENGTH_BUCKETS, batch_buckets=(GOLD_ROWS,))
    eos, marker = tok.eos_ids[0], tok.encode(MARKER)
    reference_scores: dict[int, float] = {}  # problem id -> gold score of its reference

    def gold_scores(sequences):
      seqs = [before_first(s, eos) for s in sequences]
      return np.concatenate([gold(seqs[i:i + GOLD_ROWS])[:, 0]
                             for i in range(0, len(seqs), GOLD_ROWS)]).astype(np.float64)

    def metrics(batch: RewardBatch, policy) -> dict:
      # The text the authors score: vLLM's prompt + output text, special tokens kept and no
      # clean-up of spaces, re-tokenized.
      texts = [p.fields["query"] + tok.hf.decode([int(t) for t in c], skip_special_tokens=False,
                                          clean_up_tokenization_spaces=False)
               for p, c in zip(batch.problems, batch.completions)]
      ids = [tok.encode(t) for t in texts]
      new = {p.id: p for p in batch.problems if p.id not in reference_scores}
      if new:  # the references' scores do not depend on the policy: computed once
        refs = [tok.encode(p.fields["query"].strip() + p.fields["reference"])
                for p in new.values()]
        reference_scores.update(zip(new, gold_scores(refs)))
      generated = gold_scores(ids)
      reference = np.array([reference_scores[p.id] for p in batch.problems])
      ends = [last_marker_end(s, marker) for s in ids]
      split = [(s[:e], s[e:]) if e is not None else (s, []) for s, e in zip(ids, ends)]
      nll, kl = suffix_stats(policy.model_config, policy.params, policy.reference_config,
                             policy.reference, split, mesh, tok.pad_id)
      counted = np.array([max(len(s), 1) for _, s in split], np.float64)
      total = np.array([len(s) for s in ids], np.float64)
      return {"win_rate": (generated > reference).astype(np.float64),
              "gold_reward": generated, "gold_reward_reference": reference,
              "perplexity": np.exp(nll / np.maximum(total - 1, 1)),
              "perplexity_per_token": np.exp(nll / counted), "kl": kl / counted}

    return metrics


# ---------------------------------------------------------------------------
# The task.
# ---------------------------------------------------------------------------
# What the run prints as `start -> end` and the plot tool draws (tasks.Task.headline).
REWARD_METRIC = Metric("reward_mean", "train reward: the reward model's score (-1 without EOS)")
HEADLINE = (
    Metric("eval/win_rate", "win rate against the reference summaries (gold reward model)",
           "fraction"),
    Metric("eval/perplexity", "perplexity under the SFT policy (Table 1's definition)"),
    Metric("eval/kl", "KL(pi_ref || pi) per summary token", "nats"))


def make_task(train: Sequence[Problem], test: Sequence[Problem], tokenizer, *, reward_model: str,
              gold_reward_model: str, dtype: str = "float32") -> Task:
  """The TL;DR Task: prompts are the queries, the reward and evaluation as above."""
  return Task(
      train=train, test=test, prompt=lambda p: p.fields["query"],
      reward=Reward(reward_model, no_eos_reward=-1.0, dtype=dtype, pad_id=tokenizer.pad_id,
                    vocab_size=tokenizer.vocab_size),
      evaluation=Evaluation(gold_reward_model, tokenizer, dtype), name="tldr",
      reward_metric=REWARD_METRIC, headline=HEADLINE)
