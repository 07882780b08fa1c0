"""Model-native tool calls: the format a model's chat template declares, and its tool turn.

  tools = [Tool("calculator", "Evaluates arithmetic.", {"expression": "12 * 34"}, calculator)]
  fmt = call_format("auto", tokenizer)             # "hermes" when the template writes <tool_call>
  prompt = tokenizer.chat_prompt(question, tools=[t.schema for t in tools])
  reply = hermes_reply(tools, tool_turn(tokenizer), tokenizer.encode_text, max_reply_tokens=64)
  Environment(reply=reply, stop=HERMES_STOP, ...)   # tasks/environment.py

Two call formats (CALL_FORMATS):
  tag     `<tool>NAME: ARGUMENT</tool>` answered `<result>OUTPUT</result>` as plain text
          (environment.tool_reply): ours, for models whose template declares no tools.
  hermes  Hermes / Qwen JSON, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the
          tools declared to the template as JSON schemas (`apply_chat_template(tools=)`), and
          the result returned as the template's own tool turn (a "tool" message).
  auto    hermes where the tokenizer's chat template writes `<tool_call>`, else tag.

The tool turn is what the template renders, not a copy of one model's: `tool_turn` renders a
conversation of a user turn, an assistant turn with a marker as its text and a tool message
with another marker, and keeps what lies between the markers' ends (Qwen2.5:
"<|im_end|>\n<|im_start|>user\n<tool_response>\n" before the output,
"\n</tool_response><|im_end|>\n<|im_start|>assistant\n" after). The model's turn stops at
"</tool_call>", so that text continues it as the template would. Its special tokens are the
template's and are tokenized as such; the tool's output is plain text (a printed
"<|im_end|>" stays characters), cut so that the whole reply fits max_reply_tokens.

A call that cannot run (no JSON, an unknown tool, missing or unexpected arguments) is
answered by an error tool turn ("error: ..."), counted as a tool error, as the tag format's
unknown tool is.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Callable, Mapping, Sequence

from tba_jax.choices import TOOL_CALL_FORMATS as CALL_FORMATS
from tba_jax.tasks.environment import Reply, ReplyFn

HERMES_STOP = ("</tool_call>",)  # a hermes model turn ends at its call's closing tag
_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>\s*$", re.S)
# Markers rendered through the template in place of the model's text and a tool's output.
_TURN_MARK, _OUTPUT_MARK = "@@tba-model-turn@@", "@@tba-tool-output@@"
_JSON_TYPES = {"string": str, "number": (int, float), "integer": int, "boolean": bool,
               "object": dict, "array": list}


@dataclasses.dataclass(frozen=True)
class Tool:
  """A tool the model may call: its name, what it does, its string parameters (name ->
  description) and fn(**arguments) -> output text ("error: ..." counts as a tool error)."""
  name: str
  description: str
  parameters: Mapping[str, str]
  fn: Callable[..., str]

  @property
  def schema(self) -> dict:
    """The JSON schema a chat template's `tools=` takes (OpenAI's function form)."""
    properties = {k: {"type": "string", "description": d} for k, d in self.parameters.items()}
    return {"type": "function", "function": {
        "name": self.name, "description": self.description,
        "parameters": {"type": "object", "properties": properties,
                       "required": list(self.parameters)}}}


def _template(tokenizer) -> str:
  template = getattr(tokenizer.hf, "chat_template", None)
  return template if isinstance(template, str) else ""


def call_format(requested: str, tokenizer=None) -> str:
  """"tag" or "hermes" for config task.tools.call_format `requested` (module doc); "auto"
  reads the tokenizer's chat template (None: no template, the tag format)."""
  if requested not in CALL_FORMATS:
    raise ValueError(f"call_format={requested!r}: choose from {CALL_FORMATS}")
  if requested != "auto":
    return requested
  return "hermes" if tokenizer is not None and "<tool_call>" in _template(tokenizer) else "tag"


@dataclasses.dataclass(frozen=True)
class ToolTurn:
  """The chat template's tool turn around one tool output (module doc), as text and ids."""
  before: str
  after: str
  before_ids: tuple[int, ...]
  after_ids: tuple[int, ...]

  @property
  def num_markup_tokens(self) -> int:
    return len(self.before_ids) + len(self.after_ids)


def tool_turn(tokenizer, tool_name: str = "tool") -> ToolTurn:
  """The tool turn `tokenizer`'s chat template renders after a model turn (module doc)."""
  if not _template(tokenizer):
    raise ValueError("the tokenizer has no chat template: it declares no tool turn (use "
                     "call_format='tag')")
  messages = [{"role": "user", "content": "Q"},
              {"role": "assistant", "content": _TURN_MARK},
              {"role": "tool", "name": tool_name, "content": _OUTPUT_MARK}]
  try:
    text = tokenizer.hf.apply_chat_template(messages, tokenize=False,
                                            add_generation_prompt=True)
  except Exception as e:  # a template that refuses tool messages (jinja's own error)
    raise ValueError(f"the chat template cannot render a tool message: {e}") from None
  head, sep, rest = text.partition(_TURN_MARK)
  before, sep2, after = rest.partition(_OUTPUT_MARK)
  if not (sep and sep2):
    raise ValueError("the chat template does not render an assistant turn's text and a tool "
                     "message's content verbatim: its tool turn cannot be derived")
  # The template's own text: its special tokens parsed (Tokenizer.encode).
  return ToolTurn(before, after, tuple(tokenizer.encode(before)), tuple(tokenizer.encode(after)))


def _argument_problem(tool: Tool, arguments: Any) -> str | None:
  """What is wrong with a call's arguments, against the tool's schema; None when nothing."""
  params = tool.schema["function"]["parameters"]
  if not isinstance(arguments, dict):
    return f"arguments must be a JSON object, got {type(arguments).__name__}"
  missing = [k for k in params["required"] if k not in arguments]
  unknown = [k for k in arguments if k not in params["properties"]]
  wrong = [k for k, v in arguments.items() if k in params["properties"] and
           not isinstance(v, _JSON_TYPES[params["properties"][k]["type"]])]
  if not (missing or unknown or wrong):
    return None
  said = [f"missing {missing}" if missing else "", f"unexpected {unknown}" if unknown else "",
          f"not strings: {wrong}" if wrong else ""]
  return (f"{tool.name} takes {{{', '.join(f'{k}: string' for k in params['properties'])}}}; "
          + ", ".join(s for s in said if s))


def parse_call(text: str, tools: Mapping[str, Tool]) -> tuple[Tool, dict] | str:
  """(tool, arguments) of the hermes call that ends `text`, or the error the model reads."""
  match = _HERMES_CALL.search(text)
  if match is None:
    return "error: no <tool_call>...</tool_call> to run"
  body = match.group(1).strip()
  try:
    call = json.loads(body)
  except json.JSONDecodeError as e:
    return f"error: the tool call is not JSON ({e.msg} at character {e.pos})"
  if not isinstance(call, dict) or not isinstance(call.get("name"), str):
    return 'error: a tool call is {"name": TOOL, "arguments": {...}}'
  if call["name"] not in tools:
    return f"error: unknown tool {call['name']!r}; the tools are {sorted(tools)}"
  tool, arguments = tools[call["name"]], call.get("arguments", {})
  if isinstance(arguments, str):  # some models write the arguments as a JSON string
    try:
      arguments = json.loads(arguments)
    except json.JSONDecodeError:
      pass  # refused below as not an object
  problem = _argument_problem(tool, arguments)
  return f"error: {problem}" if problem else (tool, arguments)


def hermes_reply(tools: Sequence[Tool], turn: ToolTurn, encode_text: Callable[[str], list[int]],
                 max_reply_tokens: int) -> ReplyFn:
  """A ReplyFn for turns that end in a hermes call (module doc): runs the tool and answers
  with the template's tool turn, as ids (Reply.ids), the output cut to what fits
  `max_reply_tokens` with the turn's markup."""
  by_name = {t.name: t for t in tools}
  room = max_reply_tokens - turn.num_markup_tokens
  if room < 1:
    raise ValueError(f"max_reply_tokens={max_reply_tokens} leaves no room for a tool's output: "
                     f"the chat template's tool turn alone is {turn.num_markup_tokens} tokens")

  def reply(problem: Any, text: str) -> Reply:
    del problem  # tools answer the call alone
    call = parse_call(text, by_name)
    output = call if isinstance(call, str) else call[0].fn(**call[1])
    ids = turn.before_ids + tuple(encode_text(output)[:room]) + turn.after_ids
    return Reply(turn.before + output + turn.after, error=output.startswith("error"), ids=ids)

  return reply
