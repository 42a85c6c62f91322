"""Human routes: ask (responders), read a question, reply (the asking user)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Any, Final, Literal, Self

from fastapi import APIRouter, Depends, Query, Response
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field, model_validator

from loopd.server.chat import MessageBody, message_body
from loopd.server.http import ERROR_RESPONSES, Identity, current_identity, trusted_identity
from loopd.server.human._service import MAX_ANSWER, HumanService, Question, ReplyResult

MAX_KEY: Final = 200
MAX_WAIT: Final = 60.0
DEFAULT_WAIT: Final = 30.0
Id = Annotated[str, PathParam(min_length=1, max_length=MAX_KEY)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChoiceBody(_Request):
    value: str = Field(min_length=1, max_length=MAX_KEY)
    label: str = Field(min_length=1, max_length=500)
    description: str | None = Field(default=None, max_length=2000)


class AskRequest(_Request):
    """An Ask (``choices`` and/or ``allow_other`` free text) or a Confirm (accept / decline under custom labels)."""

    effect_key: str = Field(min_length=1, max_length=MAX_KEY, description="Same key + same parameters = same question.")
    type: Literal["ask", "confirm"]
    title: str = Field(min_length=1, max_length=500)
    prompt: str = Field(min_length=1, max_length=20_000)
    timeout_seconds: float = Field(
        gt=0, allow_inf_nan=False, description="Required; finite; the server's maximum applies."
    )
    choices: list[ChoiceBody] | None = Field(default=None, max_length=100)
    allow_other: bool = False
    confirm_label: str | None = Field(default=None, min_length=1, max_length=200)
    decline_label: str | None = Field(default=None, min_length=1, max_length=200)

    @model_validator(mode="after")
    def _shape(self) -> Self:
        if self.type == "confirm" and (self.choices is not None or self.allow_other):
            raise ValueError("a confirm takes neither choices nor allow_other")
        if self.type == "ask" and (self.confirm_label is not None or self.decline_label is not None):
            raise ValueError("confirm_label and decline_label belong to a confirm")
        if self.type == "ask" and self.choices is None and not self.allow_other:
            raise ValueError("an ask needs choices, allow_other, or both")
        return self


class ReplyRequest(_Request):
    reply_to_message_id: str = Field(min_length=1, max_length=MAX_KEY)
    outcome: Literal["success", "dismissed"]
    value: str | None = Field(default=None, min_length=1, max_length=MAX_ANSWER)


class QuestionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message_id: str
    task_id: str
    conversation_id: str
    effect_key: str
    type: Literal["ask", "confirm"]
    title: str
    prompt: str
    choices: list[dict[str, Any]]
    allow_other: bool
    confirm_label: str | None
    decline_label: str | None
    timeout_seconds: float
    due_at: datetime
    status: Literal["pending", "success", "dismissed", "timeout", "failure"]
    value: Any = None
    reason: str | None = None
    created: bool
    message: MessageBody


class ReplyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: Literal["pending", "success", "dismissed", "timeout", "failure"]
    value: Any = None
    accepted: bool = Field(description="False when this repeated the reply already stored.")
    message: MessageBody
    reply: MessageBody | None


def question_body(question: Question) -> QuestionBody:
    request = question.request
    return QuestionBody(
        message_id=request.message_id,
        task_id=request.task_id,
        conversation_id=request.conversation_id,
        effect_key=request.effect_key,
        type=request.type,
        title=request.title,
        prompt=request.prompt,
        choices=[dict(choice) for choice in request.choices],
        allow_other=request.allow_other,
        confirm_label=request.confirm_label,
        decline_label=request.decline_label,
        timeout_seconds=request.timeout_seconds,
        due_at=request.due_at,
        status=request.outcome,
        value=request.value,
        reason=request.reason,
        created=question.created,
        message=message_body(question.message),
    )


def reply_body(result: ReplyResult) -> ReplyBody:
    return ReplyBody(
        status=result.request.outcome,
        value=result.request.value,
        accepted=result.accepted,
        message=message_body(result.message),
        reply=None if result.reply is None else message_body(result.reply),
    )


def human_router(human: HumanService, *, stopping: asyncio.Event | None = None) -> APIRouter:
    """Ask, read, wait for and reply to Human questions; ``stopping`` (the server's shutdown signal) ends waits."""
    router = APIRouter(responses=ERROR_RESPONSES, tags=["human"])

    @router.post("/v1/tasks/{task_id}/human", status_code=201)
    async def ask(
        task_id: Id,
        body: AskRequest,
        response: Response,
        caller: Annotated[Identity, Depends(trusted_identity)],
    ) -> QuestionBody:
        """Ask the user who asked the Task (201; 200 with the original question when the effect key and the
        parameters repeat; 409 when they differ)."""
        question = await human.ask(
            task_id,
            effect_key=body.effect_key,
            type=body.type,
            title=body.title,
            prompt=body.prompt,
            timeout_seconds=body.timeout_seconds,
            choices=None if body.choices is None else [c.model_dump(exclude_none=True) for c in body.choices],
            allow_other=body.allow_other,
            confirm_label=body.confirm_label,
            decline_label=body.decline_label,
            actor=caller,
        )
        response.status_code = 201 if question.created else 200
        return question_body(question)

    @router.get("/v1/human/{message_id}")
    async def get_question(message_id: Id, caller: Annotated[Identity, Depends(current_identity)]) -> QuestionBody:
        """A question and its state (``pending`` or its one outcome)."""
        return question_body(await human.get(message_id, reader=caller))

    @router.get("/v1/human/{message_id}/wait")
    async def wait_question(
        message_id: Id,
        caller: Annotated[Identity, Depends(current_identity)],
        timeout: Annotated[
            float, Query(gt=0, le=MAX_WAIT, allow_inf_nan=False, description="Seconds to wait at most.")
        ] = DEFAULT_WAIT,
    ) -> QuestionBody:
        """The question as soon as its outcome is not ``pending``, or as it is when ``timeout`` passes (or the
        server stops): loop while ``status`` is ``pending``."""
        return question_body(await human.wait(message_id, timeout, reader=caller, stop=stopping))

    @router.post("/v1/conversations/{conversation_id}/tasks/{task_id}/replies")
    async def reply(
        conversation_id: Id,
        task_id: Id,
        body: ReplyRequest,
        caller: Annotated[Identity, Depends(current_identity)],
    ) -> ReplyBody:
        """Answer a question: ``success`` with a value (a declared choice, free text when allowed, or
        ``accepted`` / ``declined`` for a confirm) or ``dismissed``. Only the user who asked the Task, once."""
        result = await human.reply(
            caller,
            conversation_id,
            task_id,
            reply_to_message_id=body.reply_to_message_id,
            outcome=body.outcome,
            value=body.value,
        )
        return reply_body(result)

    return router
