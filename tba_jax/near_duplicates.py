"""Near duplicates among completions, the red-teaming buffer's diversity filter (Lee et al.,
GFNOrg/red-teaming utils.py L289-480; replay_buffer.ReplayBuffer(near_duplicate=tol)): the
token edit distance of one completion to many, and Lee's test of two completions being near
duplicates, a distance below tol x (len_a + len_b).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def first_within(x: np.ndarray, candidates: Sequence[np.ndarray], tol: float) -> int | None:
  """The index of the first of `candidates` (token arrays) whose edit distance to the
  tokens `x` is below tol x (len(x) + len(candidate)), or None."""
  lengths = np.array([t.size for t in candidates])
  ys = np.full((len(candidates), max(lengths.max(), 1)), -1, np.int64)
  for i, t in enumerate(candidates):
    ys[i, :t.size] = t
  close = edit_distances(x, ys, lengths) < tol * (x.size + lengths)
  return int(np.argmax(close)) if close.any() else None


def edit_distances(x: np.ndarray, ys: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  """Levenshtein distances [N] of the token sequence x to each ys[i, :lengths[i]].

  Row by row over x, vectorised over the N candidates and their columns: with
  best[j] = min(above + 1, diagonal + mismatch), the row is
  D[j] = min(i + j, min_{k<=j} best[k] + j - k), a running minimum.
  """
  n, m = ys.shape
  cols = np.arange(m + 1)
  row = np.broadcast_to(cols, (n, m + 1))
  for i, token in enumerate(np.asarray(x), 1):
    best = np.minimum(row[:, 1:] + 1, row[:, :-1] + (ys != token))
    shifted = np.concatenate([np.full((n, 1), i), best - cols[1:]], axis=1)
    row = np.minimum.accumulate(shifted, axis=1) + cols
  return row[np.arange(n), lengths]
