"""`OpenAIModelAdapter`: one streamed completion of an OpenAI-compatible model, no tools.

It runs through loopd's own model seam (`loopd.harness.models`, normally `OpenAICompatibleModel`), so retries,
usage, pricing and provider errors behave as in the harness. Text deltas become previews; at the end come
`ModelCalled` (usage and cost), one `TextSet` with the whole answer and `Finished`.

**Resume is a re-run.** A completion is a read effect (idempotency inherent) and no provider lets a client
reattach to a stream, so ``resume`` simply runs the completion again (``replays`` is false: every update of
the new run is applied after the stored checkpoint). Its previews say where they go in the answer, so text
the lost run showed already is not shown twice; where the new completion says something else, the answer
block is rewritten once (a ``set``). The ledger shows both model calls (the lost one closed as interrupted),
which is what was paid for.

Errors: a permanent provider error fails the call; a retryable one (after the model's own retries) is
`ObservationLost`, so the engine re-runs the completion later, within the call's deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from loopd.harness import Message, ModelPermanentError, ModelRetryableError
from loopd.harness.core import Usage as HarnessUsage
from loopd.harness.models import (
    Model,
    ModelConfig,
    ModelRequest,
    ProviderModel,
    RecordingModel,
    TextDelta,
    UsageReport,
    build_model,
)
from loopd.server.ledger import EffectKind, Idempotency

from ._adapter import AdapterRequest, Failed, Finished, GateAnswer, ModelCalled, TextPreview, TextSet, Update
from ._errors import ObservationLost
from ._prompts import PromptRecording


class OpenAIRun:
    def __init__(self, adapter: OpenAIModelAdapter, request: AdapterRequest) -> None:
        self._adapter = adapter
        self._request = request
        self._cancelled = asyncio.Event()

    @property
    def execution_ref(self) -> str | None:
        return None

    @property
    def replays(self) -> bool:
        return False

    async def updates(self) -> AsyncIterator[Update]:
        adapter = self._adapter
        request = ModelRequest(
            model=adapter.model_name,
            messages=(Message(role="user", content=self._request.prompt()),),
            system=adapter.system_prompt,
            max_output_tokens=adapter.max_output_tokens,
        )
        text: list[str] = []
        shown = 0
        usage = HarnessUsage()
        log = adapter.prompts.log() if adapter.prompts is not None else None
        model = RecordingModel(adapter.model, log=log) if log is not None else adapter.model
        try:
            async for chunk in model.stream(request):
                if self._cancelled.is_set():
                    yield Failed("cancelled", "the completion was cancelled", phase="cancelled")
                    return
                match chunk:
                    case TextDelta(text=piece):
                        yield TextPreview(piece, offset=shown)
                        text.append(piece)
                        shown += len(piece)
                    case UsageReport(usage=reported):
                        usage = usage + reported
                    case _:
                        pass  # no tools are offered, so tool-call fragments carry nothing to show
        except ModelRetryableError as exc:
            raise ObservationLost(f"the model is unavailable: {exc}") from exc
        except ModelPermanentError as exc:
            yield Failed("model_error", str(exc))
            return
        answer = "".join(text)
        yield ModelCalled(
            model=adapter.model_name,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost_usd=usage.cost_usd,
            recorded=log.take(usage.input_tokens, usage.output_tokens) if log is not None else None,
        )
        yield TextSet(answer)
        yield Finished(answer)

    async def answer_gate(self, gate_id: str, answer: GateAnswer) -> None:
        return None  # a bare completion opens no gates

    async def cancel(self) -> None:
        self._cancelled.set()

    async def aclose(self) -> None:
        return None


class OpenAIModelAdapter:
    """A plain model as a harness target. Build it over a `Model`, or with `from_config` (then `aclose` it)."""

    def __init__(
        self,
        model: Model,
        *,
        model_name: str | None = None,
        system_prompt: str | None = None,
        max_output_tokens: int | None = None,
        owned: ProviderModel | None = None,
        prompts: PromptRecording | None = None,
    ) -> None:
        self.model = model
        self.prompts = prompts
        """Record each completion's full request and reply for the ledger (None: usage only)."""
        self.model_name = model_name or model.name
        self.system_prompt = system_prompt
        self.max_output_tokens = max_output_tokens
        self._owned = owned

    @classmethod
    def from_config(
        cls, config: ModelConfig, *, demo_base_url: str | None = None, system_prompt: str | None = None
    ) -> OpenAIModelAdapter:
        """An adapter over a new model for ``config`` (any provider or chain; closed by `aclose`)."""
        model = build_model(config, demo_base_url=demo_base_url)
        return cls(model, model_name=config.model, system_prompt=system_prompt, owned=model)

    @property
    def supports_resume(self) -> bool:
        return True

    @property
    def effect(self) -> tuple[EffectKind, Idempotency]:
        return EffectKind.READ, Idempotency.INHERENT

    async def start(self, request: AdapterRequest) -> OpenAIRun:
        return OpenAIRun(self, request)

    async def resume(self, request: AdapterRequest, execution_ref: str | None) -> OpenAIRun:
        return OpenAIRun(self, request)

    async def aclose(self) -> None:
        if self._owned is not None:
            await self._owned.aclose()
