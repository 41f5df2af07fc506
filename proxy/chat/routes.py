"""`POST /v1/chat/completions` and `POST /tokenize`."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from parsers.events import Event
from proxy.chat.request import ChatRequest, read_chat_request
from proxy.chat.response import ChatTurn, ChunkWriter, usage_body
from proxy.disconnect import close_shielded, unless_disconnected
from proxy.engines.base import EngineError
from proxy.errors import from_engine
from proxy.generation import parsed_events
from proxy.ids import new_id
from proxy.options import generation_request, routing_hints
from proxy.outcome import Outcome
from proxy.sse import DONE, EventStream, data_frame
from proxy.state import ServerState

_ROLE = {"role": "assistant", "content": "", "refusal": None}  # the first delta, as OpenAI sends it


async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.harmony
    state.check_room()  # a 429 before the body is parsed
    chat = await read_chat_request(request, state.config.default_reasoning_effort, state.renderer.tools)
    state.check_model(chat.model)
    state.require_ready()
    completion_id = new_id("chatcmpl-", 29)
    engine_request = generation_request(
        completion_id,
        await state.renderer.render_off_loop(chat.prompt),
        chat.options,
        chat.constraint,
        state.vocab,
        state.config.max_model_len,
        routing_hints=routing_hints(request.headers, chat.prompt_cache_key),
    )
    outcome = Outcome(prompt_tokens=len(engine_request.prompt_token_ids))
    events = parsed_events(state.engine, engine_request, state.vocab, outcome)
    turn = ChatTurn(
        state.config.reasoning_field, chat.parallel_tool_calls, chat.options.stop, lambda: new_id("call_")
    )
    try:
        # Wait for the engine's first step before answering, so a request the engine refuses is an HTTP error.
        first = await unless_disconnected(request, anext(events))
        if chat.stream:
            writer = ChunkWriter(completion_id, int(time.time()), chat.model, chat.include_usage)
            return EventStream(_frames(first, events, turn, outcome, writer, chat))  # it closes `events`
        turn.add(first)
        await unless_disconnected(request, _fold(events, turn))
    finally:
        if not chat.stream:
            await close_shielded(events)  # a stop string may have ended the turn early: stop the engine too
    turn.close()
    failure = None if turn.stopped else outcome.failure()
    if failure is not None:
        raise failure
    return JSONResponse(
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": chat.model,
            "choices": [
                {
                    "index": 0,
                    "message": turn.message(),
                    "logprobs": None,
                    "finish_reason": turn.finish_reason(outcome.finish_reason),
                }
            ],
            "usage": usage_body(outcome.usage, outcome.reasoning_tokens),
        }
    )


async def tokenize(request: Request) -> Response:
    state: ServerState = request.app.state.harmony
    chat = await read_chat_request(request, state.config.default_reasoning_effort, state.renderer.tools)
    state.check_model(chat.model)
    tokens = await state.renderer.render_off_loop(chat.prompt)
    return JSONResponse({"tokens": tokens, "count": len(tokens), "prompt": state.vocab.decode(tokens)})


async def _fold(events: AsyncGenerator[list[Event], None], turn: ChatTurn) -> None:
    if turn.stopped:  # a stop string in the first step: read no further, as a stream would not
        return
    async for batch in events:
        turn.add(batch)
        if turn.stopped:
            return


async def _frames(
    first: list[Event],
    events: AsyncGenerator[list[Event], None],
    turn: ChatTurn,
    outcome: Outcome,
    writer: ChunkWriter,
    chat: ChatRequest,
) -> AsyncGenerator[bytes, None]:
    """One item per engine step: the frames of its deltas; the last item closes the stream."""
    try:
        yield writer.frames([_ROLE, *turn.add(first)])
        if not turn.stopped:
            async for batch in events:
                deltas = turn.add(batch)
                if deltas:
                    yield writer.frames(deltas)
                if turn.stopped:
                    break
        await close_shielded(events)  # stopped early: stop the engine, and settle the outcome's counts
        end = writer.frames(turn.close())
        failure = None if turn.stopped else outcome.failure()
        if failure is not None:
            end += data_frame(json.dumps(failure.body()))
        else:
            end += writer.finish(turn.finish_reason(outcome.finish_reason))
            if chat.include_usage:
                end += writer.usage(usage_body(outcome.usage, outcome.reasoning_tokens))
    except EngineError as exc:
        # Headers are sent: the error goes in the stream, where the openai SDK and LiteLLM raise it.
        end = data_frame(json.dumps(from_engine(exc).body()))
    finally:
        await close_shielded(events)
    yield end + DONE
