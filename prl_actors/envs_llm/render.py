"""Messages -> token ids, for the shared initial prompt and for each observation.

Two ways, as `task.chat_template` says:
* plain (the built-in model, untemplated checkpoints): the messages' contents concatenated; the
  initial prompt gets the tokenizer's special tokens (e.g. <bos>), observations none. The
  environment writes exactly the text the model should see.
* chat template: the initial prompt is `apply_chat_template(messages, tools=..., add_generation_prompt=True)`;
  an observation is the text the template adds after a finished assistant turn, up to and including
  the next assistant header: the difference between rendering [user, assistant] and
  [user, assistant, *observation] + generation prompt (the way verl and TRL render tool turns). The
  model's own turn ends with its eos (e.g. <|im_end|>), which stays in the context. A template
  that ignores `tools` gets the tools' schemas in a system message instead (TOOLS_NOTE).
"""

from __future__ import annotations

import json
from typing import Any

from transformers import PreTrainedTokenizerBase

from prl_actors.envs_llm.base import EnvError, Message

TOOLS_NOTE = (
    "You may call these tools, one call per <tool_call></tool_call> block, as "
    '<tool_call>{"name": ..., "arguments": {...}}</tool_call>:'
)
_PROBE: list[Message] = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


class Renderer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, templated: bool, tools: list[dict[str, Any]] | None = None):
        self.tok, self.templated, self.tools = tokenizer, templated, tools or None

    def initial(self, messages: list[Message]) -> list[int]:
        """Token ids of the conversation before the model's first turn."""
        if not self.templated:
            return list(self.tok("".join(m["content"] for m in messages)).input_ids)
        text = self._template(self._with_tools(messages), generation=True)
        return list(self.tok(text, add_special_tokens=False).input_ids)

    def _with_tools(self, messages: list[Message]) -> list[Message]:
        """`messages`, plus a system message describing the tools when the chat template ignores its
        `tools` argument (some templates have no tool section): the model must see the schemas."""
        if not self.tools or self._template(messages, True) != self._template(messages, True, tools=False):
            return messages
        listing = "\n".join(json.dumps(t, sort_keys=True) for t in self.tools)
        note = f"{TOOLS_NOTE}\n{listing}"
        if messages and messages[0].get("role") == "system":
            return [{**messages[0], "content": f"{messages[0]['content']}\n\n{note}"}, *messages[1:]]
        return [{"role": "system", "content": note}, *messages]

    def observation(self, messages: list[Message]) -> list[int]:
        """Token ids the environment's messages add after a model turn (ending where the model goes on)."""
        if not self.templated:
            return list(self.tok("".join(m["content"] for m in messages), add_special_tokens=False).input_ids)
        before = self._template(_PROBE, generation=False)
        after = self._template([*_PROBE, *messages], generation=True)
        if not after.startswith(before):
            raise EnvError("the chat template does not render observations as an extension of the conversation")
        return list(self.tok(after[len(before) :], add_special_tokens=False).input_ids)

    def _template(self, messages: list[Message], generation: bool, tools: bool = True) -> str:
        text = self.tok.apply_chat_template(
            messages,
            tools=self.tools if tools else None,  # type: ignore[arg-type]
            add_generation_prompt=generation,
            tokenize=False,
        )
        return str(text)
