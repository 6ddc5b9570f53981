"""A correct echo-style adapter: every sampling parameter and every optional feature of the row
protocol followed, checkably, with no model.

Each row "costs" ``ROW_SECONDS`` of engine time, spent concurrently, so the kit can tell rows
served together from rows served in turn. Text answers are the echo backend's
(:func:`relayllm.testing.echo_text.generate`, sampling on: the prompt's words reversed, shuffled
when sampling). A chat's prompt is "rendered" by a template of words (each message as
``<role> ... <end>``, then ``<assistant>``; each chat template kwarg as a word; prefill leaves the
final message open), so ``num_input_tokens`` and ``prompt_logprobs`` count what an engine would
see. Regex and grammar outputs are the shortest text the pattern allows; a named (or required)
tool is called with arguments built from its schema.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import uuid
from typing import Any

from relayllm.plugin.legacy import BatchDeployment
from relayllm.rows import Request, Result, error_result, request_text
from relayllm.testing.echo_text import generate

ROW_SECONDS = 0.2
CONTEXT_WORDS = 50  # a longer prompt is refused by the "engine"
TOP_P = math.log(0.5)  # every token's logprob in this "model"


class Correct(BatchDeployment):
    backend_name = "correct"
    #: Sampling params this adapter drops before its "engine" sees the row (none: correct).
    ignored: tuple[str, ...] = ()

    def __init__(self, options: Any, deployment: dict[str, Any]) -> None:
        super().__init__(options, deployment)
        self.stopped = False

    def kept(self, params: dict[str, Any]) -> dict[str, Any]:
        """What of a row's ``sampling_params`` reaches the "engine" (a broken variant drops
        or rewrites some)."""
        return {k: v for k, v in params.items() if k not in self.ignored}

    async def run_request(self, request: Request) -> Result:
        await asyncio.sleep(ROW_SECONDS)
        return self.answer(request)

    def answer(self, request: Request) -> Result:
        words = request_text(request).split()
        if len(words) > CONTEXT_WORDS:
            return error_result(f"{len(words)} words is over the context of {CONTEXT_WORDS}")
        if request["task"] == "embedding":
            return {"embedding": self.embed(words), "num_input_tokens": len(words)}
        params = self.kept(dict(request["sampling_params"]))
        prompt = render(request, params)
        answer = forced(words, params) or generate(list(reversed(words)), params, sampling=True)
        result: Result = {**answer, "num_input_tokens": len(prompt)}  # type: ignore[typeddict-item]
        if params.get("prompt_logprobs") is not None:
            result["prompt_logprobs"] = prompt_logprobs(prompt, int(params["prompt_logprobs"]))
        return result

    def embed(self, words: list[str]) -> list[float]:
        return ([float(len(w)) for w in words] + [0.0] * 8)[:8]

    async def stop_engine(self) -> None:
        self.stopped = True

    async def engine_health(self) -> None:
        if self.stopped:
            raise RuntimeError("engine stopped")


def render(request: Request, params: dict[str, Any]) -> list[str]:
    """The prompt's tokens, as a chat template renders them."""
    if request["task"] != "chat":
        return request_text(request).split()
    tokens = [f"<{k}={v}>" for k, v in sorted((params.get("chat_template_kwargs") or {}).items())]
    for message in request["messages"]:
        content = message.get("content")
        tokens += [f"<{message['role']}>", *str(content or "").split(), "<end>"]
    if params.get("continue_final_message"):
        tokens.pop()  # the final message stays open: the answer continues it
    else:
        tokens.append("<assistant>")
    return tokens


def prompt_logprobs(prompt: list[str], top: int) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = [{"token": prompt[0], "logprob": None, "top_logprobs": []}]
    for token in prompt[1:]:
        alternatives = [{"token": token, "logprob": TOP_P}]
        alternatives += [{"token": f"<alt{j}>", "logprob": TOP_P - j} for j in range(1, top)]
        entries.append({"token": token, "logprob": TOP_P, "top_logprobs": alternatives[:top]})
    return entries


def forced(words: list[str], params: dict[str, Any]) -> Result | None:
    """The answer when a regex, a grammar or a tool choice forces its form, else None."""
    structured = params.get("structured_outputs") or {}
    if structured.get("regex"):
        return _text(shortest_match(structured["regex"]))
    if structured.get("grammar"):
        return _text(grammar_sentence(structured["grammar"]))
    tools = [t for t in params.get("tools") or [] if isinstance(t, dict)]
    choice = params.get("tool_choice") or "auto"
    if not tools or choice in ("auto", "none"):
        return None  # "auto": this engine has no tool parser, it answers in text
    if choice == "required":
        tool, finish = tools[0], "tool_calls"
    else:
        name = choice["function"]["name"]
        tool, finish = next(t for t in tools if t["function"]["name"] == name), "stop"
    function = tool["function"]
    schema = function.get("parameters") or {"type": "object"}
    arguments = generate(words, {"structured_outputs": {"json": schema}})["generated_text"]
    call = {
        "id": f"call-{uuid.uuid4().hex}",
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }
    return {
        "generated_text": None,
        "finish_reason": finish,
        "num_generated_tokens": len(str(arguments).split()),
        "tool_calls": [call],
    }


def _text(text: str) -> Result:
    return {"generated_text": text, "finish_reason": "stop", "num_generated_tokens": 1}


def shortest_match(pattern: str) -> str:
    """The shortest text ``pattern`` matches (literals, classes, repeats, groups, branches)."""
    import re._parser as parser  # type: ignore[import-not-found]

    return "".join(_emit(parser.parse(pattern)))


def _emit(items: Any) -> list[str]:
    out: list[str] = []
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name == "IN":
            out.append(_first_in(arg))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, _, sub = arg
            out += _emit(sub) * low
        elif name == "SUBPATTERN":
            out += _emit(arg[-1])
        elif name == "BRANCH":
            out += _emit(arg[1][0])
        elif name == "ANY":
            out.append("x")
        elif name not in ("AT",):
            raise ValueError(f"this test engine cannot follow regex {name}")
    return out


def _first_in(items: Any) -> str:
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            return chr(arg)
        if name == "RANGE":
            return chr(arg[0])
        if name == "CATEGORY":
            return {"CATEGORY_DIGIT": "0", "CATEGORY_SPACE": " "}.get(str(arg), "a")
    raise ValueError(f"this test engine cannot follow the class {items}")


def grammar_sentence(grammar: str) -> str:
    """A sentence of an EBNF grammar (rules ``name ::= ...`` of quoted literals, rule names,
    groups and ``|``): the first alternative everywhere."""
    rules = dict(
        (name.strip(), body.strip())
        for name, body in (line.split("::=", 1) for line in grammar.splitlines() if "::=" in line)
    )
    return _expand(rules["root"], rules)


def _expand(body: str, rules: dict[str, str]) -> str:
    tokens = re.findall(r'"(?:\\.|[^"\\])*"|[()|]|[A-Za-z_][\w-]*', body)
    text, _ = _alternatives(tokens, 0, rules)
    return text


def _alternatives(tokens: list[str], at: int, rules: dict[str, str]) -> tuple[str, int]:
    first: str | None = None
    while True:
        text, at = _sequence(tokens, at, rules)
        first = text if first is None else first
        if at < len(tokens) and tokens[at] == "|":
            at += 1
            continue
        return first, at


def _sequence(tokens: list[str], at: int, rules: dict[str, str]) -> tuple[str, int]:
    out = ""
    while at < len(tokens) and tokens[at] not in ("|", ")"):
        token = tokens[at]
        if token == "(":
            text, at = _alternatives(tokens, at + 1, rules)
            out, at = out + text, at + 1  # past ")"
            continue
        out += json.loads(token) if token.startswith('"') else _expand(rules[token], rules)
        at += 1
    return out, at
