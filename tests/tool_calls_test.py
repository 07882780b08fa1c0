"""Model-native tool calls (tasks/tool_calls.py): a Qwen-style chat template's `<tool_call>`
JSON parsed, answered with the tool turn the template renders, the tools' schemas in the
prompt; through the turn sampler and the tools experiment's builders."""
import json

import numpy as np
import pytest

from tba_jax import tokenizer as tokenizer_lib
from tba_jax.tasks import tool_calls, tool_use
from tba_jax.tasks.tool_calls import Tool

# A chat template in Qwen2.5's shape (written for this test): tools as JSON schemas in the
# system turn, assistant calls as <tool_call> JSON, tool results as <tool_response> blocks
# inside a user turn.
QWEN_STYLE_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}"
    "{%- else %}{{- 'You are a tiny test model.' }}{%- endif %}"
    "{{- '\\n\\nTools (JSON schemas):\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\nCall one as <tool_call>{\"name\": ..., \"arguments\": {...}}"
    "</tool_call>.<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif m.role == 'assistant' and m.tool_calls %}"
    "{{- '<|im_start|>assistant' }}{%- if m.content %}{{- '\\n' + m.content }}{%- endif %}"
    "{%- for call in m.tool_calls %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' +"
    " (call.function.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif m.role != 'system' or not loop.first %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

CALC = tool_use.tools(timeout_s=1.0)["calculator"]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>'


@pytest.fixture(scope="module")
def qwen_style(tmp_path_factory):
  """The byte tokenizer with the template above and <tool_call> / </tool_call> as added
  (not special) tokens, as Qwen2.5's are, saved as a HF directory and loaded back."""
  tok = tokenizer_lib.byte_tokenizer()
  tok.hf.add_tokens(["<tool_call>", "</tool_call>"])
  tok.hf.chat_template = QWEN_STYLE_TEMPLATE
  path = str(tmp_path_factory.mktemp("qwen_style_tokenizer"))
  tok.hf.save_pretrained(path)
  return tokenizer_lib.load(path)


def _environment(tok, max_reply_tokens=128, **kw):
  return tool_use.environment(CALC, max_turns=2, max_turn_tokens=48,
                              max_reply_tokens=max_reply_tokens, num_workers=2,
                              score="last_turn", call_format="hermes", tokenizer=tok, **kw)


def _rendered(tok, output: str) -> str:
  """What the template itself renders after the model's call: the conversation with the
  call as the assistant's tool_calls and `output` as the tool message."""
  messages = [{"role": "user", "content": "What is 12 * 34?"},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"type": "function", "function": {"name": "calculator",
                                                    "arguments": {"expression": "12 * 34"}}}]},
              {"role": "tool", "name": "calculator", "content": output}]
  text = tok.hf.apply_chat_template(messages, tools=[CALC.schema], tokenize=False,
                                    add_generation_prompt=True)
  assert CALL in text  # the template writes the call as the model does
  return text[text.rindex("</tool_call>") + len("</tool_call>"):]


def test_auto_reads_the_call_format_from_the_template(qwen_style):
  assert tool_calls.call_format("auto", qwen_style) == "hermes"
  assert tool_calls.call_format("auto", tokenizer_lib.byte_tokenizer()) == "tag"  # plain ChatML
  assert tool_calls.call_format("auto", None) == "tag"
  assert tool_calls.call_format("tag", qwen_style) == "tag"
  with pytest.raises(ValueError, match="call_format='json'"):
    tool_calls.call_format("json", qwen_style)


def test_the_tools_schema_reaches_the_templates_tools(qwen_style):
  prompt = qwen_style.chat_prompt("What is 12 * 34?", tools=[CALC.schema])
  assert json.dumps(CALC.schema) in prompt  # the template's tojson of the schema
  assert CALC.schema["function"]["parameters"]["required"] == ["expression"]
  assert prompt.endswith("<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n<|im_start|>assistant\n")
  with pytest.raises(ValueError, match="declares none"):
    tokenizer_lib.byte_tokenizer().chat_prompt("What is 12 * 34?", tools=[CALC.schema])


def test_a_tool_call_is_answered_with_the_templates_tool_turn(qwen_style):
  tok = qwen_style
  env = _environment(tok)
  assert env.stop == ("</tool_call>",)
  reply = env.reply(None, "Let me compute. " + CALL)
  assert not reply.error and reply.tool_calls == 1
  expected = _rendered(tok, "408")
  assert expected.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n408\n")
  assert tok.decode(reply.ids, skip_special_tokens=False) == expected == reply.text
  # The template's markup holds its special tokens as their ids, as it tokenizes itself.
  assert list(reply.ids) == tok.encode(expected)
  vocab = tok.hf.get_vocab()
  assert {vocab["<|im_end|>"], vocab["<|im_start|>"]} <= set(reply.ids)


def test_a_tools_printed_special_token_stays_text(qwen_style):
  tok = qwen_style
  echo = Tool("echo", "Returns its text.", {"text": "any text"}, lambda text: text)
  turn = tool_calls.tool_turn(tok, "echo")
  reply = tool_calls.hermes_reply([echo], turn, tok.encode_text, 128)(
      None, '<tool_call>{"name": "echo", "arguments": {"text": "<|im_end|>"}}</tool_call>')
  output = reply.ids[len(turn.before_ids):len(reply.ids) - len(turn.after_ids)]
  assert tok.hf.get_vocab()["<|im_end|>"] not in output
  assert tok.decode(output, skip_special_tokens=False) == "<|im_end|>"


@pytest.mark.parametrize("call, error", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>', "not JSON"),
    ('<tool_call>{"name": "abacus", "arguments": {}}</tool_call>', "unknown tool 'abacus'"),
    ('<tool_call>{"name": "calculator", "arguments": {}}</tool_call>', "missing ['expression']"),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "1", "base": "2"}}'
     '</tool_call>', "unexpected ['base']"),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": 7}}</tool_call>',
     "not strings: ['expression']"),
    ('<tool_call>["calculator"]</tool_call>', '"name": TOOL'),
    ("</tool_call>", "no <tool_call>")])
def test_a_call_that_cannot_run_gets_an_error_tool_turn(qwen_style, call, error):
  env = _environment(qwen_style)
  reply = env.reply(None, call)
  assert reply.error and error in reply.text
  assert reply.text.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\nerror: ")
  assert qwen_style.decode(reply.ids, skip_special_tokens=False) == reply.text


def test_arguments_as_a_json_string_are_accepted(qwen_style):
  reply = _environment(qwen_style).reply(
      None, '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"2 ** 10\\"}"}'
            '</tool_call>')
  assert not reply.error and "\n1024\n" in reply.text


def test_a_long_output_is_cut_inside_the_tool_turn(qwen_style):
  tok = qwen_style
  turn = tool_calls.tool_turn(tok, "calculator")
  budget = turn.num_markup_tokens + 3
  reply = _environment(tok, max_reply_tokens=budget).reply(None, CALL.replace("12 * 34",
                                                                              "123456 * 1000"))
  assert len(reply.ids) == budget  # 3 of the output's 9 tokens, the markup whole
  assert reply.ids[-len(turn.after_ids):] == turn.after_ids
  with pytest.raises(ValueError, match="no room for a tool's output"):
    _environment(tok, max_reply_tokens=turn.num_markup_tokens)


def test_bare_calls_and_a_missing_template_are_refused(qwen_style):
  with pytest.raises(ValueError, match="bare_calls"):
    _environment(qwen_style, bare_calls=True)
  plain = tokenizer_lib.byte_tokenizer(pythia=True)  # no chat template at all
  with pytest.raises(ValueError, match="no chat template"):
    tool_calls.tool_turn(plain)


def test_the_tools_experiment_builds_the_hermes_task_from_the_template(qwen_style):
  from configs import tools as tools_config
  from experiments import tools as tools_experiment
  from tba_jax.errors import ConfigError
  # The template's tool turn is ~50 byte tokens: the tiny recipe's 8 would refuse it.
  c = tools_config.get_config("tiny,task.prompt_style=chat,task.tools.bare_calls=false,"
                              "task.tools.max_reply_tokens=128")
  task = tools_experiment.TASKS[c.task.name](c.task, qwen_style)
  prompt = task.prompt(task.train[0])
  assert task.templated_prompts and json.dumps(CALC.schema) in prompt
  assert tool_use.HERMES_INSTRUCTIONS["calculator"] in prompt and "<tool>" not in prompt
  assert task.environment.stop == ("</tool_call>",)
  assert not task.environment.reply(None, CALL).error
  # The byte tokenizer's plain ChatML template declares no tools: auto is the tag format.
  tag = tools_experiment.TASKS[c.task.name](c.task, tokenizer_lib.byte_tokenizer())
  assert "<tool>" in tag.prompt(tag.train[0])
  assert tag.environment.stop == tuple(c.task.tools.stop.split(","))  # the tiny recipe's letters
  # hermes asked of a prompt that is not the template's: refused, naming the key.
  c = tools_config.get_config("tiny,task.tools.call_format=hermes,task.tools.bare_calls=false")
  with pytest.raises(ConfigError, match="prompt_style='chat'"):
    tools_experiment.TASKS[c.task.name](c.task, qwen_style)


# 6.7 s with an empty XLA cache on 2 quiet cores (27 s under load 5), 2026-12-06.
def test_turns_append_the_tool_turn_ids_the_model_then_reads(qwen_style, tiny_cfg):
  """A model that always writes </tool_call> (one added token): each turn is answered with
  the error tool turn, and the trajectory holds exactly the reply's ids, masked out."""
  import dataclasses

  import jax

  from conftest import favouring
  from tba_jax import sharding
  from tba_jax.model import init_params
  from tba_jax.sampler import Sampler, SamplingOptions
  from tba_jax.turns import TurnSampler
  tok = qwen_style
  close = tok.hf.get_vocab()["</tool_call>"]
  cfg = dataclasses.replace(tiny_cfg, vocab_size=tok.vocab_size, norm="layer")  # a norm bias
  params = favouring(cfg, init_params(cfg, 0), close)
  mesh = sharding.make_mesh("searcher", jax.local_devices()[:1])
  options = SamplingOptions(max_new_tokens=160, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
  sampler = Sampler(cfg, options, mesh=mesh)
  env = _environment(tok)
  turns = TurnSampler(sampler, env, tok.encode_text, tok.decode)
  prompt = tok.encode_prompt(tok.chat_prompt("What is 12 * 34?"), templated=True)
  out = turns(params, [prompt], jax.random.key(0))
  reply = env.reply(None, "</tool_call>")
  assert reply.error  # no call inside: the error tool turn
  n, k = int(out.lengths[0]), len(reply.ids)
  # The first turn is cut at its stop; the second (the last: max_turns=2) is the model's.
  np.testing.assert_array_equal(out.tokens[0, :k + 1], [close, *reply.ids])
  assert n > k + 1 and (out.tokens[0, k + 1:n] == close).all()
  np.testing.assert_array_equal(out.model_mask[0, :n], [1] + [0] * k + [1] * (n - k - 1))
  assert out.turns[0] == 2 and out.tool_calls[0] == 1 and out.tool_errors[0] == 1


def test_the_configs_choices_are_the_call_formats():
  from configs import tools as tools_config
  from tba_jax import config_checks
  assert tools_config.get_config("tiny").task.tools.call_format == "auto"
  assert tuple(config_checks.CHECKS["task.tools.call_format"]) == tool_calls.CALL_FORMATS
