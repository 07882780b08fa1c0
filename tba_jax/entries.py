"""Replay-buffer entries: one scored completion, validation, and the fixed-width
32-bit wire format (`pack` / `unpack`) that crosses hosts in an all-gather.

  arrays = pack(entries, max_prompt_len=Tp, max_completion_len=Tc, num_rows=R)
  same = unpack(arrays)                          # validated copies, same order
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import numpy as np

# Entry fields as (name, dtype): one value per entry, and one per completion token. pack
# and unpack are written over these tables; the 32-bit types survive a JAX
# all-gather (no x64) unchanged.
# (ReplayBuffer.state_dict uses them too.)
SCALAR_FIELDS = (("prompt_id", np.int32), ("reward", np.float32), ("version", np.int32),
                 ("searcher_id", np.int32), ("ended_with_eos", np.int32),
                 ("temperature", np.float32), ("last_version", np.int32))
# (model_mask last: states and layouts saved before it existed lack it, and load as all ones.)
PER_TOKEN_FIELDS = (("completion", np.int32), ("ref_logprobs", np.float32),
                    ("behaviour_logprobs", np.float32), ("model_mask", np.int32))


@dataclasses.dataclass(frozen=True, eq=False)
class Entry:
  """One scored completion; arrays are 1-D and unpadded (length = completion size)."""
  prompt_id: int
  prompt: np.ndarray              # [Lp] int32, shared by all entries of the prompt
  completion: np.ndarray          # [L] int32, the EOS token included when ended_with_eos
  reward: float
  ref_logprobs: np.ndarray        # [L] float32 per-token reference log-probs (tempered)
  behaviour_logprobs: np.ndarray  # [L] float32 per-token log-probs of the sampling policy
  # Policy versions (trainer steps of the weights) that sampled it: `version` the
  # oldest (its prompt's prefill; staleness is measured from it), `last_version` the
  # newest, later when a streaming searcher took new weights in flight (None: = version).
  version: int
  searcher_id: int = 0
  ended_with_eos: bool = False    # False: truncated at the max length, no EOS
  temperature: float = 1.0        # the sampling temperature of its batch (searchers explore)
  last_version: int | None = None
  # [L] int32, 1 where the model generated the token, 0 where the environment wrote it (a
  # tool's reply between turns: conditioning, never counted in log pi or log pi_ref).
  # None: all ones (a single-turn completion, and states saved before turns existed).
  model_mask: np.ndarray | None = None

  def __post_init__(self):
    if self.last_version is None:  # sampled under one version (and states saved before)
      object.__setattr__(self, "last_version", self.version)
    if self.model_mask is None:
      object.__setattr__(self, "model_mask", np.ones(np.shape(self.completion)[:1], np.int32))

  @property
  def length(self) -> int:
    return int(self.completion.shape[0])

  @property
  def ref_logprob_sum(self) -> float:
    """log pi_ref(y|x) over the model's completion tokens (EOS included)."""
    return float(np.sum(np.where(self.model_mask > 0, self.ref_logprobs, 0.0), dtype=np.float64))


def frozen(x, dtype) -> np.ndarray:
  """A private read-only 1-D copy: callers cannot corrupt stored entries, and batches can
  be built from entries outside the buffer's lock."""
  a = np.array(x, dtype=dtype).reshape(-1)
  a.flags.writeable = False
  return a


def normalized(e: Entry) -> Entry:
  """A validated copy with frozen arrays and plain Python scalars."""
  completion = frozen(e.completion, np.int32)
  ref, beh = frozen(e.ref_logprobs, np.float32), frozen(e.behaviour_logprobs, np.float32)
  mask = frozen(e.model_mask, np.int32)
  if ref.shape != completion.shape or beh.shape != completion.shape or mask.shape != completion.shape:
    raise ValueError(f"prompt id {e.prompt_id}: {completion.size} completion tokens but "
                     f"{ref.size} reference and {beh.size} behaviour log-probs and a model mask "
                     f"of {mask.size}")
  if not np.isin(mask, (0, 1)).all():
    raise ValueError(f"prompt id {e.prompt_id}: model_mask holds values other than 0 and 1")
  if e.ended_with_eos and completion.size == 0:
    raise ValueError(f"prompt id {e.prompt_id}: ended_with_eos with an empty completion")
  if e.last_version < e.version:
    raise ValueError(f"prompt id {e.prompt_id}: last_version {e.last_version} < version "
                     f"{e.version} (the oldest)")
  if not np.isfinite(e.reward):
    raise ValueError(f"prompt id {e.prompt_id}: non-finite reward {e.reward}")
  # Rewards are rounded to float32 on entry so pack/unpack (32-bit, which survives a JAX
  # all-gather without x64) is lossless and every host holds bit-identical buffers.
  return Entry(int(e.prompt_id), frozen(e.prompt, np.int32), completion,
               float(np.float32(e.reward)), ref, beh, int(e.version), int(e.searcher_id),
               bool(e.ended_with_eos), float(np.float32(e.temperature)), int(e.last_version),
               mask)


def check_fits(entries: Iterable[Entry], max_prompt_len: int, max_completion_len: int):
  """Raises ValueError naming the first entry longer than the given widths."""
  for e in entries:
    if e.prompt.size > max_prompt_len:
      raise ValueError(f"prompt id {e.prompt_id}: prompt has {e.prompt.size} tokens, more than "
                       f"max_prompt_len={max_prompt_len}")
    if e.length > max_completion_len:
      raise ValueError(f"prompt id {e.prompt_id}: completion has {e.length} tokens, more than "
                       f"max_completion_len={max_completion_len}")


# --- Crossing hosts: fixed-width 32-bit arrays (a JAX all-gather keeps them exact) --------
def pack(entries: Sequence[Entry], *, max_prompt_len: int, max_completion_len: int,
         num_rows: int | None = None) -> dict[str, np.ndarray]:
  """Entries as zero-padded arrays of `num_rows` rows (default len(entries)).

  For a padded, size-first all-gather: gather the counts, pack every host's
  entries to the largest count, gather, then `unpack` each host's slice in
  process order. Keys: the Entry field names, `prompt_len`, `length`, and
  `count` (0-d, how many rows are real).
  """
  n = len(entries)
  rows = n if num_rows is None else num_rows
  if rows < n:
    raise ValueError(f"num_rows={rows} < {n} entries")
  check_fits(entries, max_prompt_len, max_completion_len)
  out = {"count": np.array(n, np.int32), "prompt_len": np.zeros(rows, np.int32),
         "length": np.zeros(rows, np.int32), "prompt": np.zeros((rows, max_prompt_len), np.int32)}
  out.update({name: np.zeros(rows, dt) for name, dt in SCALAR_FIELDS})
  out.update({name: np.zeros((rows, max_completion_len), dt) for name, dt in PER_TOKEN_FIELDS})
  for i, e in enumerate(entries):
    out["prompt_len"][i], out["length"][i] = e.prompt.size, e.length
    out["prompt"][i, :e.prompt.size] = e.prompt
    for name, _ in SCALAR_FIELDS:
      out[name][i] = getattr(e, name)
    for name, _ in PER_TOKEN_FIELDS:
      out[name][i, :e.length] = getattr(e, name)
  return out


def unpack(arrays: dict[str, np.ndarray]) -> list[Entry]:
  """The first `count` rows of a `pack` layout back to (validated, copied) entries."""
  a = {k: np.asarray(v) for k, v in arrays.items()}
  out = []
  for i in range(int(a["count"])):
    # A layout saved before a field existed lacks it: the field's default.
    fields = {n: a[n][i].item() for n, _ in SCALAR_FIELDS if n in a}
    fields.update({n: a[n][i, :a["length"][i]] for n, _ in PER_TOKEN_FIELDS if n in a})
    out.append(normalized(Entry(prompt=a["prompt"][i, :a["prompt_len"][i]], **fields)))
  return out
