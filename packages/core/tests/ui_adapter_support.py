"""A chat app on Pydantic AI's UI adapters with a ``conversation_store``, and its scenarios.

Shared by ``test_ui_adapters.py`` (SQLite, ``memory://`` and Pydantic AI's own in-memory
store as the reference) and the Redis package's ``test_redis_ui_adapters.py``, which loads
this file by path (a uniquely named module: test folders are not packages).

The app is what a chat product writes: a Starlette app that opens the store in its
lifespan, a ``POST /chat`` route handing the request to ``VercelAIAdapter`` (or
``/ag-ui`` to ``AGUIAdapter``) with ``conversation_store=`` the store and
``conversation_scope=`` the signed-in user, and a ``GET /chats/{id}`` route a client
reloads the conversation from. The client is Starlette's ``TestClient`` playing
``useChat``: it sends the conversation as the server dumped it plus its new message,
``regenerate-message`` for a regenerate, and the tool part with its approval for an
approval. The agent is a real ``Agent`` on a ``FunctionModel`` (no API key).
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio.to_thread
from pydantic_ai import Agent
from pydantic_ai.conversation_store import ConversationRecord, ConversationStore
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.tools import DeferredToolRequests
from pydantic_ai.ui.ag_ui import AGUIAdapter
from pydantic_ai.ui.vercel_ai import VercelAIAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

T = TypeVar("T")

#: Opens the store the app serves: ``async with open_store() as store``.
StoreOpener = Callable[[], AbstractAsyncContextManager[ConversationStore]]

#: What Pydantic AI's adapters end a stream with when a save met a newer revision.
RELOAD = "Reload the conversation from the server and try again."
SAVED = "data-conversation-saved"


# --- the agent ---------------------------------------------------------------------------


@dataclass
class Scripted:
    """The model's script: answers numbered per call (so a regenerate is told apart from
    the answer it replaces), a ``delete_file`` call needing approval when asked to delete,
    and, for a prompt with "slow", a wait on ``gate`` (the stale-save scenario)."""

    calls: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    gate: threading.Event = field(default_factory=threading.Event)
    waiting: threading.Event = field(default_factory=threading.Event)
    deleted: list[str] = field(default_factory=list)

    async def stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        returns = [p for p in last.parts if isinstance(p, ToolReturnPart)]
        if returns:
            yield f"Done: {returns[0].content}"
            return
        prompt = next(str(p.content) for p in last.parts if isinstance(p, UserPromptPart))
        if "delete" in prompt:
            yield {
                0: DeltaToolCall(
                    name="delete_file", json_args='{"path": "notes.txt"}', tool_call_id="call-del"
                )
            }
            return
        if "slow" in prompt:
            self.waiting.set()
            await anyio.to_thread.run_sync(self.gate.wait, 30)
        yield f"answer {next(self.calls)} to {prompt!r}"


def scripted_agent(script: Scripted) -> Agent[None, str | DeferredToolRequests]:
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(stream_function=script.stream),
        output_type=[str, DeferredToolRequests],
    )

    @agent.tool_plain(requires_approval=True)
    def delete_file(path: str) -> str:
        """Delete a file (asks the user first)."""
        script.deleted.append(path)
        return f"deleted {path}"

    return agent


# --- the app -----------------------------------------------------------------------------


def chat_app(open_store: StoreOpener, agent: Agent[None, Any]) -> Starlette:
    """The chat app: the store opened for the app's lifetime, the user from a header
    (standing in for the app's authentication)."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with open_store() as store:
            app.state.store = store
            yield

    def user(request: Request) -> str:
        return request.headers["x-user"]

    async def vercel(request: Request) -> Response:
        return await VercelAIAdapter.dispatch_request(
            request,
            agent=agent,
            sdk_version=6,
            conversation_store=request.app.state.store,
            conversation_scope=user(request),
        )

    async def ag_ui(request: Request) -> Response:
        return await AGUIAdapter.dispatch_request(
            request,
            agent=agent,
            conversation_store=request.app.state.store,
            conversation_scope=user(request),
        )

    async def reload(request: Request) -> Response:
        store: ConversationStore = request.app.state.store
        chat_id = request.path_params["chat_id"]
        conversation = await store.load(chat_id, scope=user(request))
        if conversation is None:
            return JSONResponse({"detail": "Conversation not found."}, status_code=404)
        messages = VercelAIAdapter.dump_messages(conversation.messages, sdk_version=6)
        return JSONResponse([m.model_dump(mode="json", by_alias=True) for m in messages])

    return Starlette(
        routes=[
            Route("/chat", vercel, methods=["POST"]),
            Route("/ag-ui", ag_ui, methods=["POST"]),
            Route("/chats/{chat_id}", reload, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


# --- the Vercel AI client ----------------------------------------------------------------


def chunks(body: str) -> list[dict[str, Any]]:
    """The data stream's chunks (``data: {...}`` lines; ``[DONE]`` left out)."""
    out: list[dict[str, Any]] = []
    for line in body.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[len("data: ") :]))
    return out


def text_of(stream: list[dict[str, Any]]) -> str:
    return "".join(c["delta"] for c in stream if c["type"] == "text-delta")


def errors_of(stream: list[dict[str, Any]]) -> list[str]:
    return [c["errorText"] for c in stream if c["type"] == "error"]


def saved_entries(stream: list[dict[str, Any]]) -> list[str]:
    """The entry ids the ``data-conversation-saved`` part announced (none: nothing saved)."""
    return [i for c in stream if c["type"] == SAVED for i in c["data"]["entry_ids"]]


def user_message(text: str) -> dict[str, Any]:
    return {
        "id": f"u-{uuid.uuid4().hex[:12]}",
        "role": "user",
        "parts": [{"type": "text", "text": text}],
    }


@dataclass
class VercelChat:
    """One browser tab's ``useChat`` on one conversation, as one user."""

    client: TestClient
    chat_id: str
    user: str
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def headers(self) -> dict[str, str]:
        return {"x-user": self.user}

    def reload(self) -> list[dict[str, Any]]:
        """The conversation as the server holds it (what a tab shows after a reload)."""
        response = self.client.get(f"/chats/{self.chat_id}", headers=self.headers)
        assert response.status_code == 200, response.text
        self.messages = response.json()
        return self.messages

    def post(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        response = self.client.post("/chat", json=body, headers=self.headers)
        assert response.status_code == 200, response.text
        return chunks(response.text)

    def send(self, text: str) -> list[dict[str, Any]]:
        """``sendMessage``: the conversation the tab holds and the new user message."""
        message = user_message(text)
        self.messages = [*self.messages, message]
        return self.post(
            {"trigger": "submit-message", "id": self.chat_id, "messages": self.messages}
        )

    def regenerate(self) -> list[dict[str, Any]]:
        """``regenerate()``: the last assistant message dropped, its id named."""
        assert self.messages[-1]["role"] == "assistant"
        last = self.messages[-1]
        self.messages = self.messages[:-1]
        return self.post(
            {
                "trigger": "regenerate-message",
                "id": self.chat_id,
                "messages": self.messages,
                "messageId": last["id"],
            }
        )

    def answer_approval(self, tool_call_id: str, *, approved: bool) -> list[dict[str, Any]]:
        """``addToolApprovalResponse`` then the automatic re-send: the tool part answered."""
        assistant = self.messages[-1]
        assert assistant["role"] == "assistant", assistant
        for part in assistant["parts"]:
            if part.get("toolCallId") == tool_call_id:
                assert part["state"] == "approval-requested", part
                part["state"] = "approval-responded"
                part["approval"] = {"id": part["approval"]["id"], "approved": approved}
                break
        else:
            raise AssertionError(f"no tool part {tool_call_id!r} in {assistant}")
        return self.post(
            {"trigger": "submit-message", "id": self.chat_id, "messages": self.messages}
        )


def on_app_loop(client: TestClient, call: Callable[[ConversationStore], Awaitable[T]]) -> T:
    """``call(store)`` awaited on the app's own event loop (the store lives there)."""
    store: ConversationStore = client.app.state.store  # type: ignore[attr-defined]
    assert client.portal is not None
    return client.portal.call(lambda: call(store))


def read_record(client: TestClient, chat_id: str) -> ConversationRecord | None:
    return on_app_loop(client, lambda store: store.read_record(chat_id))


def user_texts(messages: list[ModelMessage]) -> list[str]:
    return [
        str(part.content)
        for m in messages
        if isinstance(m, ModelRequest)
        for part in m.parts
        if isinstance(part, UserPromptPart)
    ]


def response_texts(messages: list[ModelMessage]) -> list[str]:
    return [
        part.content
        for m in messages
        if isinstance(m, ModelResponse)
        for part in m.parts
        if isinstance(part, TextPart)
    ]


def load(client: TestClient, chat_id: str, user: str) -> list[ModelMessage]:
    conversation = on_app_loop(client, lambda store: store.load(chat_id, scope=user))
    assert conversation is not None
    return conversation.messages


def listed(client: TestClient, user: str) -> list[str]:
    """The user's conversations, most recent first (the chat app's sidebar)."""
    records = on_app_loop(client, lambda store: store.list_conversations(scope=user, limit=20))
    return [r.conversation_id for r in records]


# --- the scenarios -----------------------------------------------------------------------


def vercel_chat_story(open_store: StoreOpener) -> None:
    """First request, follow-up, regenerate kept as a branch, an approval answering the
    deferred call, another user kept out, and a stale save ending in the reload error."""
    script = Scripted()
    app = chat_app(open_store, scripted_agent(script))
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    with TestClient(app) as client:
        tab = VercelChat(client, chat_id, user="alice")

        # 1. The first request creates the conversation under the user's scope.
        first = tab.send("hello")
        assert errors_of(first) == []
        assert text_of(first) == "answer 1 to 'hello'"
        assert len(saved_entries(first)) == 2  # the prompt and the answer
        record = read_record(client, chat_id)
        assert record is not None and record.scope == "alice"
        assert record.branches == []
        held = tab.reload()
        assert [m["role"] for m in held] == ["user", "assistant"]
        # The client's message id is kept on the stored prompt (what a regenerate matches on).
        assert held[0]["id"] == tab.messages[0]["id"]
        # The app titles the conversation after its first turn (never over the user's title).
        on_app_loop(
            client,
            lambda store: store.update(
                chat_id, title="Greetings", expected_title=None, scope="alice"
            ),
        )
        assert listed(client, "alice") == [chat_id]
        assert listed(client, "mallory") == []

        # 2. A follow-up appends; the client sends its whole history, the server keeps its own.
        follow = tab.send("and then?")
        assert text_of(follow) == "answer 2 to 'and then?'"
        assert len(saved_entries(follow)) == 2
        tab.reload()
        stored = load(client, chat_id, "alice")
        assert user_texts(stored) == ["hello", "and then?"]
        assert response_texts(stored) == ["answer 1 to 'hello'", "answer 2 to 'and then?'"]
        before_regenerate = read_record(client, chat_id)
        assert before_regenerate is not None
        assert record.usage.requests == 1
        assert before_regenerate.usage.requests == 2  # usage adds up across the requests
        assert before_regenerate.title == "Greetings"  # a save never undoes it

        # 3. Regenerate the last answer: the new one replaces it, the old tip is a branch.
        again = tab.regenerate()
        assert errors_of(again) == []
        assert text_of(again) == "answer 3 to 'and then?'"
        after = read_record(client, chat_id)
        assert after is not None
        assert after.branches == [before_regenerate.head_id]
        assert after.head_id != before_regenerate.head_id
        assert after.usage.requests == 3
        stored = load(client, chat_id, "alice")
        assert user_texts(stored) == ["hello", "and then?"]
        assert response_texts(stored) == ["answer 1 to 'hello'", "answer 3 to 'and then?'"]
        tab.reload()

        # 4. A call that needs approval pauses the run; the record keeps what it waits on.
        paused = tab.send("please delete my notes")
        assert errors_of(paused) == []
        requests = [c for c in paused if c["type"] == "tool-approval-request"]
        assert [c["toolCallId"] for c in requests] == ["call-del"]
        waiting = read_record(client, chat_id)
        assert waiting is not None and waiting.deferred_tool_requests is not None
        assert [c.tool_call_id for c in waiting.deferred_tool_requests.approvals] == ["call-del"]
        assert script.deleted == []
        tab.reload()  # the tab renders the approve/deny buttons from the stored conversation
        approved = tab.answer_approval("call-del", approved=True)
        assert errors_of(approved) == []
        assert script.deleted == ["notes.txt"]
        assert text_of(approved) == "Done: deleted notes.txt"
        resumed = read_record(client, chat_id)
        assert resumed is not None and resumed.deferred_tool_requests is None
        stored = load(client, chat_id, "alice")
        assert [
            p.tool_call_id for m in stored for p in m.parts if isinstance(p, ToolReturnPart)
        ] == ["call-del"]
        tab.reload()

        # 5. Another user naming the conversation finds nothing, and changes nothing.
        intruder = VercelChat(client, chat_id, user="mallory", messages=list(tab.messages))
        response = client.post(
            "/chat",
            json={
                "trigger": "submit-message",
                "id": chat_id,
                "messages": [*intruder.messages, user_message("hi")],
            },
            headers=intruder.headers,
        )
        assert response.status_code == 404
        assert client.get(f"/chats/{chat_id}", headers=intruder.headers).status_code == 404
        untouched = read_record(client, chat_id)
        assert untouched is not None and untouched.revision == resumed.revision

        # 6. Two tabs on the same conversation: the one that saves second ran on a stale
        # revision and ends with the reload error; nothing of its turn is stored.
        other = VercelChat(client, chat_id, user="alice", messages=list(tab.messages))
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(tab.send, "a slow question")
            assert script.waiting.wait(30), "the slow request never reached the model"
            fast = other.send("a quick question")
            assert errors_of(fast) == []
            assert saved_entries(fast)
            script.gate.set()
            stale = slow.result(timeout=60)
        assert errors_of(stale) == [
            "The conversation was changed by another request while this one ran, so this turn "
            "was not saved. " + RELOAD
        ]
        assert saved_entries(stale) == []
        stored = load(client, chat_id, "alice")
        assert "a quick question" in user_texts(stored)
        assert "a slow question" not in user_texts(stored)
        # Reloading and sending again works.
        tab.reload()
        retried = tab.send("a slow question, again")
        assert errors_of(retried) == []
        assert user_texts(load(client, chat_id, "alice"))[-1] == "a slow question, again"
        final = read_record(client, chat_id)
        assert final is not None and final.title == "Greetings" and final.scope == "alice"
        assert final.branches == [before_regenerate.head_id]
        assert listed(client, "alice") == [chat_id]


# --- the AG-UI client --------------------------------------------------------------------


def events_text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


def run_errors(events: list[dict[str, Any]]) -> list[str]:
    return [e["message"] for e in events if e["type"] == "RUN_ERROR"]


def saved_by_event(events: list[dict[str, Any]]) -> list[str]:
    return [
        i
        for e in events
        if e["type"] == "CUSTOM" and e["name"] == "pydantic_ai_conversation_saved"
        for i in e["value"]["entry_ids"]
    ]


@dataclass
class AGUIThread:
    """An AG-UI client on one thread, sending only its new messages (the server holds the rest)."""

    client: TestClient
    thread_id: str
    user: str

    def run(self, messages: list[dict[str, Any]], **extra: Any) -> list[dict[str, Any]]:
        body = {
            "threadId": self.thread_id,
            "runId": uuid.uuid4().hex,
            "messages": messages,
            **extra,
        }
        response = self.client.post(
            "/ag-ui", json=body, headers={"x-user": self.user, "accept": "text/event-stream"}
        )
        assert response.status_code == 200, response.text
        return chunks(response.text)

    def say(self, text: str, message_id: str | None = None) -> list[dict[str, Any]]:
        message_id = message_id or f"m-{uuid.uuid4().hex[:12]}"
        return self.run([{"id": message_id, "role": "user", "content": text}])


def ag_ui_chat_story(open_store: StoreOpener) -> None:
    """The same story through ``AGUIAdapter``: first run, follow-up, a user message
    resubmitted (the turn it starts regenerated, the old one kept as a branch), an
    interrupt resumed with an approval, another user kept out, and the stale save's
    ``RUN_ERROR`` asking for a reload."""
    script = Scripted()
    app = chat_app(open_store, scripted_agent(script))
    thread_id = f"thread-{uuid.uuid4().hex[:8]}"
    with TestClient(app) as client:
        thread = AGUIThread(client, thread_id, user="alice")

        first = thread.say("hello")
        assert run_errors(first) == []
        assert events_text(first) == "answer 1 to 'hello'"
        assert len(saved_by_event(first)) == 2
        record = read_record(client, thread_id)
        assert record is not None and record.scope == "alice"

        follow = thread.say("and then?", message_id="m-follow")
        assert events_text(follow) == "answer 2 to 'and then?'"
        before = read_record(client, thread_id)
        assert before is not None

        # The same user message sent again (retry / edit): its turn is run again.
        again = thread.say("and then?", message_id="m-follow")
        assert run_errors(again) == []
        assert events_text(again) == "answer 3 to 'and then?'"
        after = read_record(client, thread_id)
        assert after is not None and after.branches == [before.head_id]
        stored = load(client, thread_id, "alice")
        assert response_texts(stored) == ["answer 1 to 'hello'", "answer 3 to 'and then?'"]

        paused = thread.say("please delete my notes")
        finished = [e for e in paused if e["type"] == "RUN_FINISHED"]
        assert finished[-1]["outcome"]["type"] == "interrupt"
        [interrupt] = finished[-1]["outcome"]["interrupts"]
        assert interrupt["toolCallId"] == "call-del"
        waiting = read_record(client, thread_id)
        assert waiting is not None and waiting.deferred_tool_requests is not None
        resumed_events = thread.run(
            [],
            resume=[
                {
                    "interruptId": interrupt["id"],
                    "status": "resolved",
                    "payload": {"approved": True},
                }
            ],
        )
        assert run_errors(resumed_events) == []
        assert script.deleted == ["notes.txt"]
        assert events_text(resumed_events) == "Done: deleted notes.txt"
        resumed = read_record(client, thread_id)
        assert resumed is not None and resumed.deferred_tool_requests is None

        intruder = AGUIThread(client, thread_id, user="mallory")
        response = client.post(
            "/ag-ui",
            json={
                "threadId": thread_id,
                "runId": "r-intruder",
                "messages": [{"id": "m-x", "role": "user", "content": "hi"}],
            },
            headers={"x-user": intruder.user, "accept": "text/event-stream"},
        )
        assert response.status_code == 404
        untouched = read_record(client, thread_id)
        assert untouched is not None and untouched.revision == resumed.revision

        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(thread.say, "a slow question")
            assert script.waiting.wait(30), "the slow run never reached the model"
            fast = thread.say("a quick question")
            assert run_errors(fast) == []
            script.gate.set()
            stale = slow.result(timeout=60)
        assert run_errors(stale) == [
            "The conversation was changed by another request while this one ran, so this turn "
            "was not saved. " + RELOAD
        ]
        assert saved_by_event(stale) == []
        texts = user_texts(load(client, thread_id, "alice"))
        assert "a quick question" in texts and "a slow question" not in texts


def two_workers_story(open_store: StoreOpener) -> None:
    """Two app processes (workers behind a load balancer) on one store URL: each request
    of a tab lands on either, so a worker serves a conversation the other one saved last,
    regenerates a turn the other stored, resumes a run the other paused, and a stale save
    on one (the other saved since) ends in the reload error, after which that worker
    serves the conversation again."""
    script = Scripted()
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    app_a = chat_app(open_store, scripted_agent(script))
    app_b = chat_app(open_store, scripted_agent(script))
    with TestClient(app_a) as a, TestClient(app_b) as b:
        tab = VercelChat(a, chat_id, user="alice")
        assert text_of(tab.send("hello")) == "answer 1 to 'hello'"
        tab.client = b
        tab.reload()
        assert errors_of(tab.send("on b")) == []
        tab.client = a
        tab.reload()
        assert errors_of(tab.send("back on a")) == []
        assert user_texts(load(b, chat_id, "alice")) == ["hello", "on b", "back on a"]

        # B regenerates the answer A stored.
        before = read_record(a, chat_id)
        assert before is not None
        tab.client = b
        tab.reload()
        again = tab.regenerate()
        assert errors_of(again) == []
        assert text_of(again) == "answer 4 to 'back on a'"
        after = read_record(a, chat_id)
        assert after is not None and after.branches == [before.head_id]
        assert response_texts(load(a, chat_id, "alice"))[-1] == "answer 4 to 'back on a'"

        # A pauses on the approval, B resumes it.
        tab.client = a
        tab.reload()
        paused = tab.send("please delete my notes")
        assert [c["toolCallId"] for c in paused if c["type"] == "tool-approval-request"] == [
            "call-del"
        ]
        tab.client = b
        tab.reload()
        approved = tab.answer_approval("call-del", approved=True)
        assert errors_of(approved) == [] and script.deleted == ["notes.txt"]
        resumed = read_record(a, chat_id)
        assert resumed is not None and resumed.deferred_tool_requests is None

        # A's run started before B saved: A's save is stale.
        tab.reload()
        other = VercelChat(b, chat_id, user="alice", messages=list(tab.messages))
        tab.client = a
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(tab.send, "a slow question")
            assert script.waiting.wait(30), "the slow request never reached the model"
            assert errors_of(other.send("a quick question")) == []
            script.gate.set()
            stale = slow.result(timeout=60)
        assert len(errors_of(stale)) == 1 and RELOAD in errors_of(stale)[0]
        tab.reload()
        assert errors_of(tab.send("a slow question, again")) == []
        on_a, on_b = load(a, chat_id, "alice"), load(b, chat_id, "alice")
        assert on_a == on_b
        assert user_texts(on_a)[-2:] == ["a quick question", "a slow question, again"]
        assert "a slow question" not in user_texts(on_a)


def edit_story(open_store: StoreOpener) -> None:
    """``sendMessage({text, messageId})``: the user edits a message, the chat drops what
    followed it. Editing the second prompt branches off the first turn; editing the very
    first one branches off nothing (a history sharing no message with the stored one)."""
    script = Scripted()
    app = chat_app(open_store, scripted_agent(script))
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    with TestClient(app) as client:
        tab = VercelChat(client, chat_id, user="alice")
        tab.send("first")
        tab.reload()
        tab.send("second")
        tab.reload()
        tips: list[str] = []

        def edit(index: int, text: str) -> list[dict[str, Any]]:
            record = read_record(client, chat_id)
            assert record is not None and record.head_id is not None
            tips.append(record.head_id)
            edited = {**tab.messages[index], "parts": [{"type": "text", "text": text}]}
            tab.messages = [*tab.messages[:index], edited]
            return tab.post({"trigger": "submit-message", "id": chat_id, "messages": tab.messages})

        assert errors_of(edit(2, "second, edited")) == []
        stored = load(client, chat_id, "alice")
        assert user_texts(stored) == ["first", "second, edited"]
        assert response_texts(stored) == ["answer 1 to 'first'", "answer 3 to 'second, edited'"]
        tab.reload()

        assert errors_of(edit(0, "first, edited")) == []
        stored = load(client, chat_id, "alice")
        assert user_texts(stored) == ["first, edited"]
        assert response_texts(stored) == ["answer 4 to 'first, edited'"]
        record = read_record(client, chat_id)
        assert record is not None and record.branches == tips
        # Both branches left stay stored: an app can list and show them.
        for tip in tips:
            entries = on_app_loop(client, lambda store, tip=tip: store.read_history(tip))
            assert entries[-1].id == tip
        tab.reload()
        assert errors_of(tab.send("after the edits")) == []
        assert user_texts(load(client, chat_id, "alice")) == ["first, edited", "after the edits"]


def delete_story(open_store: StoreOpener) -> None:
    """The user deletes a chat while a run on it is under way in another tab: that run's
    save ends in the reload error instead of bringing the chat back, and the id starts
    afresh, with none of the deleted messages."""
    script = Scripted()
    app = chat_app(open_store, scripted_agent(script))
    chat_id = f"chat-{uuid.uuid4().hex[:8]}"
    with TestClient(app) as client:
        tab = VercelChat(client, chat_id, user="alice")
        tab.send("hello")
        tab.reload()
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(tab.send, "a slow question")
            assert script.waiting.wait(30), "the slow request never reached the model"
            # Another user's delete leaves it alone; the owner's deletes it.
            on_app_loop(client, lambda store: store.delete(chat_id, scope="mallory"))
            assert read_record(client, chat_id) is not None
            on_app_loop(client, lambda store: store.delete(chat_id, scope="alice"))
            script.gate.set()
            stale = slow.result(timeout=60)
        assert len(errors_of(stale)) == 1 and RELOAD in errors_of(stale)[0]
        assert read_record(client, chat_id) is None
        assert listed(client, "alice") == []
        assert client.get(f"/chats/{chat_id}", headers=tab.headers).status_code == 404

        tab.messages = []
        fresh = tab.send("hello again")
        assert errors_of(fresh) == []
        assert user_texts(load(client, chat_id, "alice")) == ["hello again"]
