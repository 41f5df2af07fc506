"""`POST /v1/completions`: raw, token-level completions on whatever engine is loaded, with no Harmony parsing.

For benchmark clients (benchmark_serving, aiperf's completions endpoint), and so one harmony-proxy can be the
upstream of another. vLLM's extensions are accepted: `prompt` as token ids, `return_token_ids`,
`return_tokens_as_token_ids` (with `logprobs: 0`, the generated ids as `token_id:N` in `logprobs.tokens`, their
logprobs null: no engine here reports them; how a front harmony-proxy asks for ids), `stop_token_ids`,
`skip_special_tokens`, `include_stop_str_in_output`, `ignore_eos`, `min_tokens`, and
`structured_outputs.json`: a JSON Schema for the final answer, enforced as a `response_format` is (reasoning stays
free), which is what a front harmony-proxy sends its upstream by default (`--upstream-guided-decoding final-json`).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from parsers.detokenize import Detokenizer
from parsers.vocab import Vocab
from proxy.disconnect import close_shielded, unless_disconnected
from proxy.engines.base import EngineError, GenerationRequest, OutputConstraint, SamplingParams, Step
from proxy.errors import from_engine, invalid_request
from proxy.generation import tracked_steps
from proxy.ids import new_id
from proxy.options import response_format
from proxy.outcome import Outcome
from proxy.sse import DONE, EventStream, data_frame
from proxy.state import ServerState
from proxy.stop_strings import StopMatcher
from proxy.validation import check, compile_schema, parse_off_loop, read_json_object, refuse_unsupported

_NULLABLE_BOOL = {"type": ["boolean", "null"]}
COMPLETIONS_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        "model": {"type": "string"},
        "prompt": {  # null: from the start of a new document, as OpenAI (see _prompt_ids)
            "anyOf": [
                {"type": "null"},
                {"type": "string", "minLength": 1},
                {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
            ]
        },
        "max_tokens": {"type": ["integer", "null"], "minimum": 1},
        "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
        "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},  # 0: greedy (_sampling)
        "seed": {"type": ["integer", "null"]},
        "stop": {"anyOf": [{"type": "null"}, {"type": "string", "minLength": 1, "maxLength": 1024},
                           {"type": "array", "maxItems": 16,
                            "items": {"type": "string", "minLength": 1, "maxLength": 1024}}]},
        "stream": _NULLABLE_BOOL,
        "stream_options": {
            "type": ["object", "null"],
            # include_obfuscation: OpenAI pads stream events with random characters unless it is false; none here.
            "properties": {"include_usage": {"type": "boolean"}, "continuous_usage_stats": {"type": "boolean"},
                           "include_obfuscation": {"type": "boolean"}},
            "additionalProperties": False,
        },
        "n": {"enum": [1, None]},
        "best_of": {"enum": [1, None]},
        "echo": {"enum": [False, None]},
        "logprobs": {"enum": [0, None]},
        "suffix": {"type": ["string", "null"]},  # refused with a value (UNSUPPORTED)
        "frequency_penalty": {"enum": [0, None]},
        "presence_penalty": {"enum": [0, None]},
        "logit_bias": {"type": ["object", "null"], "maxProperties": 0},
        "user": {"type": ["string", "null"]},
        "ignore_eos": _NULLABLE_BOOL,
        "min_tokens": {"type": ["integer", "null"], "minimum": 0},
        "stop_token_ids": {"type": ["array", "null"], "items": {"type": "integer", "minimum": 0}},
        "return_token_ids": _NULLABLE_BOOL,
        "return_tokens_as_token_ids": _NULLABLE_BOOL,
        "skip_special_tokens": _NULLABLE_BOOL,
        "spaces_between_special_tokens": _NULLABLE_BOOL,  # no effect: tokens decode without added spaces
        "include_stop_str_in_output": _NULLABLE_BOOL,
        "structured_outputs": {
            "type": ["object", "null"],
            "properties": {"json": {"type": "object"}},
            "additionalProperties": False,  # grammar, regex, choice, structural_tag: not enforced here
        },
    },
    "additionalProperties": False,
}
_REQUEST = compile_schema(COMPLETIONS_REQUEST)
UNSUPPORTED = {"suffix": "gpt-oss was not trained to insert text before a suffix (fill-in-the-middle); send the text "
                         "before the insertion point as the prompt"}
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint


async def completions(request: Request) -> Response:
    state: ServerState = request.app.state.harmony
    state.check_room()  # a 429 before the body is parsed
    body = await read_json_object(request)
    if isinstance(body.get("prompt"), list) and body["prompt"] and not isinstance(body["prompt"][0], int):
        raise invalid_request("Send one prompt per request: a string or a list of token ids.", param="prompt")
    check(body, _REQUEST)
    refuse_unsupported(body, UNSUPPORTED)
    state.check_model(body["model"])
    state.require_ready()
    completion = await parse_off_loop(lambda: _Completion(state, body), large=False)  # its schema: off the loop
    outcome = Outcome(prompt_tokens=len(completion.engine_request.prompt_token_ids))
    steps = tracked_steps(state.engine, completion.engine_request, outcome)
    try:
        first = await unless_disconnected(request, anext(steps))
        if body.get("stream"):
            return EventStream(_frames(first, steps, completion, outcome, body))  # it closes `steps`
        completion.add(first)
        await unless_disconnected(request, _fold(steps, completion))
    finally:
        if not body.get("stream"):
            await close_shielded(steps)  # a stop string may have ended the text early: stop the engine too
    completion.close()
    failure = None if completion.stopped else outcome.failure()
    if failure is not None:
        raise failure
    choice = {"index": 0, "text": completion.text, "logprobs": completion.logprobs(completion.token_ids),
              **completion.finish(outcome)}
    if completion.return_token_ids:
        choice["token_ids"] = completion.token_ids
        choice["prompt_token_ids"] = completion.engine_request.prompt_token_ids
    return JSONResponse({**completion.head, "choices": [choice], "usage": _usage(outcome)})


class _Completion:
    """The text and token ids of one raw completion, streamed or not."""

    def __init__(self, state: ServerState, body: dict[str, Any]) -> None:
        vocab = state.vocab
        prompt_ids = _prompt_ids(vocab, body["prompt"])
        for param, ids in (("prompt", prompt_ids), ("stop_token_ids", body.get("stop_token_ids") or [])):
            if any(token >= vocab.vocab_size for token in ids):
                raise invalid_request(f"`{param}` holds a token id past the vocabulary (ids are 0 to "
                                      f"{vocab.vocab_size - 1}).", param=param)
        max_tokens = body.get("max_tokens") or DEFAULT_MAX_TOKENS
        if len(prompt_ids) + max_tokens > state.config.max_model_len:
            raise invalid_request(
                f"This model's maximum context length is {state.config.max_model_len} tokens. However, you requested "
                f"{len(prompt_ids)} prompt tokens and {max_tokens} output tokens.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        stop_ids = body.get("stop_token_ids")
        # top_p 0 keeps only the likeliest token (OpenAI accepts it): greedy decoding, which engines take as
        # temperature 0 (vLLM and TensorRT-LLM refuse a top_p of 0).
        greedy = body.get("top_p") == 0
        sampling = SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0 if greedy else body.get("temperature"),
            top_p=None if greedy else body.get("top_p"),
            seed=body.get("seed"),
            stop_token_ids=tuple(stop_ids) if stop_ids is not None else vocab.stop_token_ids,
            min_tokens=body.get("min_tokens") or 0,
            ignore_eos=bool(body.get("ignore_eos")),
        )
        self.engine_request = GenerationRequest(new_id("cmpl-", 29), prompt_ids, sampling, _constraint(body))
        self.head = {"id": self.engine_request.request_id, "object": "text_completion", "created": int(time.time()),
                     "model": body["model"]}
        self.return_token_ids = bool(body.get("return_token_ids"))
        self.ids_in_logprobs = body.get("logprobs") == 0 and bool(body.get("return_tokens_as_token_ids"))
        self._stop_ids = frozenset(sampling.stop_token_ids)
        self._keep_stop = bool(body.get("include_stop_str_in_output"))
        stop = body.get("stop")
        self._stop_strings = StopMatcher((stop,) if isinstance(stop, str) else tuple(stop or ()))
        self._detokenizer = Detokenizer(vocab, skip_special_tokens=body.get("skip_special_tokens") is not False)
        self._pieces: list[str] = []
        self.token_ids: list[int] = []
        self.stop_reason: int | str | None = None
        self._held_stop: int | None = None

    @property
    def stopped(self) -> bool:
        return self._stop_strings.hit

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    def add(self, step: Step) -> tuple[str, list[int]]:
        """Take one engine step; return the text and token ids to stream for it."""
        if self.stopped:
            return "", []
        tokens = list(step.token_ids)
        self.token_ids += tokens
        # A stop token's text is held until we know whether it ended generation (then it is not shown).
        shown = ([self._held_stop] if self._held_stop is not None else []) + tokens
        self._held_stop = None
        if shown and shown[-1] in self._stop_ids:
            if step.finish_reason == "stop":
                self.stop_reason = shown[-1]
                if not self._keep_stop:
                    shown = shown[:-1]  # it stays in token_ids, as vLLM returns it
            elif step.finish_reason is None:
                self._held_stop = shown.pop()
        text = self._stop_strings.feed(self._detokenizer.feed(shown))
        if self.stopped:
            self.stop_reason = self._stop_strings.matched
        self._pieces.append(text)
        return text, tokens

    def close(self) -> str:
        if self.stopped:
            return ""
        tail = self._stop_strings.feed(self._detokenizer.flush()) + self._stop_strings.flush()
        self._pieces.append(tail)
        return tail

    def logprobs(self, tokens: list[int]) -> dict[str, Any] | None:
        """vLLM's `logprobs` of these tokens when asked for their ids there, else None."""
        if not self.ids_in_logprobs:
            return None
        return {"tokens": [f"token_id:{token}" for token in tokens], "token_logprobs": [None] * len(tokens)}

    def finish(self, outcome: Outcome) -> dict[str, Any]:
        reason = "stop" if self.stopped else ("length" if outcome.finish_reason == "length" else "stop")
        return {"finish_reason": reason, "stop_reason": self.stop_reason}

async def _fold(steps: AsyncGenerator[Step, None], completion: _Completion) -> None:
    if completion.stopped:  # a stop string in the first step: read no further, as a stream would not
        return
    async for step in steps:
        completion.add(step)
        if completion.stopped:
            return


async def _frames(
    first: Step, steps: AsyncGenerator[Step, None], completion: _Completion, outcome: Outcome, body: dict[str, Any]
) -> AsyncGenerator[bytes, None]:
    """One item per engine step; the chunk's fixed parts are rendered once, so a step costs one string escape."""
    options = body.get("stream_options") or {}
    # With include_usage every chunk but the last has `usage: null`, as OpenAI streams them.
    usage = {"usage": None} if options.get("include_usage") else {}
    end_chunk = b',"usage":null}\n\n' if usage else b"}\n\n"
    before = b"data: " + _json(completion.head)[:-1].encode() + b',"choices":[{"index":0,"text":'  # up to the text
    after = b',"logprobs":null,"finish_reason":null}]' + end_chunk
    ids_after = b'],"logprobs":null,"finish_reason":null}]' + end_chunk

    def chunk(text: str, tokens: list[int]) -> bytes:
        escaped = encode_basestring(text).encode()
        if completion.ids_in_logprobs:
            choice = {"index": 0, "text": text, "logprobs": completion.logprobs(tokens), "finish_reason": None}
            if completion.return_token_ids:
                choice["token_ids"] = tokens
            return data_frame(_json({**completion.head, "choices": [choice]}))
        if completion.return_token_ids:
            return b"%s%s,\"token_ids\":[%s%s" % (before, escaped, ",".join(map(str, tokens)).encode(), ids_after)
        return before + escaped + after

    try:
        text, tokens = completion.add(first)
        if text or tokens:
            yield chunk(text, tokens)
        if not completion.stopped:
            async for step in steps:
                text, tokens = completion.add(step)
                if text or tokens:
                    yield chunk(text, tokens)
                if completion.stopped:
                    break
        tail = completion.close()
        failure = None if completion.stopped else outcome.failure()
        if failure is not None:
            end = data_frame(json.dumps(failure.body()))
        else:
            choice: dict[str, Any] = {"index": 0, "text": tail, "logprobs": completion.logprobs([]),
                                      **completion.finish(outcome)}
            if completion.return_token_ids:
                choice["token_ids"] = []
            end = data_frame(_json({**completion.head, "choices": [choice], **usage}))
            if options.get("include_usage"):
                end += data_frame(_json({**completion.head, "choices": [], "usage": _usage(outcome)}))
    except EngineError as exc:
        end = data_frame(json.dumps(from_engine(exc).body()))
    finally:
        await close_shielded(steps)
    yield end + DONE


def _prompt_ids(vocab: Vocab, prompt: str | list[int] | None) -> list[int]:
    """The prompt's token ids. No prompt: the document separator alone, from which "the model will generate as if
    from the beginning of a new document" (OpenAI's reference for `prompt`)."""
    if prompt is None:
        return vocab.encode_harmony("<|endoftext|>")
    return vocab.encode_harmony(prompt) if isinstance(prompt, str) else list(prompt)


def _json(payload: dict[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def _usage(outcome: Outcome) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
    }
    if outcome.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": outcome.cached_tokens}
    return usage


def _constraint(body: dict[str, Any]) -> OutputConstraint:
    """vLLM's `structured_outputs.json`, as a response format: the final answer follows the schema."""
    schema = (body.get("structured_outputs") or {}).get("json")
    if schema is None:
        return OutputConstraint()
    format_ = response_format("json_schema", {"name": "structured_outputs", "schema": schema},
                              "structured_outputs.json")
    return OutputConstraint(response_format=format_)
