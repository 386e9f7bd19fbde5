"""OpenAI's completions and chat completions over the AsyncEngine.

    request ─► check model, build SamplingParams, tokenize (chat template) ─► admit (queue limit, validate)
            ─► one engine request per prompt (n choices each) ─► merged stream of cumulative outputs
            ─► SSE chunks of text deltas, or one JSON body when the last output is in

Everything the client can get wrong is found before the first engine request starts, so it is a 400/404/429
with an OpenAI-style body and nothing enters the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

import tachyon
from tachyon.engine.async_engine import AsyncEngine, EngineDeadError, QueueFullError
from tachyon.engine.chat import encode_chat
from tachyon.outputs import CompletionOutput, RequestOutput, logprob_ranks
from tachyon.sampling_params import SamplingParams, StructuredOutputsParams
from tachyon.server.batch_encode import BatchEncoder
from tachyon.server.chat_extras import check_template_flags, echo_prefix, message_text
from tachyon.server.errors import APIError, error_body, from_value_error
from tachyon.server.frontend import FrontendOptions
from tachyon.server.protocol import ChatCompletionRequest, CompletionRequest
from tachyon.server.structured import compile_off_loop, structured_spec
from tachyon.server.tool_parsers import TOOL_PARSERS
from tachyon.server.tools import (
    ToolPlan,
    ToolStream,
    history_tool_calls,
    message_with_calls,
    plan_tools,
    template_messages,
)

Prompt = tuple[str | None, list[int]]  # (text if the client sent text, token ids)
_OFF_LOOP_CHARS = 16_384  # prompts this long are tokenized (chat-templated) in a worker thread
SYSTEM_FINGERPRINT = f"fp_tachyon_{tachyon.__version__}"
logger = logging.getLogger("tachyon")


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _sse(obj) -> str:
    return f"data: {_dumps(obj)}\n\n"


class SSEResponse(StreamingResponse):
    """A StreamingResponse that always closes its body: a client that went away aborts its requests now."""

    async def stream_response(self, send) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()


async def _wait_for_disconnect(request: HTTPRequest) -> None:
    """Returns when the client goes away (the body has been read, so receive() only reports disconnects)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


@dataclass
class _Choice:
    """Streaming state of one choice: what has been sent so far."""

    num_chars: int = 0
    num_tokens: int = 0
    text_offset: int = 0
    finished: bool = False
    started: bool = False
    tool: ToolStream | None = None  # a chat choice that may call tools


@dataclass
class _Job:
    """One API request, turned into engine requests."""

    kind: str  # "completion" | "chat"
    request_id: str
    created: int
    prompts: list[Prompt]
    params: SamplingParams
    stream: bool
    include_usage: bool
    logprobs: int | None  # top-N per token (chat: top_logprobs), None = no logprobs
    echo: bool = False
    names: dict[str, str] | None = None  # engine field names -> this endpoint's (for error params)
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage in every chunk
    token_ids_as_text: bool = False  # return_tokens_as_token_ids: logprob tokens as "token_id:N"
    choices: list[_Choice] = field(default_factory=list)
    timed_out: bool = False
    tools: ToolPlan | None = None  # chat with tools (tool_choice other than "none")


class OpenAIServing:
    def __init__(self, async_engine: AsyncEngine, model_name: str | list[str], request_timeout: float | None = None,
                 options: FrontendOptions | None = None, tool_call_parser: str | None = None):
        if tool_call_parser is not None and tool_call_parser not in TOOL_PARSERS:
            raise ValueError(f"unknown tool-call parser {tool_call_parser!r}; choose one of {sorted(TOOL_PARSERS)}")
        self.tool_call_parser = tool_call_parser  # how tool_choice "auto" reads the model's calls
        self.async_engine = async_engine
        self.request_timeout = request_timeout  # seconds from arrival; then the request is aborted
        self.engine = async_engine.engine
        self.tokenizer = self.engine.tokenizer
        self.model_names = [model_name] if isinstance(model_name, str) else list(model_name)
        self.model_name = self.model_names[0]  # the name responses carry
        self.options = options or FrontendOptions()
        self.on_admit = None  # called with each admitted request's resolved max_tokens (the metrics)
        self.draining = False  # set on shutdown: no new requests
        self._token_text: dict[int, str] = {}

    def warm_up(self) -> None:
        """What the first request would otherwise pay for, done at start-up: the prompt-length bound (it reads the
        whole vocabulary: 42 ms for Llama 3's 128k tokens) and a first tokenizer call. An H100 serve run's first
        request was handed to the core 91 ms after it arrived, the next ones within 14 ms."""
        if self.tokenizer is None:
            return
        self._max_prompt_chars  # noqa: B018 (a cached property: computed here once)
        self._batch_encoder.encode_now(["warm up"], True)

    # -- admission -------------------------------------------------------------------------------------
    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.model_names:
            served = " or ".join(repr(n) for n in self.model_names)
            raise APIError(404, f"the model {name!r} does not exist; this server serves {served}", "model")

    def check_alive(self) -> None:
        if self.async_engine.error is not None:
            raise APIError(503, f"the engine stopped after an error: {self.async_engine.error!r}")
        if self.draining:
            raise APIError(503, "the server is shutting down")

    def abort_all(self) -> None:
        """Abort every request in the engine (shutdown); thread-safe. Their streams end with "abort"."""
        for request_id in self.engine.request_ids():
            self.engine.abort_request(request_id)  # the loop is stepping while requests are live: no wake

    def _sampling_params(self, req, max_tokens: int | None, logprobs: int | None,
                         names: dict[str, str] | None = None, structured: StructuredOutputsParams | None = None,
                         prompt_logprobs: int | None = None) -> SamplingParams:
        if req.best_of is not None and req.best_of != req.n:
            raise APIError(400, "best_of other than n is not supported", "best_of")
        if req.stream_options is not None and not req.stream:
            raise APIError(400, "stream_options is only allowed when stream is true", "stream_options")
        if req.stream and req.prompt_logprobs:  # vLLM's words
            raise APIError(400, "`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
        try:
            values = dict(
                n=req.n, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
                repetition_penalty=req.repetition_penalty, presence_penalty=req.presence_penalty,
                frequency_penalty=req.frequency_penalty, seed=req.seed, stop=req.stop,
                stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos, max_tokens=max_tokens,
                min_tokens=req.min_tokens, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                skip_special_tokens=req.skip_special_tokens,
                include_stop_str_in_output=req.include_stop_str_in_output, structured_outputs=structured)
            values.update(logit_bias=token_id_keys(req.logit_bias), allowed_token_ids=req.allowed_token_ids,
                          bad_words=req.bad_words)
            params = SamplingParams(**with_default_sampling(values, req, self.options.default_sampling))
            params.resolve_bad_words(self.tokenizer)
            return params
        except ValueError as e:
            raise from_value_error(e, names) from None

    def _check_text(self, text: str) -> None:
        if self.tokenizer is None:
            raise APIError(400, "this model has no tokenizer: send the prompt as a list of token ids", "prompt")
        if len(text) > self._max_prompt_chars:  # surely over the context: refuse it without tokenizing it
            raise APIError(400, f"the prompt has {len(text)} characters, more than this model's context of "
                                f"{self.engine.config.scheduler.max_model_len} tokens can hold: shorten the prompt",
                           "prompt")

    @functools.cached_property
    def _batch_encoder(self) -> BatchEncoder:
        return BatchEncoder(self.tokenizer)

    @functools.cached_property
    def _max_prompt_chars(self) -> int:
        """No prompt longer than this fits: no token of the vocabulary spells more than the longest one."""
        longest = max((len(t) for t in self.tokenizer.get_vocab()), default=1)
        return self.engine.config.scheduler.max_model_len * max(longest, 1)

    def _admit(self, prompts: list[Prompt], params: SamplingParams, names: dict[str, str] | None = None) -> None:
        """Queue limit (429) and context/KV checks (400) for every prompt, before any of them starts."""
        self.check_alive()
        limit = self.async_engine.max_queued_requests
        if limit is not None:
            waiting = self.async_engine.num_waiting
            if waiting + len(prompts) > limit:  # AsyncEngine checks each request; a list is all or nothing
                raise APIError(429, f"{waiting} requests are already waiting (limit {limit}, "
                                    f"--max-queued-requests); retry later")
        resolved = []
        for _, ids in prompts:
            try:
                resolved.append(self.engine.validate(ids, params))
            except ValueError as e:
                raise from_value_error(e, names) from None
        if self.on_admit is not None:
            for max_tokens in resolved:
                self.on_admit(max_tokens)

    # -- endpoints -------------------------------------------------------------------------------------
    async def completions(self, req: CompletionRequest, http: HTTPRequest) -> Response:
        self.check_model(req.model)
        if req.suffix:
            raise APIError(400, "suffix is not supported", "suffix")
        spec, spec_field = structured_spec(req)
        # echo with logprobs: the echoed prompt's tokens carry their logprobs too (vLLM's rule)
        prompt_logprobs = req.logprobs if req.echo and req.prompt_logprobs is None else req.prompt_logprobs
        params = self._sampling_params(req, req.max_tokens, req.logprobs, structured=spec,
                                       prompt_logprobs=prompt_logprobs)
        if spec is not None:
            await compile_off_loop(self.engine.grammars, spec, spec_field)
        prompts = await self._completion_prompts(req)
        job = _Job("completion", f"cmpl-{uuid.uuid4().hex}", int(time.time()), prompts, params, req.stream,
                   bool(req.stream_options and req.stream_options.include_usage), req.logprobs, req.echo)
        self._stream_extras(job, req)
        return await self._run(job, http)

    async def _completion_prompts(self, req: CompletionRequest) -> list[Prompt]:
        p = req.prompt
        if isinstance(p, str) or p and all(isinstance(x, str) for x in p):
            texts = [p] if isinstance(p, str) else p
            for text in texts:
                self._check_text(text)
            if len(texts) == 1:  # (gather would make it a task, which starts a loop turn later)
                ids = [await self._batch_encoder.encode(texts[0], req.add_special_tokens)]
            else:
                ids = await asyncio.gather(*(self._batch_encoder.encode(t, req.add_special_tokens) for t in texts))
            prompts = list(zip(texts, ids, strict=True))
        elif p and all(isinstance(x, list) for x in p):
            prompts = [(None, list(ids)) for ids in p]
        else:
            prompts = [(None, list(p))]
        if not prompts or any(not ids for _, ids in prompts):
            raise APIError(400, "the prompt is empty: give at least one token of text", "prompt")
        return prompts

    async def chat(self, req: ChatCompletionRequest, http: HTTPRequest) -> Response:
        self.check_model(req.model)
        self._check_chat_fields(req)
        max_logprobs = self.engine.config.max_logprobs
        if req.top_logprobs is not None:
            if not req.logprobs:
                raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
            if not 0 <= req.top_logprobs <= max_logprobs:
                raise APIError(400, f"top_logprobs={req.top_logprobs} is out of range: it must be in "
                                    f"[0, {max_logprobs}] (--max-logprobs)", "top_logprobs")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        max_name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        names = {"logprobs": "top_logprobs", "max_tokens": max_name, "prompt": "messages"}
        spec, spec_field = structured_spec(req)
        plan = plan_tools(req, self.tool_call_parser)
        if plan is not None and plan.spec is not None:
            if spec is not None:
                raise APIError(400, f"tool_choice {plan.mode} constrains the output itself: drop {spec_field}",
                               spec_field)
            spec, spec_field = plan.spec, "tools"
        params = self._sampling_params(req, max_tokens, logprobs, names, spec, req.prompt_logprobs)
        if plan is not None and plan.parser is not None and not plan.parser.skip_special_tokens:
            params.skip_special_tokens = False  # the format's marker is a special token
        if spec is not None:
            await compile_off_loop(self.engine.grammars, spec, spec_field)
        if _chat_chars(req) >= _OFF_LOOP_CHARS:
            ids = await asyncio.to_thread(self._apply_chat_template, req, plan)
        else:
            ids = self._apply_chat_template(req, plan)
        echoed = echo_prefix(self._chat_messages(req), self.options.response_role) if req.echo else None
        job = _Job("chat", f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), [(echoed, ids)], params, req.stream,
                   bool(req.stream_options and req.stream_options.include_usage), logprobs, req.echo, names=names,
                   tools=plan)
        self._stream_extras(job, req)
        return await self._run(job, http)

    @staticmethod
    def _stream_extras(job: _Job, req) -> None:
        job.continuous_usage = bool(req.stream_options and req.stream_options.continuous_usage_stats)
        job.token_ids_as_text = req.return_tokens_as_token_ids

    @staticmethod
    def _check_chat_fields(req: ChatCompletionRequest) -> None:
        if req.modalities is not None and req.modalities != ["text"]:
            raise APIError(400, "only the text modality is supported", "modalities")

    @staticmethod
    def _chat_messages(req) -> list[dict]:
        messages = []
        for i, m in enumerate(req.messages):
            msg = {"role": m.role, "content": message_text(m.content, i)}
            if m.name is not None:
                msg["name"] = m.name
            if m.tool_calls is not None:
                msg["tool_calls"] = history_tool_calls(m.tool_calls)
            if m.tool_call_id is not None:
                msg["tool_call_id"] = m.tool_call_id
            messages.append(msg)
        return messages

    def _apply_chat_template(self, req, plan: ToolPlan | None = None) -> list[int]:
        """`req`: a chat completion or a /tokenize request (messages and the template fields); `plan`: its tools."""
        template = req.chat_template or self.options.chat_template
        if self.tokenizer is None or not (template or getattr(self.tokenizer, "chat_template", None)):
            raise APIError(400, "this model has no chat template: use /v1/completions", "messages")
        messages = self._chat_messages(req)
        check_template_flags(req.add_generation_prompt, req.continue_final_message, messages)
        if _chat_chars(req) > self._max_prompt_chars:
            raise APIError(400, f"the messages are longer than this model's context of "
                                f"{self.engine.config.scheduler.max_model_len} tokens can hold: shorten them",
                           "messages")
        tools = plan.tools if plan is not None else None
        try:
            return encode_chat(self.tokenizer,
                               template_messages(messages, tools, template or self.tokenizer.chat_template),
                               req.add_generation_prompt, chat_template=template,
                               continue_final_message=req.continue_final_message,
                               chat_template_kwargs=req.chat_template_kwargs, tools=tools)
        except ValueError as e:
            if "chat_template_kwargs" in str(e):
                raise APIError(400, str(e), "chat_template_kwargs") from None
            raise APIError(400, f"the chat template rejected the messages: {e}", "messages") from None
        except Exception as e:  # jinja raises on conversations the template rejects
            raise APIError(400, f"the chat template rejected the messages: {e}", "messages") from None

    # -- running ---------------------------------------------------------------------------------------
    async def _run(self, job: _Job, http: HTTPRequest) -> Response:
        if job.params.max_tokens is None:  # "up to the context": but no further than the KV cache holds
            longest = max(len(ids) for _, ids in job.prompts)
            room = self.engine.num_kv_blocks * self.engine.config.cache.block_size - longest
            if longest < self.engine.config.scheduler.max_model_len and 0 < room < (
                    self.engine.config.scheduler.max_model_len - longest):
                job.params.max_tokens = room
        self._admit(job.prompts, job.params, job.names)
        if self.options.enable_log_requests:
            logger.info("Received request %s: prompt tokens %s, params %s", job.request_id,
                        [len(ids) for _, ids in job.prompts], job.params)
        job.choices = [_Choice() for _ in range(len(job.prompts) * job.params.n)]
        streams = await self._start(job, getattr(http.state, "received", None))
        merged = streams[0] if len(streams) == 1 else _merge(streams)
        if self.request_timeout is not None:
            merged = self._deadline(job, merged, self.request_timeout)
        if job.stream:
            return SSEResponse(self._sse(job, merged), media_type="text/event-stream",
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await self._full(job, merged, http)

    def _rids(self, job: _Job) -> list[str]:
        return [job.request_id] if len(job.prompts) == 1 else [f"{job.request_id}-{i}" for i in range(len(job.prompts))]

    async def _deadline(self, job: _Job, stream, seconds: float):
        """--request-timeout: past it, the job's engine requests are aborted (their outputs still come, with
        finish_reason "abort") and the response says the request timed out."""
        def expire():
            job.timed_out = True
            for rid in self._rids(job):
                self.engine.abort_request(rid)
            self.async_engine.wake()

        timer = asyncio.get_running_loop().call_later(seconds, expire)
        try:
            async for item in stream:
                yield item
        finally:
            timer.cancel()
            await stream.aclose()

    def _timeout_error(self) -> APIError:
        return APIError(504, f"the request did not finish within {self.request_timeout:g} s (--request-timeout); "
                             f"ask for fewer tokens or retry later")

    async def _start(self, job: _Job, arrival_time: float | None = None
                     ) -> list[AsyncIterator[tuple[int, RequestOutput]]]:
        """Add every engine request of the job now, so a full queue is a 429 before the response starts.
        arrival_time: when the HTTP request came in (monotonic; its TTFT, queue time and timeline count from it,
        so parsing and tokenizing are in them); None: when the engine takes it.

        AsyncEngine.generate checks the queue and adds the request in its first step, then waits for output;
        a task per request runs that first step while we yield to the loop once.
        """
        rids = self._rids(job)
        started = []
        for rid, (text, ids) in zip(rids, job.prompts, strict=True):
            gen = self.async_engine.generate(rid, text, ids, job.params, stream=job.stream,
                                             arrival_time=arrival_time)
            started.append((gen, asyncio.ensure_future(gen.__anext__())))
        await asyncio.sleep(0)  # each task's first step runs before we resume: the requests are in
        failed = next((first for _, first in started if first.done() and first.exception() is not None), None)
        if failed is not None:
            for _, first in started:
                first.cancel()  # lands in the engine stream, which aborts its request
            e = failed.exception()
            if isinstance(e, QueueFullError):
                raise APIError(429, str(e))
            if isinstance(e, EngineDeadError):
                raise APIError(503, str(e))
            if isinstance(e, ValueError):
                raise from_value_error(e, job.names)
            raise e
        return [_outputs(i, gen, first) for i, (gen, first) in enumerate(started)]

    async def _full(self, job: _Job, stream, http: HTTPRequest) -> Response:
        final: list[RequestOutput | None] = [None] * len(job.prompts)

        async def collect():
            async for i, out in stream:
                final[i] = out

        task = asyncio.ensure_future(collect())
        watcher = asyncio.ensure_future(_wait_for_disconnect(http))
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():  # the client left (or we are cancelled): abort its requests
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            watcher.cancel()
        if task.cancelled():
            return Response(status_code=499)  # nobody is listening
        try:
            task.result()
        except QueueFullError as e:
            raise APIError(429, str(e)) from None
        except EngineDeadError as e:
            raise APIError(503, str(e)) from None
        except ValueError as e:
            raise from_value_error(e, job.names) from None
        failed = next((out.error for out in final if out is not None and out.error is not None), None)
        if failed is not None:
            raise _engine_failure(failed)
        if job.timed_out:
            raise self._timeout_error()
        return JSONResponse(self._response_body(job, final))

    # -- response bodies ---------------------------------------------------------------------------------
    def _usage(self, job: _Job, final: list[RequestOutput | None]) -> dict:
        prompt = sum(len(ids) for _, ids in job.prompts)
        completion = sum(len(c.token_ids) for out in final if out is not None for c in out.outputs)
        cached = sum(out.num_cached_tokens for out in final if out is not None)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def _response_body(self, job: _Job, final: list[RequestOutput]) -> dict:
        choices = []
        n = job.params.n
        for p, out in enumerate(final):
            for c in out.outputs:
                index = p * n + c.index
                if job.kind == "chat":
                    text = (self._prompt_text(job, p) + c.text) if job.echo else c.text
                    message, finish_reason = {"role": self.options.response_role, "content": text}, c.finish_reason
                    if job.tools is not None:
                        message, finish_reason = message_with_calls(job.tools, c.text, c.finish_reason)
                    choices.append({"index": index, "message": message,
                                    "logprobs": self._logprobs(job, c, 0, job.choices[index]),
                                    "finish_reason": finish_reason, "stop_reason": c.stop_reason})
                else:
                    text = (self._prompt_text(job, p) + c.text) if job.echo else c.text
                    choices.append({"index": index, "text": text,
                                    "logprobs": self._logprobs(job, c, 0, job.choices[index],
                                                               out if job.echo else None),
                                    "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
                                    "prompt_logprobs": self._prompt_logprobs(out)})
        choices.sort(key=lambda ch: ch["index"])
        body = {"id": job.request_id, "object": "chat.completion" if job.kind == "chat" else "text_completion",
                "created": job.created, "model": self.model_name, "choices": choices,
                "usage": self._usage(job, final), "system_fingerprint": SYSTEM_FINGERPRINT}
        if job.kind == "chat":  # vLLM puts a chat's prompt logprobs beside its choices
            body["prompt_logprobs"] = self._prompt_logprobs(final[0])
        return body

    async def _sse(self, job: _Job, stream) -> AsyncIterator[str]:
        obj = "chat.completion.chunk" if job.kind == "chat" else "text_completion"
        head = {"id": job.request_id, "object": obj, "created": job.created, "model": self.model_name,
                "system_fingerprint": SYSTEM_FINGERPRINT}
        if job.include_usage:
            head["usage"] = None
        n = job.params.n
        final: list[RequestOutput | None] = [None] * len(job.prompts)
        try:
            async for p, out in stream:
                if out.error is not None:  # this request failed in the engine; the others of the job are aborted
                    yield _sse(_engine_failure(out.error).body())
                    break
                final[p] = out
                choices = [ch for c in out.outputs
                           if (ch := self._delta(job, p * n + c.index, p, c, out)) is not None]
                for choice in choices:  # one choice per chunk, as vLLM sends them (clients read choices[0])
                    chunk = {**head, "choices": [choice]}
                    if job.continuous_usage:
                        chunk["usage"] = self._usage(job, final)
                    yield _sse(chunk)
            else:
                if job.timed_out:
                    yield _sse(self._timeout_error().body())
                elif job.include_usage:
                    yield _sse({**head, "choices": [], "usage": self._usage(job, final)})
        except QueueFullError as e:
            yield _sse(error_body(429, str(e)))
        except EngineDeadError as e:
            yield _sse(error_body(503, str(e)))
        except ValueError as e:
            yield _sse(from_value_error(e, job.names).body())
        finally:
            await stream.aclose()  # a client that went away: abort its requests now, not at GC time
        yield "data: [DONE]\n\n"

    def _delta(self, job: _Job, index: int, p: int, c: CompletionOutput, out: RequestOutput) -> dict | None:
        """The chunk for one choice: text since the last chunk; None if there is nothing to send."""
        st = job.choices[index]
        if st.finished:
            return None
        text = c.text[st.num_chars:]
        if not text and c.finish_reason is None:
            return None  # tokens whose text is held back (partial UTF-8 or a possible stop string)
        finish_reason = c.finish_reason
        if job.tools is not None:
            st.tool = st.tool or ToolStream(job.tools)
            delta = st.tool.delta(c.text, c.finish_reason is not None)
            if not delta and c.finish_reason is None:
                return None  # held back: it may be a tool call
            if st.tool.called and finish_reason == "stop":
                finish_reason = "tool_calls"
        logprobs = self._logprobs(job, c, st.num_tokens, st, out if job.echo and not st.started else None)
        st.num_chars, st.num_tokens = max(st.num_chars, len(c.text)), len(c.token_ids)
        st.finished = c.finish_reason is not None
        if job.echo and not st.started:
            text = self._prompt_text(job, p) + text
        if job.kind == "chat":
            if job.tools is None:
                delta = {"content": text}
            if not st.started:
                delta["role"] = self.options.response_role
        else:
            delta = None
        st.started = True
        choice = {"index": index}
        if delta is not None:
            choice["delta"] = delta
        else:
            choice["text"] = text
        choice["logprobs"] = logprobs
        choice["finish_reason"] = finish_reason
        choice["stop_reason"] = c.stop_reason
        return choice

    # -- logprobs ----------------------------------------------------------------------------------------
    def _token_str(self, token_id: int, as_id: bool = False) -> str:
        if as_id:
            return f"token_id:{token_id}"
        s = self._token_text.get(token_id)
        if s is None:
            s = (self.tokenizer.decode([token_id]) if self.tokenizer is not None else f"token_id:{token_id}")
            if len(self._token_text) < 200_000:
                self._token_text[token_id] = s
        return s

    def _logprobs(self, job: _Job, c: CompletionOutput, start: int, st: _Choice,
                  echoed: RequestOutput | None = None) -> dict | None:
        """Logprobs of tokens [start:] of a choice, in the endpoint's format; `echoed` (completions with echo):
        the prompt's tokens first, with its prompt logprobs (none for the first token, as vLLM's)."""
        if job.logprobs is None or c.logprobs is None:
            return None
        tokens, token_logprobs, top, offsets, content = [], [], [], [], []
        as_id = job.token_ids_as_text
        if echoed is not None and echoed.prompt_logprobs is not None:
            for tid, lp in zip(echoed.prompt_token_ids, echoed.prompt_logprobs, strict=True):
                tokens.append(self._token_str(tid, as_id))
                token_logprobs.append(None if lp is None else _finite(lp[tid]))
                top.append(None if lp is None else {self._token_str(i, as_id): _finite(v)
                                                    for i, v in sorted(lp.items(), key=lambda kv: -kv[1])})
                offsets.append(st.text_offset)
                st.text_offset += len(tokens[-1])
        for tid, lp in zip(c.token_ids[start:], c.logprobs[start:], strict=False):
            s = self._token_str(tid, as_id)
            value = _finite(lp.get(tid, -math.inf))
            ranked = sorted(lp.items(), key=lambda kv: -kv[1])
            if job.kind == "chat":
                content.append({"token": s, "logprob": value, "bytes": list(s.encode("utf-8")),
                                "top_logprobs": [{"token": (t := self._token_str(i, as_id)), "logprob": _finite(v),
                                                  "bytes": list(t.encode("utf-8"))}
                                                 for i, v in ranked[:job.logprobs]]})
            else:
                tokens.append(s)
                token_logprobs.append(value)
                top.append({self._token_str(i, as_id): _finite(v) for i, v in ranked})
                offsets.append(st.text_offset)
                st.text_offset += len(s)
        if job.kind == "chat":
            return {"content": content}
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}

    def _prompt_logprobs(self, out: RequestOutput) -> list[dict | None] | None:
        """prompt_logprobs as vLLM's responses carry them: None for the first prompt token, then per prompt
        token {token_id: {logprob, rank, decoded_token}} of it and the top-N at its position."""
        if out.prompt_logprobs is None:
            return None
        body = []
        for tid, lp, rank in zip(out.prompt_token_ids, out.prompt_logprobs, out.prompt_token_ranks, strict=True):
            if lp is None:
                body.append(None)
                continue
            ranks = logprob_ranks(lp, tid, rank)
            body.append({str(i): {"logprob": _finite(v), "rank": ranks[i], "decoded_token": self._token_str(i)}
                         for i, v in lp.items()})
        return body

    def _prompt_text(self, job: _Job, p: int) -> str:
        text, ids = job.prompts[p]
        if text is not None:
            return text
        return self.tokenizer.decode(ids) if self.tokenizer is not None else ""


async def _outputs(i: int, gen, first: asyncio.Future) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(i, output) from one engine stream whose first __anext__ already runs as the task `first`."""
    try:
        out = await first
        yield i, out
        if out.finished:
            return
        async for out in gen:
            yield i, out
    finally:
        if not first.done():
            first.cancel()  # the engine stream aborts its request when the cancellation lands
        else:
            await gen.aclose()  # a client that went away: abort now, not at garbage collection


async def _merge(streams: list) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several engine streams (a list of prompts); closing the merge aborts them all."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(stream) -> None:
        try:
            async for item in stream:
                queue.put_nowait(item)
            queue.put_nowait(None)
        except Exception as e:
            queue.put_nowait(e)

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()


def _chat_chars(req: ChatCompletionRequest) -> int:
    """Characters of text in a conversation (what its tokenization costs grows with)."""
    return sum(len(m.content) if isinstance(m.content, str) else sum(len(p.text or "") for p in m.content or ())
               for m in req.messages)


def token_id_keys(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's logit_bias keys are token ids written as strings."""
    if logit_bias is None:
        return None
    bad = next((k for k in logit_bias if not k.strip().lstrip("-").isdigit() or len(k) > 20), None)
    if bad is not None:
        raise APIError(400, f"logit_bias: the key {bad[:40]!r} is not a token id", "logit_bias")
    return {int(k): v for k, v in logit_bias.items()}


def with_default_sampling(values: dict, req, defaults: dict) -> dict:
    """The request's sampling values, where it set none the model's defaults (--generation-config): a field the
    request left out (pydantic's fields_set) takes the default; max_tokens it left out is capped by it."""
    if not defaults:
        return values
    given = req.model_fields_set
    out = dict(values)
    for name, value in defaults.items():
        if name == "max_tokens":
            if not given & {"max_tokens", "max_completion_tokens"}:
                out["max_tokens"] = value if values["max_tokens"] is None else min(values["max_tokens"], value)
        elif name not in given:
            out[name] = value
    return out


def _engine_failure(error: str) -> APIError:
    return APIError(500, f"generation failed inside the engine: {error}")


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0
