"""Run one harness call: render, route, stream, parse tool calls, record (shell).

`Calls.start` turns a parsed request into a `CallRun`; the HTTP handler iterates its text deltas
and then reads its `outcome`. Whatever way the call ends (finished, harness gone, token revoked,
engine failure) the tokens generated so far are recorded once, as `LlmCallRecorded`. The last
text delta is yielded only once that record is committed, so the harness never holds an answer
the proxy could still lose; `close` ends an execution and returns once every record of it is.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from gyre.engine.v1 import engine_pb2
from gyre.errors import GyreError, InvalidArgument, Unavailable
from gyre.ids import new_uuid7
from gyre.proxy.v1 import proxy_pb2
from services.proxy.agents import Agent, detect
from services.proxy.auth import Unauthenticated
from services.proxy.call_keys import CallKey, ReplayedRun, StoredAnswer, answer_to_json, call_key, replayable
from services.proxy.chat import ChatMessage, ChatRequest
from services.proxy.delta import CallHistory
from services.proxy.detok import IncrementalText
from services.proxy.generation import FR, Generation
from services.proxy.model import ServedModel
from services.proxy.outcome import CallOutcome, Finish, Usage
from services.proxy.recorder import Recorder
from services.proxy.render import (
    OutputMemory,
    RenderedPrompt,
    ReusableOutput,
    quoted,
    render_prompt,
    reusable_output,
)
from services.proxy.render_workers import RenderWorkers, T
from services.proxy.request_size import SizeBound, check_size
from services.proxy.router import Router
from services.proxy.toolcalls import parse_output, visible_prefix

log = structlog.get_logger(__name__)

FINISH_TO_RECORD: dict[int, proxy_pb2.CallFinishReason.ValueType] = {
    FR.FINISH_REASON_STOP: proxy_pb2.CALL_FINISH_REASON_STOP,
    FR.FINISH_REASON_LENGTH: proxy_pb2.CALL_FINISH_REASON_LENGTH,
    FR.FINISH_REASON_CONTEXT_LENGTH: proxy_pb2.CALL_FINISH_REASON_CONTEXT_LENGTH,
}
CLOSED_KEPT = 100_000
ROLE_TO_RECORD = {
    "main": proxy_pb2.AGENT_ROLE_MAIN,
    "sub": proxy_pb2.AGENT_ROLE_SUB,
    "summary": proxy_pb2.AGENT_ROLE_SUMMARY,
}


@dataclass(slots=True)
class ExecutionState:
    """What the proxy remembers of one execution between its calls."""

    memory: OutputMemory = field(default_factory=OutputMemory)
    history: CallHistory = field(default_factory=CallHistory)
    runs: set[CallRun] = field(default_factory=set)
    unrecorded: set[asyncio.Future[bool]] = field(default_factory=set)
    """Records of finished calls not yet committed."""
    answers: dict[str, StoredAnswer] = field(default_factory=dict)
    """Recorded calls' answers by call key, for the harness's retries (`call_keys`)."""


class CallRun:
    """One call in flight. Iterate `text_deltas()`, then read `outcome`."""

    def __init__(
        self,
        calls: Calls,
        *,
        execution_id: str,
        request: ChatRequest,
        agent: Agent,
        generation: Generation,
        prompt_text: str,
        key: CallKey,
    ) -> None:
        self.calls = calls
        self.key = key
        self.execution_id = execution_id
        self.request = request
        self.agent = agent
        self.generation = generation
        self.prompt_text = prompt_text
        self.started_at = datetime.now(UTC)
        self.outcome: CallOutcome | None = None
        self.cancelled = False
        self.ended = asyncio.Event()
        self.durable: asyncio.Future[bool] | None = None
        self._recorded = False

    @property
    def call_id(self) -> str:
        return self.generation.call_id

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.generation.prompt_ids)

    @property
    def created_s(self) -> int:
        return int(self.started_at.timestamp())

    async def text_deltas(self) -> AsyncIterator[str]:
        """Visible text as it is generated; tool-call markup is held back for the outcome."""
        model = self.calls.model
        stream = IncrementalText(lambda ids: model.tokenizer.decode(ids, skip_special_tokens=False))
        sent = 0
        try:
            async for new_ids in self.generation.tokens():
                if self.cancelled:
                    break
                if not stream.push(new_ids):
                    continue
                text = visible_prefix(model.strip_stops(stream.text), model.tool_format)
                if len(text) > sent:
                    yield text[sent:]
                    sent = len(text)
        finally:
            if not self.generation.done or self.cancelled:
                self.cancelled = True
                await self.generation.cancel()
            self._finish()
        assert self.outcome is not None and self.durable is not None
        if not await self.durable:
            raise Unavailable("the call could not be recorded (the proxy's database is away): retry it")
        if len(self.outcome.text) > sent and not self.outcome.tool_calls:
            yield self.outcome.text[sent:]

    async def run_to_end(self) -> CallOutcome:
        async for _ in self.text_deltas():
            pass
        assert self.outcome is not None
        return self.outcome

    def cancel(self) -> None:
        self.cancelled = True

    def _finish(self) -> None:
        """Build the outcome and hand the record to the recorder, exactly once."""
        if self._recorded:
            return
        self._recorded = True
        gen, model = self.generation, self.calls.model
        parsed = parse_output(
            model.visible_text(gen.output_ids),
            fmt=model.tool_format,
            call_ids=[model.tool_call_id(self.call_id, i) for i in range(8)],
        )
        # A generation that did not end with the engine's own finish was cut: by the harness, or by
        # a failure the harness gets as an error (an engine refusing or lost). Neither is an answer
        # a retry should be given: recorded "stop", a failed call's empty output would answer the
        # harness's retry of it with an empty completion.
        if gen.finish in (FR.FINISH_REASON_UNSPECIFIED, FR.FINISH_REASON_PAUSED):
            finish: Finish = "cancelled"
        elif gen.finish in (FR.FINISH_REASON_LENGTH, FR.FINISH_REASON_CONTEXT_LENGTH):
            finish = "length"
        else:
            finish = "tool_calls" if parsed.tool_calls else "stop"
        self.outcome = CallOutcome(
            text=parsed.text,
            tool_calls=parsed.tool_calls,
            finish=finish,
            usage=Usage(
                prompt_tokens=len(gen.prompt_ids),
                output_tokens=len(gen.output_ids),
                cached_prompt_tokens=gen.num_cached_prompt_tokens,
            ),
        )
        self.durable = self.calls.finished(self)
        self.ended.set()


class Calls:
    """Per-execution memory, the in-flight registry and the path of one call."""

    def __init__(
        self,
        *,
        model: ServedModel | None,
        router: Router,
        recorder: Recorder,
        load_outputs: Callable[[str], Awaitable[list[ReusableOutput]]] | None = None,
        load_answers: Callable[[str], Awaitable[list[StoredAnswer]]] | None = None,
        load_model: Callable[[], ServedModel | None] | None = None,
        engine_stall_s: float = 0.0,
        renders_per_execution: int = 1,
        refusal_wait_max_s: float = 1.0,
    ) -> None:
        self._model = model
        self._load_model = load_model
        self._model_tried_s = time.monotonic()
        self._load_outputs = load_outputs
        self._load_answers = load_answers
        self.router = router
        self.recorder = recorder
        self.engine_stall_s = engine_stall_s
        """A call's engine silent this long counts as failed (`Generation.stall_s`)."""
        self.workers = RenderWorkers(
            per_execution=renders_per_execution, refusal_wait_max_s=refusal_wait_max_s
        )
        self.executions: dict[str, ExecutionState] = {}
        self.in_flight: dict[str, CallRun] = {}
        self.closed: OrderedDict[str, None] = OrderedDict()
        """Executions whose token was revoked through this process (the newest CLOSED_KEPT)."""

    @property
    def model(self) -> ServedModel:
        # The local stack starts the proxy and the engine together and the engine may still be
        # writing the model folder: look again, at most every few seconds, until it is there.
        if self._model is None and self._load_model and time.monotonic() - self._model_tried_s > 5:
            self._model_tried_s = time.monotonic()
            self._model = self._load_model()
        if self._model is None:
            raise Unavailable(
                "the proxy has no model: its model folder holds no tokenizer (gyre model init DIR)"
            )
        return self._model

    @property
    def size_bound(self) -> SizeBound:
        model = self.model
        return SizeBound(
            context_window_tokens=model.context_window_tokens, max_token_chars=model.max_token_chars
        )

    def cpu_slot(self, execution_id: str, *, accepts: bool = False) -> AbstractAsyncContextManager[None]:
        return self.workers.slot(execution_id, accepts=accepts)

    async def off_loop(self, execution_id: str, fn: Callable[..., T], *args: Any) -> T:
        return await self.workers.run(execution_id, fn, *args)

    def shutdown(self) -> None:
        self.workers.shutdown()

    def state(self, execution_id: str) -> ExecutionState:
        return self.executions.setdefault(execution_id, ExecutionState())

    async def load_state(self, execution_id: str) -> ExecutionState:
        """The execution's state; after a proxy restart its reusable outputs come from Postgres."""
        state = self.executions.get(execution_id)
        if state is None:
            state = ExecutionState()
            if self._load_outputs is not None:
                for item in await self._load_outputs(execution_id):
                    state.memory.remember(item)
            if self._load_answers is not None:
                state.answers = {a.key.value: a for a in await self._load_answers(execution_id)}
            state = self.executions.setdefault(execution_id, state)
        return state

    async def render(self, execution_id: str, request: ChatRequest) -> RenderedPrompt:
        """The prompt's ids, tokenised off the event loop (a long prompt takes seconds, and every
        other harness's stream would stall meanwhile), at most `renders_per_execution` of one
        execution at a time. A request whose parts (messages, system text, tools) need more
        tokens than the context window holds is refused before any rendering (`request_size`)."""
        model = self.model
        memory = (await self.load_state(execution_id)).memory.snapshot()
        async with self.cpu_slot(execution_id, accepts=True):
            return await self.off_loop(execution_id, self._render, model, request, memory)

    @staticmethod
    def _render(model: ServedModel, request: ChatRequest, memory: OutputMemory) -> RenderedPrompt:
        bound = SizeBound(
            context_window_tokens=model.context_window_tokens, max_token_chars=model.max_token_chars
        )
        check_size(request, bound)
        try:
            return render_prompt(
                model.tokenizer, request, memory, context_window_tokens=model.context_window_tokens
            )
        except GyreError:
            raise
        except Exception as exc:  # the harness's text: its failure is a refusal, not the proxy's
            log.warning("render_refused", error=type(exc).__name__, exc_info=True)
            raise InvalidArgument(
                "messages", f"could not be rendered into tokens: {type(exc).__name__}: {quoted(exc)}"
            ) from exc

    async def start(
        self,
        *,
        execution_id: str,
        request: ChatRequest,
        headers: Mapping[str, str],
        min_policy_version: int = 0,
    ) -> CallRun | ReplayedRun:
        """A new call, or the recorded answer when this is a retry of a recorded one. The call
        waits (`Router.pick`) until an engine holds weights of `min_policy_version` or newer."""
        if execution_id in self.closed:  # revoked while this request was being authenticated
            raise Unauthenticated("revoked credential: the execution's token was revoked")
        agent = detect(
            system=request.system_text,
            first_user=request.first_user_text,
            last_user=request.last_user_text,
            headers=headers,
        )
        key = call_key(headers, request, agent)
        state = await self.load_state(execution_id)
        if key.explicit:  # the same key while the first attempt still runs: wait for its answer
            first = next((r for r in state.runs if r.key == key and not r.ended.is_set()), None)
            if first is not None:
                await first.ended.wait()
                if first.durable is not None:
                    await asyncio.wait([first.durable])
        stored = state.answers.get(key.value)
        if stored is not None and replayable(stored):
            log.info("call_answered_from_record", call_id=stored.call_id, explicit_key=key.explicit)
            return ReplayedRun(execution_id, stored)
        prompt = await self.render(execution_id, request)
        state.memory.remember_prompt(prompt)
        room = self.model.context_window_tokens - len(prompt.ids)
        max_tokens = min(request.sampling.max_tokens or room, room)
        sampling = engine_pb2.SamplingParams(
            temperature=request.sampling.temperature,
            top_p=request.sampling.top_p,
            max_tokens=max_tokens,
        )
        if request.sampling.seed is not None:
            sampling.seed = request.sampling.seed
        call_id = new_uuid7()
        route = await self.router.pick(execution_id, min_version=min_policy_version)
        if execution_id in self.closed:  # revoked while the call waited for an engine
            raise Unauthenticated("revoked credential: the execution's token was revoked")
        generation = Generation(
            call_id=call_id,
            execution_id=execution_id,
            prompt_ids=prompt.ids,
            sampling=sampling,
            route=route,
            pool=self.router.pool,
            on_move=self.router.moved,
            on_version=self.router.observed_version,
            on_broken=lambda broken: self.router.failover(
                execution_id, broken, min_version=min_policy_version
            ),
            on_behind=self.router.version_unknown,
            min_version=min_policy_version,
            stall_s=self.engine_stall_s,
        )
        run = CallRun(
            self,
            execution_id=execution_id,
            request=request,
            agent=agent,
            generation=generation,
            prompt_text=prompt.text,
            key=key,
        )
        self.in_flight[call_id] = run
        state.runs.add(run)
        self.router.call_started(route.engine_id)
        return run

    def finished(self, run: CallRun) -> asyncio.Future[bool]:
        """Remember the output for later prompts, encode the prompt as a delta, queue the record."""
        self.in_flight.pop(run.call_id, None)
        self.router.call_finished(run.generation.route.engine_id)
        # A closed execution's state is gone: its last records need no memory kept for later calls.
        state = self.executions.get(run.execution_id) or ExecutionState()
        state.runs.discard(run)
        gen = run.generation
        assert run.outcome is not None
        item = None
        if run.outcome.finish != "cancelled" and gen.output_ids:
            returned = ChatMessage(
                role="assistant", content=run.outcome.text, tool_calls=run.outcome.tool_calls
            )
            stopped = gen.finish == FR.FINISH_REASON_STOP
            try:
                item = reusable_output(
                    self.model.tokenizer,
                    run.request,
                    prompt_text=run.prompt_text,
                    returned=returned,
                    output_ids=gen.output_ids,
                    stop_texts=self.model.stop_texts if stopped else (),
                )
            except Exception:  # the template refusing its own turn must not lose the record
                log.exception("reusable_output_failed", call_id=run.call_id)
                item = None
            if item is not None:
                state.memory.remember(item)
        delta = state.history.encode(gen.prompt_ids)
        state.history.add(run.call_id, gen.prompt_ids, gen.output_ids)
        record = proxy_pb2.CallRecord(
            execution_id=run.execution_id,
            call_id=run.call_id,
            agent_role=ROLE_TO_RECORD[run.agent.role],
            agent_id=run.agent.agent_id,
            output_ids=gen.output_ids,
            output_logprobs=gen.logprobs,
            engine_id=gen.route.engine_id,
            num_migrations=gen.num_migrations,
            finish_reason=(
                proxy_pb2.CALL_FINISH_REASON_CANCELLED
                if run.outcome.finish == "cancelled"
                else FINISH_TO_RECORD.get(gen.finish, proxy_pb2.CALL_FINISH_REASON_CANCELLED)
            ),
        )
        if delta.parent_call_id:
            record.prompt_delta.parent_call_id = delta.parent_call_id
            record.prompt_delta.num_shared_tokens = delta.num_shared_tokens
            record.prompt_delta.new_ids.extend(delta.new_ids)
        else:
            record.full_prompt.prompt_ids.extend(gen.prompt_ids)
        versions = gen.versions or [gen.route.policy_version]
        record.policy_version.steps = min(versions)
        if len(set(versions)) > 1:
            record.output_policy_versions.extend(versions)
        record.started_at.FromDatetime(run.started_at)
        record.finished_at.FromDatetime(datetime.now(UTC))
        answer = None
        if run.outcome.finish != "cancelled":  # a cut call is not an answer a retry should get
            answer = (run.key.value, answer_to_json(run.call_id, run.outcome, created_s=run.created_s))
        durable = self.recorder.record(record, item, answer)
        state.unrecorded.add(durable)
        durable.add_done_callback(state.unrecorded.discard)
        if answer is not None:
            stored = StoredAnswer(
                key=run.key, call_id=run.call_id, outcome=run.outcome, created_s=run.created_s
            )
            durable.add_done_callback(
                lambda f: (
                    None
                    if f.cancelled() or not f.result()
                    else state.answers.__setitem__(run.key.value, stored)
                )
            )
        return durable

    def delivered(self, run: CallRun | ReplayedRun) -> None:
        """The harness received the whole answer: a derived key's repeat is a new call from now on."""
        state = self.executions.get(run.execution_id)
        stored = state.answers.get(run.key.value) if state else None
        if stored is not None and stored.call_id == run.call_id and not stored.delivered:
            stored.delivered = True
            self.recorder.mark_delivered(run.execution_id, run.key.value)

    def forget_lost(self, records: Sequence[proxy_pb2.CallRecord]) -> None:
        """Records that never became durable must not be named as delta parents later."""
        for record in records:
            state = self.executions.get(record.execution_id)
            if state is not None:
                state.history.contexts.pop(record.call_id, None)

    async def close(self, execution_id: str, *, cancel_in_flight: bool, wait_s: float = 10.0) -> int:
        """End an execution: refuse its new calls, let its running ones end (cut them short with
        `cancel_in_flight`, or after `wait_s`), and return once every record of it is committed
        or lost. Returns the number of calls cut short."""
        self.closed[execution_id] = None
        while len(self.closed) > CLOSED_KEPT:
            self.closed.popitem(last=False)
        state = self.executions.pop(execution_id, None)
        self.workers.forget(execution_id)
        self.router.forget(execution_id)
        if state is None:
            return 0
        runs = list(state.runs)
        if runs and not cancel_in_flight:
            await asyncio.wait([asyncio.ensure_future(r.ended.wait()) for r in runs], timeout=wait_s)
        cut = [r for r in runs if not r.ended.is_set()]
        for run in cut:
            run.cancel()
            await run.generation.cancel()
        if cut:
            await asyncio.wait([asyncio.ensure_future(r.ended.wait()) for r in cut], timeout=wait_s)
        pending = [r.durable for r in runs if r.durable is not None] + list(state.unrecorded)
        if pending:
            await asyncio.wait(set(pending), timeout=self.recorder.give_up_after_s + wait_s)
        return len(cut)
