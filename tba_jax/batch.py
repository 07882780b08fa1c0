"""The training batch and its token layout, written once for everyone who builds one.

  layout = Layout(prompt_len=Tp, completion_len=Tc, pad_id=pad)
  tokens, attention = token_rows(prompts, completions, layout)
  batch = from_entries(entries, layout, include_eos, group_ids)  # the buffer's batches
  size = bucket(n, buckets, "batch size")        # the compiled shape n rounds up to
  batch = trim_completions(batch, num_widths)    # drop completion columns nobody uses
  tokens, mask = left_pad(prompts, length, pad)  # [N, length] rows, right-aligned

Every row holds its prompt right-aligned in columns [0, Tp) (left padding) and
its completion from column Tp (right padding), so every completion starts at
the same column. The searchers build exactly these rows to score reference
log-probs, the replay buffer to train on, so both see the same positions. The
sampler, the continuous-batching pool and the reward models pad their inputs
with the same `left_pad` / `right_pad` into shapes chosen by `bucket`.

Groups. The losses estimate log Z (TB) or a baseline (RLOO, GRPO) per GROUP of
rows, and a group is a batch SLOT: the K samples the replay buffer drew for one
of its B slots. A prompt that fills two slots (the buffer holds fewer distinct
prompts than B) is two groups of K, as in the authors' code, where each
micro-batch is one slot. `prompt_ids` name the prompt itself (a learned log Z is
a table indexed by prompt id).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from tba_jax.entries import Entry


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainBatch:
  """N = P prompts x R samples, flat, in the layout above (host NumPy or device arrays)."""
  tokens: np.ndarray             # [N, Tp + Tc] int32, pad id where absent
  attention_mask: np.ndarray     # [N, Tp + Tc] int32, 1 = real prompt/completion token
  completion_mask: np.ndarray    # [N, Tc] float32, 1 = completion token counted in log pi (a
                                 # token the model generated: an environment's are 0)
  ref_logprobs: np.ndarray       # [N, Tc] float32, per-token reference log-probs (tempered)
  behaviour_logprobs: np.ndarray  # [N, Tc] float32, per-token log-probs of the sampling policy
  rewards: np.ndarray            # [N] float32
  group_ids: np.ndarray          # [N] int32, the row's group: its batch slot (any integers,
                                 # any order; module docstring)
  prompt_ids: np.ndarray         # [N] int32, the row's prompt id
  versions: np.ndarray           # [N] int32, policy version that generated each sample

  @property
  def prompt_len(self) -> int:
    return self.tokens.shape[1] - self.completion_mask.shape[1]


@dataclasses.dataclass(frozen=True)
class Layout:
  """The columns of a token row (module docstring): the prompt right-aligned in
  [0, prompt_len), the completion from column prompt_len on, pad_id elsewhere."""
  prompt_len: int      # Tp: the longest prompt (task.max_prompt_len)
  completion_len: int  # Tc: the longest completion (sampler.max_new_tokens)
  pad_id: int = 0

  @property
  def width(self) -> int:
    return self.prompt_len + self.completion_len


def bucket(n: int, buckets: Sequence[int], what: str) -> int:
  """The smallest of `buckets` (sorted) that holds `n`; `what` names n in the error."""
  for b in buckets:
    if b >= n:
      return b
  raise ValueError(f"{what} {n} exceeds the largest bucket {max(buckets)}; add a larger bucket")


def left_pad(seqs: Sequence[Sequence[int]], length: int, pad_id: int,
             num_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(tokens, mask) [num_rows (None: len(seqs)), length] int32: row i holds seqs[i]
  right-aligned after pad_id (mask 1 on its tokens); rows past len(seqs) are all
  padding, mask 0."""
  tokens = np.full((len(seqs) if num_rows is None else num_rows, length), pad_id, np.int32)
  mask = np.zeros(tokens.shape, np.int32)
  for i, seq in enumerate(seqs):
    if len(seq):
      tokens[i, length - len(seq):], mask[i, length - len(seq):] = seq, 1
  return tokens, mask


def right_pad(seqs: Sequence[Sequence[int]], length: int, pad_id: int,
              num_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """As `left_pad`, with each sequence left-aligned (pad_id after it)."""
  tokens = np.full((len(seqs) if num_rows is None else num_rows, length), pad_id, np.int32)
  mask = np.zeros(tokens.shape, np.int32)
  for i, seq in enumerate(seqs):
    tokens[i, :len(seq)], mask[i, :len(seq)] = seq, 1
  return tokens, mask


def token_rows(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
               layout: Layout) -> tuple[np.ndarray, np.ndarray]:
  """(tokens, attention) [N, Tp + Tc] int32 of prompt + completion rows (module docstring);
  an EOS token is attended to, counted in log pi or not."""
  prompt, prompt_mask = left_pad(prompts, layout.prompt_len, layout.pad_id)
  completion, completion_mask = right_pad(completions, layout.completion_len, layout.pad_id)
  return (np.concatenate([prompt, completion], axis=1),
          np.concatenate([prompt_mask, completion_mask], axis=1))


def from_entries(entries: Sequence[Entry], layout: Layout, include_eos: bool,
                 group_ids: Sequence[int]) -> TrainBatch:
  """A TrainBatch of `entries`, one row each, in order; `group_ids` [N] their groups."""
  n, tc = len(entries), layout.completion_len
  tokens, attention = token_rows([e.prompt for e in entries], [e.completion for e in entries],
                                 layout)
  counted = np.zeros((n, tc), np.float32)
  ref, beh = np.zeros((n, tc), np.float32), np.zeros((n, tc), np.float32)
  for r, e in enumerate(entries):
    # include_eos=False drops the EOS token's own log-prob (the authors' pad == eos case);
    # a truncated sample has no EOS, so all its tokens count.
    c = e.length - 1 if e.ended_with_eos and not include_eos else e.length
    # Only the model's own tokens count (Entry.model_mask): an environment's reply between
    # turns is attended to (conditioning) but in no log pi, log pi_ref or baseline.
    model = e.model_mask[:c] > 0
    counted[r, :c] = model
    # Log-probs are zero wherever completion_mask is 0, so a plain sum over Tc is exactly
    # the log pi the loss counts.
    ref[r, :c] = np.where(model, e.ref_logprobs[:c], 0.0)
    beh[r, :c] = np.where(model, e.behaviour_logprobs[:c], 0.0)
  return TrainBatch(
      tokens=tokens, attention_mask=attention, completion_mask=counted, ref_logprobs=ref,
      behaviour_logprobs=beh, rewards=np.array([e.reward for e in entries], np.float32),
      group_ids=np.asarray(group_ids, np.int32).reshape(n),
      prompt_ids=np.array([e.prompt_id for e in entries], np.int32),
      versions=np.array([e.version for e in entries], np.int32))


def shares_prompts(tokens: np.ndarray, attention: np.ndarray, prompt_len: int, k: int) -> bool:
  """Whether the rows come in runs of k with the same prompt columns (tokens and mask):
  what lets a forward run each run's prompt once (model.completion_logits' prompt_group)."""
  n = tokens.shape[0]
  if k < 2 or n % k:
    return False
  runs = lambda x: x[:, :prompt_len].reshape(n // k, k, prompt_len)
  return bool(np.all(runs(tokens) == runs(tokens)[:, :1]) and
              np.all(runs(attention) == runs(attention)[:, :1]))


def completion_width(longest: int, full: int, num_widths: int) -> int:
  """The completion columns a batch whose longest completion has `longest` tokens needs:
  the smallest of `num_widths` evenly spaced widths (full * i / num_widths, rounded up to a
  multiple of 8, at most `full`) that holds it. num_widths = 1: always `full`."""
  widths = [min(-(-(full * i // num_widths) // 8) * 8, full) for i in range(1, num_widths)]
  return next((w for w in widths if w >= longest), full)


def trim_completions(batch: TrainBatch, num_widths: int) -> TrainBatch:
  """`batch` with its completion columns cut to `completion_width` of its longest
  completion (at most num_widths shapes, so at most num_widths compiles of whatever
  takes it). Exact: the columns dropped are padding in every row (attention 0,
  completion_mask 0, log-probs 0), and positions count real tokens only."""
  tc = batch.completion_mask.shape[1]
  used = batch.attention_mask[:, batch.prompt_len:].any(axis=0)
  longest = int(np.flatnonzero(used)[-1]) + 1 if used.any() else 0
  width = completion_width(longest, tc, num_widths)
  if width == tc:
    return batch
  keep = batch.prompt_len + width
  return dataclasses.replace(
      batch, tokens=batch.tokens[:, :keep], attention_mask=batch.attention_mask[:, :keep],
      completion_mask=batch.completion_mask[:, :width],
      ref_logprobs=batch.ref_logprobs[:, :width],
      behaviour_logprobs=batch.behaviour_logprobs[:, :width])


def distinct_fraction(batch: TrainBatch) -> float:
  """Mean over the batch's groups of (distinct completions in the group) / (its rows).

  1.0: every sample of a prompt differs; 1/K: the K samples are one completion (the
  policy has collapsed on that prompt, or the buffer had fewer than K to draw from).
  """
  completions = batch.tokens[:, batch.prompt_len:]
  groups: dict[int, list[bytes]] = {}
  for gid, row in zip(batch.group_ids.tolist(), completions):
    groups.setdefault(gid, []).append(row.tobytes())
  return float(np.mean([len(set(rows)) / len(rows) for rows in groups.values()]))
