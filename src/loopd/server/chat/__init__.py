"""The chat flow of loop-server: conversations, chat requests and their Tasks, the conversation stream, completion.

Public face, one class per kind of caller: `ConversationReader` (what a user may read: conversations, messages,
snapshot, a Task's work conversation, the event log and its cursors; it owns the streams' `ConversationFeeds` and
the shutdown flag that ends them), `ChatRequests` (what a user changes: new conversations, chat requests with their
Task, observing one), `TaskApi` (what a Task's responder calls: context, events, outputs, completion).
Around them: `TaskGateway` / `ResourceTaskGateway` (the Task resource seam), `chat_router` / `task_router` (the
HTTP routes), `Sweeper` (background ticks), the records the services return, and the helpers for Human question
blocks shared with ``loopd.server.human``.
Must not do: write message content except through ``loopd.server.streams``; no class here reads another's state
except through its public methods.
"""

from loopd.server.chat._answers import OpenAnswers
from loopd.server.chat._feeds import ConversationFeeds, FeedStatistics, Subscription
from loopd.server.chat._forks import ConversationForks, Forked, fork_router
from loopd.server.chat._gateway import DEFAULT_NAMESPACE, ResourceTaskGateway, TaskGateway, TaskUnavailable
from loopd.server.chat._questions import MESSAGE_STATUS_OF, QUESTION_BLOCK_ID, question_block, resolve_question
from loopd.server.chat._reader import ConversationReader
from loopd.server.chat._records import ChatRequest, Emitted, Snapshot, StreamItem, StreamPage, TaskContext
from loopd.server.chat._requests import ChatRequests, TargetDirectory, text_content
from loopd.server.chat._routes import TASK_ID_HEADER, chat_router, parse_cursor, task_router
from loopd.server.chat._stream import conversation_frames
from loopd.server.chat._sweeper import Sweeper
from loopd.server.chat._tasks import TaskApi, check_responder
from loopd.server.chat._titles import ConversationTitles, demo_title_reply
from loopd.server.chat._window import QuestionWindow
from loopd.server.chat._wire import ConversationBody, MessageBody, conversation_body, message_body, message_header

__all__ = [
    "DEFAULT_NAMESPACE",
    "MESSAGE_STATUS_OF",
    "QUESTION_BLOCK_ID",
    "TASK_ID_HEADER",
    "ChatRequest",
    "ChatRequests",
    "ConversationBody",
    "ConversationFeeds",
    "ConversationForks",
    "ConversationReader",
    "ConversationTitles",
    "Emitted",
    "FeedStatistics",
    "Forked",
    "MessageBody",
    "OpenAnswers",
    "QuestionWindow",
    "ResourceTaskGateway",
    "Snapshot",
    "StreamItem",
    "StreamPage",
    "Subscription",
    "Sweeper",
    "TargetDirectory",
    "TaskApi",
    "TaskContext",
    "TaskGateway",
    "TaskUnavailable",
    "chat_router",
    "check_responder",
    "conversation_body",
    "conversation_frames",
    "demo_title_reply",
    "fork_router",
    "message_body",
    "message_header",
    "parse_cursor",
    "question_block",
    "resolve_question",
    "task_router",
    "text_content",
]
