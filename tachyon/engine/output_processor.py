"""The front end's half of a request: from the core's per-sequence token deltas to what the user reads.

The core sends token ids; here they become text (incremental detokenization), stop strings are found (the
core is then told to stop that sequence), logprobs accumulate, and a request's n sequences are put together
into one RequestOutput. In `tachyon serve` this runs in the HTTP process, so none of it holds back the
core's loop; the offline `LLM` runs it in the same thread after each step.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from tachyon.engine.detokenizer import IncrementalDetokenizer
from tachyon.engine.messages import EngineCoreOutput, EngineCoreRequest
from tachyon.outputs import CompletionOutput, RequestMetrics, RequestOutput
from tachyon.sampling_params import InvalidRequestError, SamplingParams

logger = logging.getLogger("tachyon")


@dataclass(eq=False)
class SeqState:
    index: int
    detok: IncrementalDetokenizer | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
    sampled_ranks: list[int | None] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    first_scheduled_time: float | None = None
    num_preemptions: int = 0

    def text(self) -> str:
        return self.detok.safe_text(self.finish_reason is not None) if self.detok is not None else ""


@dataclass(eq=False)
class RequestState:
    """A user's request as the front end sees it (vLLM's name for the same thing)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    seqs: list[SeqState]
    metrics: RequestMetrics
    stream: bool = True  # an output every step it gets a token; else only when it finishes (or its reader is ready)
    num_cached_tokens: int = 0
    error: str | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = None
    prompt_token_ranks: list[int | None] | None = None

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.seqs)


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}
        self.num_failed_requests = 0

    def admit(self, max_tokens: int, request_id: str, prompt: str | None, prompt_token_ids: list[int],
              params: SamplingParams, arrival_time: float | None, stream: bool) -> EngineCoreRequest:
        """A validated request (its resolved max_tokens) enters here; returns what to send to the core."""
        if request_id in self.states:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        now = arrival_time if arrival_time is not None else time.monotonic()
        self.add_request(request_id, prompt, prompt_token_ids, params, now, stream)
        return EngineCoreRequest(request_id, list(prompt_token_ids), params, max_tokens, now)

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
                    arrival_time: float, stream: bool = True) -> None:
        seqs = []
        for i in range(params.n):
            detok = None
            if self.tokenizer is not None:
                detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens,
                                               params.stop_strings, params.include_stop_str_in_output)
            seqs.append(SeqState(i, detok, logprobs=[] if params.logprobs is not None else None))
        metrics = RequestMetrics(arrival_time=arrival_time, admitted_time=time.monotonic())
        self.states[request_id] = RequestState(request_id, prompt, list(prompt_token_ids), params, seqs, metrics,
                                               stream)

    def has_unfinished_requests(self) -> bool:
        return bool(self.states)

    def process(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str], list[str]]:
        """Apply one step's core outputs. Returns the RequestOutputs to hand out, the sequence ids the core
        should stop (a stop string ended them here), and the request ids it should abort (they failed here)."""
        touched: dict[str, RequestState] = {}
        stops: list[str] = []
        failed: list[RequestOutput] = []
        for o in outputs:
            st = self.states.get(o.request_id)
            if st is None:
                continue
            ss = st.seqs[o.index]
            if ss.finish_reason is not None:  # stopped here while the core still ran it
                continue
            try:
                if self._apply(st, ss, o):
                    stops.append(o.request_id if len(st.seqs) == 1 else f"{o.request_id}#{o.index}")
            except Exception as e:
                failed.append(self.fail(o.request_id, f"{type(e).__name__}: {e}"))
                continue
            touched[o.request_id] = st
        ready = []
        for st in touched.values():
            if st.request_id not in self.states:
                continue
            try:
                done = st.finished
                if done or st.stream:
                    ready.append(self._make_output(st))
                if done:
                    del self.states[st.request_id]
            except Exception as e:
                failed.append(self.fail(st.request_id, f"{type(e).__name__}: {e}"))
        aborts = [o.request_id for o in failed if o is not None]
        return [o for o in failed if o is not None] + ready, stops, aborts

    def _apply(self, st: RequestState, ss: SeqState, o: EngineCoreOutput) -> bool:
        """One sequence's delta; whether a stop string ended it here."""
        if o.first_scheduled_time is not None:
            ss.first_scheduled_time = o.first_scheduled_time
        if o.queued_time is not None and st.metrics.queued_time is None:
            st.metrics.queued_time = o.queued_time
        ss.num_preemptions = o.num_preemptions
        if st.num_cached_tokens == 0 and o.index == 0:
            st.num_cached_tokens = o.num_cached_tokens
        if o.error is not None:
            st.error = o.error
        if o.prompt_logprobs is not None:
            st.prompt_logprobs = [None, *o.prompt_logprobs]
            st.prompt_token_ranks = [None, *o.prompt_ranks]
        stopped = False
        sp = st.sampling_params
        for k, token in enumerate(o.new_token_ids):
            if stopped:  # a stop string ended it: the delta's later tokens (verified proposals) are dropped
                break
            ss.token_ids.append(token)
            if o.new_logprobs is not None and ss.logprobs is not None:
                ss.logprobs.append(o.new_logprobs[k])
                ss.cumulative_logprob += o.new_sampled_logprobs[k]
                ss.sampled_ranks.append(o.new_sampled_ranks[k] if o.new_sampled_ranks is not None else None)
            if ss.first_token_time is None:
                ss.first_token_time = o.token_time
            ss.last_token_time = o.token_time
            if ss.detok is not None:
                new = ss.detok.add_token(token)
                if o.finish_reason is None and not stopped and len(ss.token_ids) >= sp.min_tokens:
                    hit = ss.detok.find_stop(len(new))
                    if hit is not None:
                        ss.finish_reason, ss.stop_reason = "stop", hit
                        ss.finished_time = time.monotonic()
                        stopped = True
        if o.finish_reason is not None and not stopped:
            ss.finish_reason, ss.stop_reason = o.finish_reason, o.stop_reason
            ss.finished_time = o.finished_time or time.monotonic()
        return stopped

    def fail(self, request_id: str, error: str) -> RequestOutput | None:
        """End a request here (its text raised, or the core is gone): finish_reason "error" on every
        sequence not yet finished."""
        st = self.states.pop(request_id, None)
        if st is None:
            return None
        self.num_failed_requests += 1
        logger.warning("request %s failed and was ended: %s", request_id, error)
        st.error = error
        now = time.monotonic()
        comps = []
        for ss in st.seqs:
            if ss.finish_reason is None:
                ss.finish_reason, ss.finished_time = "error", now
            try:  # not _make_output: what raised may be the detokenizer it reads
                text = ss.text()
            except Exception:
                text = ""
            comps.append(CompletionOutput(index=ss.index, text=text, token_ids=list(ss.token_ids),
                                          finish_reason=ss.finish_reason))
        st.metrics.finished_time = now
        return RequestOutput(request_id=request_id, prompt=st.prompt, prompt_token_ids=st.prompt_token_ids,
                             outputs=comps, finished=True, metrics=st.metrics, error=error)

    def abort_all(self, error: str) -> list[RequestOutput]:
        return [o for o in (self.fail(rid, error) for rid in list(self.states)) if o is not None]

    def _make_output(self, st: RequestState) -> RequestOutput:
        comps = []
        for ss in st.seqs:
            comps.append(CompletionOutput(
                index=ss.index, text=ss.text(), token_ids=list(ss.token_ids),
                cumulative_logprob=ss.cumulative_logprob if ss.logprobs is not None else None,
                logprobs=list(ss.logprobs) if ss.logprobs is not None else None,
                sampled_ranks=list(ss.sampled_ranks) if ss.logprobs is not None else None,
                finish_reason=ss.finish_reason, stop_reason=ss.stop_reason))
        m = st.metrics
        m.num_preemptions = sum(ss.num_preemptions for ss in st.seqs)
        times = [ss.first_scheduled_time for ss in st.seqs if ss.first_scheduled_time is not None]
        m.first_scheduled_time = min(times) if times else None
        times = [ss.first_token_time for ss in st.seqs if ss.first_token_time is not None]
        m.first_token_time = min(times) if times else None
        times = [ss.last_token_time for ss in st.seqs if ss.last_token_time is not None]
        m.last_token_time = max(times) if times else None
        finished = st.finished
        if finished:
            times = [ss.finished_time for ss in st.seqs if ss.finished_time is not None]
            m.finished_time = max(times) if times else time.monotonic()
        return RequestOutput(request_id=st.request_id, prompt=st.prompt, prompt_token_ids=st.prompt_token_ids,
                             outputs=comps, finished=finished, metrics=m, num_cached_tokens=st.num_cached_tokens,
                             error=st.error if finished else None, prompt_logprobs=st.prompt_logprobs,
                             prompt_token_ranks=st.prompt_token_ranks)
