"""The one token layout: prompts right-aligned before column Tp, completions after it."""
import numpy as np

from tba_jax import batch


def test_token_rows_align_every_completion_at_the_same_column():
  tokens, attention = batch.token_rows([[5, 6], [7], []], [[8, 9, 1], [], []],
                                      batch.Layout(3, 4, 0))
  np.testing.assert_array_equal(tokens, [[0, 5, 6, 8, 9, 1, 0], [0, 0, 7, 0, 0, 0, 0],
                                         [0, 0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(attention, [[0, 1, 1, 1, 1, 1, 0], [0, 0, 1, 0, 0, 0, 0],
                                            [0, 0, 0, 0, 0, 0, 0]])
  assert tokens.dtype == attention.dtype == np.int32


def test_distinct_fraction_counts_distinct_completions_per_group():
  entries_tokens = [[4, 5], [4, 5], [6], [4, 5],   # group 7: 2 distinct of 4
                    [9], [9]]                      # group 8: 1 distinct of 2
  tokens, attention = batch.token_rows([[1]] * 6, entries_tokens, batch.Layout(2, 3, 0))
  n = len(entries_tokens)
  b = batch.TrainBatch(tokens=tokens, attention_mask=attention,
                       completion_mask=np.ones((n, 3), np.float32),
                       ref_logprobs=np.zeros((n, 3), np.float32),
                       behaviour_logprobs=np.zeros((n, 3), np.float32),
                       rewards=np.zeros(n, np.float32),
                       group_ids=np.array([7, 7, 7, 7, 8, 8], np.int32),
                       prompt_ids=np.array([7, 7, 7, 7, 8, 8], np.int32),
                       versions=np.zeros(n, np.int32))
  assert batch.distinct_fraction(b) == (2 / 4 + 1 / 2) / 2


def test_completion_width_takes_the_smallest_bucket_that_holds_the_longest():
  widths = [batch.completion_width(n, 32, 4) for n in (0, 1, 8, 9, 16, 17, 24, 25, 32)]
  assert widths == [8, 8, 8, 16, 16, 24, 24, 32, 32]
  assert [batch.completion_width(n, 512, 4) for n in (100, 129, 300, 511)] == [128, 256, 384, 512]
  assert batch.completion_width(3, 4, 4) == 4  # never past the layout
  assert batch.completion_width(5, 32, 1) == 32  # one bucket: the full layout


def test_shares_prompts_holds_only_for_whole_runs_of_one_prompt():
  layout = batch.Layout(3, 2, 0)
  tokens, attention = batch.token_rows([[5, 6], [5, 6], [7], [7]], [[1], [2, 3], [], [4]], layout)
  assert batch.shares_prompts(tokens, attention, 3, 2)
  assert not batch.shares_prompts(tokens, attention, 3, 4)  # two prompts in a run of 4
  assert not batch.shares_prompts(tokens[:3], attention[:3], 3, 2)  # not whole runs
  assert not batch.shares_prompts(tokens, attention, 3, 1)  # a run of 1 shares nothing
  # The same tokens behind a different mask (a real token 0 against padding) differ.
  padded = attention.copy()
  padded[1, 0] = 1
  assert not batch.shares_prompts(tokens, padded, 3, 2)
