"""TL;DR: data and the prompt filter, special ids, the reward's read position and -1
penalty, and the evaluation (gold win rate, Table 1's perplexity, the logged KL) against
the authors' formulas computed with transformers' PyTorch models."""
import json

import jax
import numpy as np
import pytest

from tba_jax import config_builders, hf_checkpoints, sharding
from tba_jax import tokenizer as tokenizer_lib
from tba_jax.errors import DataError
from tba_jax.evaluation import Policy
from tba_jax.tasks import Problem, RewardBatch, tldr

EOS, PAD = 0, 1  # Pythia's, and pythia_bytes'


def _query(post: str) -> str:
  return f"SUBREDDIT: r/test\n\nTITLE: a title\n\nPOST: {post}\n\nTL;DR:"


def _row(post: str, summary: str = "it") -> dict:
  return {"query": _query(post), "reference_response": f" {summary}<|endoftext|>"}


@pytest.fixture(scope="module")
def tok():
  return tokenizer_lib.load("pythia_bytes")


# ---------------------------------------------------------------------------
# Data, the 512-token filter, special ids.
# ---------------------------------------------------------------------------
def test_rows_load_from_jsonl_or_parquet_with_the_datasets_field_names(tmp_path):
  import pyarrow
  import pyarrow.parquet
  rows = [_row("one"), _row("two")]
  (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows[::-1]),
                              str(tmp_path / "validation.parquet"))
  assert tldr.load_rows("train", str(tmp_path)) == rows
  assert tldr.load_rows("validation", str(tmp_path)) == rows[::-1]
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "train.jsonl").write_text(json.dumps({"query": "q", "summary": "s"}))
  with pytest.raises(ValueError, match=r"row 0 lacks the text field\(s\) \['reference_response'\]"):
    tldr.load_rows("train", str(tmp_path / "bad"))
  with pytest.raises(DataError, match="no validation.jsonl or validation.parquet"):
    tldr.load_rows("validation", str(tmp_path / "bad"))
  with pytest.raises(DataError, match="is not a directory"):
    tldr.load_rows("train", str(tmp_path / "missing"))


def test_rows_from_the_hub_are_its_split_parquet_shards_in_order(tmp_path, monkeypatch):
  import huggingface_hub
  import pyarrow
  import pyarrow.parquet
  (tmp_path / "data").mkdir()
  for i in range(2):
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist([_row(f"post {i}")]),
                                str(tmp_path / "data" / f"train-0000{i}-of-00002.parquet"))
  calls = []

  def download(repo_id, repo_type, allow_patterns):
    calls.append((repo_id, repo_type, allow_patterns))
    return str(tmp_path)

  monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
  assert [r["query"] for r in tldr.load_rows("train")] == [_query("post 0"), _query("post 1")]
  assert calls == [(tldr.HUB_ID, "dataset", ["*train-*.parquet"])]


def test_queries_longer_than_the_limit_are_dropped_and_ids_stay_row_indices(tok):
  head = len(_query(""))  # one byte, one token
  rows = [_row("a" * (512 - head)), _row("b" * (513 - head)), _row("c")]
  problems, dropped = tldr.to_problems(rows, tok, max_prompt_len=512)
  assert dropped == 1 and [p.id for p in problems] == [0, 2]
  assert len(tok.encode(problems[0].fields["query"])) == 512
  assert problems[1] == Problem(2, {"query": rows[2]["query"], "reference": " it<|endoftext|>"})


def test_build_task_reads_the_tiny_data_with_the_filter_and_the_query_as_prompt(tok):
  from configs import tldr as tldr_config
  c = tldr_config.get_config("tiny")
  task = config_builders.build_task(c.task, tok)
  # One long post dropped (256 tokens), one of the other 11 held out as the validation split.
  assert (len(task.train), len(task.validation), len(task.test)) == (10, 1, 4)
  assert 11 not in [p.id for p in task.train + task.validation]
  assert not {p.id for p in task.train} & {p.id for p in task.validation}
  p = task.test[0]
  assert task.prompt(p) == p.fields["query"] and p.fields["query"].endswith("\n\nTL;DR:")
  assert isinstance(task.reward, tldr.Reward) and task.reward.no_eos_reward == -1.0
  ids = config_builders.encode_prompts(task.test, task, tok, c.task.max_prompt_len)[p.id]
  assert ids == tok.encode(p.fields["query"])  # no special tokens added


def test_pythia_special_ids_are_picked_up_and_a_tokenizer_without_pad_is_refused(tmp_path, tok):
  import transformers
  tok.hf.save_pretrained(str(tmp_path / "sft"))  # <|endoftext|> 0, <|padding|> 1 as pad
  loaded = tokenizer_lib.load(str(tmp_path / "sft"))
  assert loaded.eos_ids == (EOS,) and loaded.pad_id == PAD
  tldr.check_tokenizer(loaded, "sft")
  # The base Pythia tokenizer: <|padding|> in the vocabulary but no pad token set.
  base = transformers.PreTrainedTokenizerFast(tokenizer_object=tok.hf.backend_tokenizer,
                                              eos_token="<|endoftext|>")
  base.save_pretrained(str(tmp_path / "base"))
  no_pad = tokenizer_lib.load(str(tmp_path / "base"))
  assert no_pad.pad_id == EOS  # the generic fallback, which TL;DR refuses
  with pytest.raises(ValueError, match=r"needs the SFT tokenizer's special tokens.*pad None"):
    tldr.check_tokenizer(no_pad, "base")


# ---------------------------------------------------------------------------
# Models: tiny transformers GPT-NeoX checkpoints over pythia_bytes' 258 ids.
# ---------------------------------------------------------------------------
def _neox(tmp_path, name: str, head: str, seed: int):
  from hf_models import make_model
  m = make_model("gpt_neox", head=head, num_labels=1, seed=seed, vocab_size=258, bos_token_id=0,
                 eos_token_id=0, pad_token_id=PAD)
  m.save_pretrained(str(tmp_path / name))
  return m, str(tmp_path / name)


def _mesh():
  return sharding.make_mesh("searcher", jax.local_devices()[:1])


def test_reward_is_the_score_at_the_eos_token_and_minus_one_without_eos(tmp_path, tok):
  from hf_models import hf_scores
  rm, path = _neox(tmp_path, "rm", "classifier", seed=3)
  task = tldr.make_task([], [], tok, reward_model=path, gold_reward_model="random")
  score = task.reward.build(_mesh())
  prompts = [tok.encode(_query(p)) for p in ("first post", "second", "third one")]
  completions = [np.array(tok.encode(" short") + [EOS]), np.array(tok.encode(" cut off here")),
                 np.array(tok.encode(" x") + [EOS])]
  ended = np.array([True, False, True])
  got = score(RewardBatch(problems=[Problem(i, {"query": ""}) for i in range(3)],
                                  prompts=prompts, completions=completions, ended_with_eos=ended,
                                  texts=["", "", ""]))
  for r in (0, 2):  # TRL's get_reward: the score at the EOS token, prompt + completion attended
    seq = np.array([prompts[r] + completions[r].tolist()])
    at_eos = hf_scores(rm, seq, np.ones_like(seq))[0, 0]
    before_eos = hf_scores(rm, seq[:, :-1], np.ones_like(seq[:, :-1]))[0, 0]
    np.testing.assert_allclose(got[r], at_eos, atol=1e-4)
    assert abs(at_eos - before_eos) > 1e-3  # the read position matters
  assert got[1] == -1.0


@pytest.mark.slow  # ~14 s on 2 cores (2026-12-04): out of the default suite
def test_an_eos_sampled_as_the_last_allowed_token_ends_the_summary_with_no_penalty():
  """EOS in the 12th and last column (masked before it) is an ended completion of 12
  tokens, scored by the reward model; only a summary cut off without EOS gets -1. The tiny
  recipe's searchers, policy and reward model (random)."""
  from conftest import eos_searcher
  from configs import tldr as tldr_config
  from tba_jax.replay_buffer import ReplayBuffer
  c = tldr_config.get_config("tiny,sampler.min_new_tokens=11")  # max_new_tokens 12
  pool, params, tok = eos_searcher(c)
  assert tok.eos_ids[0] == EOS
  seen = {True: [], False: []}
  for version, policy in enumerate((None, params, params)):
    if policy is not None:
      pool.publish(version, policy)  # the random policy: mostly cut off at 12 tokens
    pool.search_round(2)
    buffer = ReplayBuffer(dedup=False)
    pool.merge(buffer)
    for e in buffer.entries():
      assert e.length == 12 and e.ended_with_eos == (e.completion[-1] == EOS)
      seen[e.ended_with_eos].append(e.reward)
  assert len(seen[True]) >= 8 and len(seen[False]) >= 8
  assert all(r != -1.0 for r in seen[True])  # ended: the reward model's score
  assert all(r == -1.0 for r in seen[False])  # cut off: the penalty


# ---------------------------------------------------------------------------
# Evaluation against the authors' formulas (eval_tldr, src/perplexity.py, src/kl.py).
# ---------------------------------------------------------------------------
def _authors_ppl_and_kl(policy, reference, ids, marker):
  """Per text (unpadded): Table 1's perplexity, the clean per-token one, kl_mean."""
  import torch
  x = torch.tensor([ids])
  labels = x.clone()
  starts = [i for i in range(len(ids) - len(marker) + 1) if ids[i:i + len(marker)] == marker]
  labels[0, :starts[-1] + len(marker)] = -100  # through the last marker
  mask = torch.ones_like(x)
  with torch.no_grad():
    ref_logits, pi_logits = reference(x).logits, policy(x).logits
  ce = torch.nn.CrossEntropyLoss(reduction="none")(ref_logits[:, :-1].transpose(1, 2),
                                                   labels[:, 1:])
  nll_sum = (ce * mask[:, 1:]).sum(1)
  ppl = torch.exp(nll_sum / mask[:, 1:].sum(1))
  per_token = torch.exp(nll_sum / (labels[:, 1:] != -100).sum(1))
  kl = torch.nn.KLDivLoss(reduction="none", log_target=True)(
      torch.log_softmax(pi_logits, -1), torch.log_softmax(ref_logits, -1)).sum(-1)
  counted = labels != -100
  kl_mean = (kl * counted).sum(-1) / counted.sum(-1)
  return ppl.item(), per_token.item(), kl_mean.item()


def test_evaluation_matches_the_authors_win_rate_perplexity_and_kl(tmp_path, tok):
  import torch
  policy_hf, policy_path = _neox(tmp_path, "policy", "lm", seed=1)
  reference_hf, reference_path = _neox(tmp_path, "sft", "lm", seed=2)
  gold_hf, gold_path = _neox(tmp_path, "gold", "classifier", seed=4)
  mesh = _mesh()
  cfg, params = hf_checkpoints.load(policy_path, mesh=mesh, role="searcher")
  _, reference = hf_checkpoints.load(reference_path, mesh=mesh, role="searcher")
  posts = ["my cat hates the vet", "rent went up again", "TL;DR: in the post too", "short"]
  summaries = [" vet trip bad", " rent up", " a TL;DR: again", " x"]
  completions_text = [" cat vs vet<|endoftext|>", " cut off, no end",
                      " also TL;DR: twice<|endoftext|>", "<|endoftext|>"]
  problems = [Problem(i, {"query": _query(p), "reference": f"{s}<|endoftext|>"})
              for i, (p, s) in enumerate(zip(posts, summaries))]
  completions = [np.array(tok.encode(t)) for t in completions_text]
  batch = RewardBatch(
      problems=problems, prompts=[tok.encode(p.fields["query"]) for p in problems],
      completions=completions, ended_with_eos=np.array([c[-1] == EOS for c in completions]),
      texts=[""] * 4)
  metrics = tldr.Evaluation(gold_path, tok).build(mesh)
  got = metrics(batch, Policy(cfg, params, reference))

  marker = tok.encode("TL;DR:")
  gold_hf.config.pad_token_id = EOS  # the pipeline pads with EOS and reads before the first 0
  gold = lambda text: gold_hf(torch.tensor([tok.encode(text)])).logits[0, 0].item()
  want = {k: [] for k in ("perplexity", "perplexity_per_token", "kl", "win_rate")}
  for p, text in zip(problems, completions_text):
    ppl, per_token, kl = _authors_ppl_and_kl(policy_hf, reference_hf,
                                             tok.encode(p.fields["query"] + text), marker)
    with torch.no_grad():
      generated, ref = gold(p.fields["query"] + text), gold(p.fields["query"].strip() + p.fields["reference"])
    for k, v in zip(want, (ppl, per_token, kl, float(generated > ref))):
      want[k].append(v)
    want.setdefault("gold_reward", []).append(generated)
    want.setdefault("gold_reward_reference", []).append(ref)
  for k, v in want.items():
    np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=1e-5, err_msg=k)
  assert min(want["kl"]) > 0  # two different models
  assert all(np.array(want["perplexity"]) < np.array(want["perplexity_per_token"]))  # the quirk


def test_a_lora_policy_is_evaluated_against_its_base_with_each_its_own_config():
  """The reference of a LoRA policy is the base (adapters off): its statistics run with
  the base's config, and equal those of the merged policy evaluated as a plain model."""
  from tba_jax import lora, model
  from tba_jax.model import LoRAConfig
  base_cfg = tldr.RANDOM_CLASSIFIER.replace(num_labels=0, vocab_size=258)
  cfg = base_cfg.replace(lora=LoRAConfig(4, 8.0, base_cfg.projections))
  base = model.init_params(base_cfg, 0)
  adapters = jax.tree.map(lambda x: x + 0.05, lora.init_adapters(cfg, 1))  # B != 0: moved
  policy = lora.combine(base, adapters)
  rows = [([3, 4, 5], [6, 7]), ([9], [10, 11, 12])]
  got = tldr.suffix_stats(cfg, policy, base_cfg, base, rows, _mesh(), PAD)
  want = tldr.suffix_stats(base_cfg, lora.merge(cfg, policy), base_cfg, base, rows, _mesh(), PAD)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
  assert min(got[1]) > 0  # the adapters moved the policy off its reference


def test_marker_and_eos_positions_and_a_text_without_a_marker_counts_nothing():
  assert tldr.last_marker_end([5, 6, 7, 5, 6], [5, 6]) == 5
  assert tldr.last_marker_end([5, 7], [5, 6]) is None
  assert tldr.before_first([3, 4, EOS, 5, EOS], EOS) == [3, 4]
  assert tldr.before_first([3, 4], EOS) == [3, 4]
  cfg = tldr.RANDOM_CLASSIFIER.replace(num_labels=0, vocab_size=258)
  from tba_jax import model
  params = model.init_params(cfg, 0)
  nll, kl = tldr.suffix_stats(cfg, params, cfg, params, [([3, 4, 5], [])], _mesh(), PAD)
  assert nll.tolist() == [0.0] and kl.tolist() == [0.0]
