"""experiments/sft.py: the completion-only loss equals transformers', training lowers it,
and the export loads in transformers."""
import json

import numpy as np
import pytest

from configs import sft as sft_config
from experiments import sft
from hf_models import make_model
from tba_jax import tokenizer as tokenizer_lib

ROWS = [{"prompt": "List:\n1.", "completion": " Say hi"},
        {"prompt": "List:\n1.", "completion": " Go home now"},
        {"prompt": "Q", "completion": " abc"},
        {"prompt": "Longer prompt here:\n1.", "completion": " x"}] * 2


def _hf_completion_nll(hf, rows):
  """transformers' causal-LM loss with the prompt tokens labelled -100 (Lee et al.'s
  SFTDataset), over the whole batch at once."""
  import torch
  tok = tokenizer_lib.byte_tokenizer()
  prompts, completions = sft.encode(rows, tok)
  width = max(len(p) + len(c) for p, c in zip(prompts, completions))
  ids = np.zeros((len(rows), width), np.int64)
  labels = np.full((len(rows), width), -100, np.int64)
  mask = np.zeros((len(rows), width), np.int64)
  for i, (p, c) in enumerate(zip(prompts, completions)):
    ids[i, :len(p) + len(c)] = p + c
    labels[i, len(p):len(p) + len(c)] = c
    mask[i, :len(p) + len(c)] = 1
  with torch.no_grad():
    return hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
              labels=torch.tensor(labels)).loss.item()


def test_sft_loss_is_transformers_and_training_lowers_it(tmp_path):
  import transformers
  hf = make_model("gpt2", vocab_size=261)
  path = str(tmp_path / "gpt2")
  hf.save_pretrained(path)
  tokenizer_lib.byte_tokenizer().hf.save_pretrained(path)
  data = tmp_path / "sft.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
  out = str(tmp_path / "out")
  # One batch of all 8 rows: the first step's loss is the untrained model's. (With
  # micro-batches the loss is the mean of their token means, as Lee et al. accumulate.)
  c = sft_config.get_config(
      f"tiny,model.path={path},model.tokenizer=,num_train_steps=25,optim.num_microbatches=1,"
      "log.every=25")
  losses = sft.train(c, sft.read_rows(str(data)), out=out)
  assert losses[0] == pytest.approx(_hf_completion_nll(hf, ROWS), rel=1e-4)
  assert losses[-1] < 0.5 * losses[0]
  trained = transformers.AutoModelForCausalLM.from_pretrained(out)
  assert _hf_completion_nll(trained, ROWS) < 0.5 * losses[0]


def test_the_tiny_recipe_runs_offline_and_bad_settings_are_named(tmp_path, capsys):
  c = sft_config.get_config("tiny")
  sft.check(c)
  losses = sft.run(c, str(tmp_path / "out"))
  assert len(losses) == 20 and losses[-1] < losses[0]
  assert (tmp_path / "out" / "config.json").is_file()
  with pytest.raises(sft.ConfigError, match=r"batch_size=8: does not split into "
                     r"optim.num_microbatches=3"):
    sft.check(sft_config.get_config("tiny,optim.num_microbatches=3"))
  with pytest.raises(sft.DataError, match="data.path='/nope.jsonl': no such file"):
    sft.read_rows("/nope.jsonl")


def test_bad_data_is_named(tmp_path):
  data = tmp_path / "bad.jsonl"
  data.write_text(json.dumps({"prompt": "a"}) + "\n")
  with pytest.raises(ValueError, match="line 1: expected an object with 'prompt' and 'completion'"):
    sft.read_rows(str(data))
