"""The harness's own capabilities on this backend, end to end, with a real agent run.

``pydantic_ai_harness`` ships capabilities that persist through a store protocol: ``Memory``
(a ``MemoryStore``), ``StepPersistence`` (a ``StepStore``) and ``ConversationSearch``,
which BM25-ranks what ``StepPersistence`` saved, read back through the same store's
``list_runs`` and ``list_snapshots``. Here each runs on a real ``Agent`` driven by a
scripted ``FunctionModel`` (no API key) over this backend's stores: the memory store
(:class:`agent_stores.memory.KVMemoryStore`) and the checkpointer's step store
(:class:`agent_stores.checkpointer.KVStepStore`), each test reading back through a second
client what the first wrote. Where the harness ships its own store (``InMemoryStepStore``),
the same script runs on it too and both must give the model the same answer.

The memory capability's own end-to-end test (writes, injection, ``search_memory``,
replay) is ``memory.memory_capability_end_to_end``; the step persistence resume after a
failure, also in a new process, is ``checkpointer.step_persistence_resume_*``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from agent_stores import KVStore, connect
from agent_stores.checkpointer import KVStepStore
from agent_stores.memory import KVMemoryStore
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai_harness.compaction import SlidingWindowCompaction
from pydantic_ai_harness.conversation_search import ConversationSearch, SnapshotHistorySource
from pydantic_ai_harness.conversation_search._source import message_hash
from pydantic_ai_harness.memory import Memory
from pydantic_ai_harness.step_persistence import InMemoryStepStore, StepPersistence, StepStore

from .base import ContractBase, KVFactory

#: What the first run of a conversation says, and later runs must find again.
LOCKER = "the locker code is 7731"


@dataclass
class Script:
    """A ``FunctionModel`` script. The run's user prompt is its command:

    - ``pay N``: calls the tool ``pay`` with ``N``, then answers ``paid``;
    - ``recall: Q`` (or ``recall: Q @ RUN_ID``): calls ``search_conversation_history``
      (with ``run_id``), then answers with what it returned;
    - ``remember: X``: calls ``write_memory`` with ``- X``, then answers ``noted``;
    - anything else: answers ``ok``.

    Records the text of every request the model saw (``seen``, one string per model
    request) and the content of every tool return (``returns``).
    """

    seen: list[str] = field(default_factory=list)
    returns: list[Any] = field(default_factory=list)

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append(_text(messages))
        last = messages[-1]
        returned = [p for p in last.parts if isinstance(p, ToolReturnPart)]
        if returned:
            self.returns += [p.content for p in returned]
            if returned[0].tool_name == "search_conversation_history":
                return ModelResponse(parts=[TextPart(str(returned[0].content))])
            return ModelResponse(
                parts=[TextPart("paid" if returned[0].tool_name == "pay" else "noted")]
            )
        prompt = _prompt(last)
        if prompt.startswith("pay "):
            amount = int(prompt.removeprefix("pay "))
            return ModelResponse(
                parts=[ToolCallPart("pay", {"amount": amount}, tool_call_id="pay-1")]
            )
        if prompt.startswith("recall: "):
            query, _, run_id = prompt.removeprefix("recall: ").partition(" @ ")
            args: dict[str, Any] = {"query": query}
            if run_id:
                args["run_id"] = run_id
            call = ToolCallPart("search_conversation_history", args, tool_call_id="recall-1")
            return ModelResponse(parts=[call])
        if prompt.startswith("remember: "):
            fact = prompt.removeprefix("remember: ")
            call = ToolCallPart("write_memory", {"content": f"- {fact}"}, tool_call_id="mem-1")
            return ModelResponse(parts=[call])
        return ModelResponse(parts=[TextPart("ok")])


def _prompt(request: ModelMessage) -> str:
    """The user's prompt of the newest request: its first text part (capabilities add theirs
    after it)."""
    if not isinstance(request, ModelRequest):
        return ""
    for part in request.parts:
        if isinstance(part, UserPromptPart) and isinstance(part.content, str):
            return part.content
    return ""


def _text(messages: Sequence[ModelMessage]) -> str:
    """Every user prompt, tool return and text answer in ``messages``, one per line."""
    lines: list[str] = []
    for message in messages:
        for part in message.parts:
            if isinstance(part, UserPromptPart | ToolReturnPart):
                lines.append(str(part.content))
            elif isinstance(part, TextPart):
                lines.append(part.content)
    return "\n".join(lines)


def pay(amount: int) -> str:
    """The tool the script calls: a receipt."""
    return f"receipt for {amount}"


def searching_agent(
    script: Script, steps: StepStore, *, window: int | None = None
) -> Agent[None, str]:
    """An agent persisting its steps to ``steps`` and searching them; ``window``: keep only
    that many messages in the model's context (a sliding window)."""
    capabilities: list[Any] = [
        StepPersistence(store=steps),
        ConversationSearch(SnapshotHistorySource(steps), scope="conversation"),
    ]
    if window is not None:
        capabilities.append(SlidingWindowCompaction(max_messages=window, keep_messages=window))
    agent: Agent[None, str] = Agent(FunctionModel(script), capabilities=capabilities)
    agent.tool_plain(pay)
    return agent


async def converse(
    agent: Agent[None, str], conversation_id: str, prompts: Sequence[str], run_prefix: str
) -> list[ModelMessage]:
    """Runs ``prompts`` as one conversation (each run continues the last one's history), run
    ids ``{run_prefix}-1``, ``-2``, …; the whole history."""
    history: list[ModelMessage] = []
    for i, prompt in enumerate(prompts, 1):
        result = await agent.run(
            prompt,
            message_history=history,
            conversation_id=conversation_id,
            run_id=f"{run_prefix}-{i}",
        )
        history = result.all_messages()
    return history


#: A conversation whose second run says :data:`LOCKER`, then talks about other things (the
#: second: a sliding window keeps the first user message).
CONVERSATION = [
    "note: hello",
    f"note: {LOCKER}",
    "pay 5",
    "note: lunch at noon",
    "note: the sky is grey",
]


class HarnessCapabilityContract(ContractBase):
    """The harness's Memory, StepPersistence and ConversationSearch capabilities on this backend.
    Subclass it and provide ``store_url`` or ``kv_factory``."""

    pytestmark = pytest.mark.asyncio

    @pytest_asyncio.fixture
    async def clients(self, kv_factory: KVFactory, kv: KVStore) -> AsyncIterator[Callable[[], Any]]:
        """Opens new clients of the backend (set up; closed after the test). ``kv`` (the
        first one) drops the test's scopes afterwards."""
        opened: list[KVStore] = []

        def make() -> Any:
            client = kv_factory()
            opened.append(client)
            return client

        try:
            yield make
        finally:
            for client in opened:
                with contextlib.suppress(Exception):
                    await client.aclose()

    def step_store(self, client: KVStore, ns: str) -> KVStepStore:
        """The checkpointer's step store for this test on ``client``, as a user gets it."""
        return connect(client).checkpointer(scope_prefix=f"{ns}/steps/").step_store()

    def memory_store(self, client: KVStore, ns: str) -> KVMemoryStore:
        """The memory store for this test on ``client``, as a user gets it."""
        return connect(client).memory(scope_prefix=f"{ns}:memory:")

    async def test_step_persistence_records_the_whole_run(
        self, clients: Callable[[], KVStore], ns: str
    ) -> None:
        """An Agent with StepPersistence on this store runs a tool call in a two-run conversation;
        a second client finds both runs under the conversation id (oldest first, none under another
        id), each run's latest snapshot equal to its whole history, its events from run_started to
        run_completed and the tool's effect completed: the same records and events, kind by kind,
        as the harness's own InMemoryStepStore holds after the same runs."""
        conversation = f"{ns}-conv"
        seen: dict[str, tuple[Any, ...]] = {}
        for name in ("ours", "harness"):
            steps: StepStore
            if name == "ours":
                writer = clients()
                await writer.setup()
                steps, later = self.step_store(writer, ns), self.step_store(clients(), ns)
            else:
                steps = later = InMemoryStepStore()
            script = Script()
            agent = searching_agent(script, steps)
            first = await agent.run("pay 5", conversation_id=conversation, run_id=f"{ns}-run-1")
            second = await agent.run(
                "note: done",
                message_history=first.all_messages(),
                conversation_id=conversation,
                run_id=f"{ns}-run-2",
            )
            assert script.returns == ["receipt for 5"]

            runs = await later.list_runs(conversation_id=conversation)
            assert [r.run_id for r in runs] == [f"{ns}-run-1", f"{ns}-run-2"], name
            assert await later.list_runs(conversation_id=f"{ns}-other") == []
            events: list[list[str]] = []
            for run, result in ((runs[0], first), (runs[1], second)):
                snapshot = await later.latest_snapshot(run_id=run.run_id)
                assert snapshot is not None
                assert [message_hash(m) for m in snapshot.messages] == [
                    message_hash(m) for m in result.all_messages()
                ], f"{name}: the latest snapshot is not the run's whole history"
                kinds = [e.kind for e in await later.list_events(run_id=run.run_id)]
                assert kinds[0] == "run_started" and kinds[-1] == "run_completed", (name, kinds)
                events.append(kinds)
            effect = await later.get_tool_effect(run_id=f"{ns}-run-1", tool_call_id="pay-1")
            assert effect is not None, name
            assert await later.list_unresolved_tool_effects(run_id=f"{ns}-run-1") == []
            seen[name] = (
                [
                    (r.run_id, r.conversation_id, r.parent_run_id, r.agent_name, r.metadata)
                    for r in runs
                ],
                events,
                (effect.tool_name, effect.status, effect.idempotency_key, effect.effect_summary),
            )
        assert seen["ours"] == seen["harness"]

    async def test_conversation_search_recalls_what_compaction_dropped(
        self, clients: Callable[[], KVStore], ns: str
    ) -> None:
        """An Agent with StepPersistence, ConversationSearch and a sliding window on this store holds a
        six-run conversation; the last run, on another client, no longer has the second run's words in
        its context, yet search_conversation_history finds them, naming the run that said them, with
        exactly the answer the harness's own InMemoryStepStore gives for the same conversation."""
        conversation = f"{ns}-conv"
        prompts = [*CONVERSATION, "recall: locker code"]
        answers: dict[str, str] = {}
        for name in ("ours", "harness"):
            script = Script()
            steps: StepStore
            if name == "ours":
                writer, reader = clients(), clients()
                await writer.setup()
                # The conversation written through one client, searched through another.
                steps = self.step_store(writer, ns)
                later: StepStore = self.step_store(reader, ns)
            else:
                steps = later = InMemoryStepStore()
            history = await converse(
                searching_agent(script, steps, window=4), conversation, prompts[:-1], f"{ns}-run"
            )
            result = await searching_agent(script, later, window=4).run(
                prompts[-1],
                message_history=history,
                conversation_id=conversation,
                run_id=f"{ns}-run-{len(prompts)}",
            )
            assert "7731" not in script.seen[-2], (
                f"{name}: the sliding window kept the second run in the model's context"
            )
            answers[name] = result.output
            # Another conversation on the same store finds nothing of it, not even by run id.
            elsewhere = searching_agent(script, later)
            for prompt in ("recall: locker code", f"recall: locker code @ {ns}-run-2"):
                other = await elsewhere.run(prompt, conversation_id=f"{ns}-elsewhere")
                answers[f"{name}, elsewhere: {prompt}"] = other.output
        assert "the locker code is 7731" in answers["ours"], answers["ours"]
        assert f"run: {ns}-run-2" in answers["ours"], answers["ours"]
        assert answers["ours, elsewhere: recall: locker code"].startswith("No persisted history")
        assert answers[f"ours, elsewhere: recall: locker code @ {ns}-run-2"] == (
            f"No persisted history for run '{ns}-run-2'."
        )
        assert {k.removeprefix("ours"): v for k, v in answers.items() if k.startswith("ours")} == {
            k.removeprefix("harness"): v for k, v in answers.items() if k.startswith("harness")
        }

    async def test_memory_steps_and_search_on_one_agent(
        self, clients: Callable[[], KVStore], ns: str
    ) -> None:
        """Memory, StepPersistence and ConversationSearch on one Agent, over one client of this backend:
        a run writes memory with write_memory; on another client, the next run of the conversation
        finds that call with search_conversation_history, a new conversation sees the memory injected,
        the file holds it once, and the step store records the write_memory call as a completed effect."""
        writer = clients()
        await writer.setup()
        conversation = f"{ns}-conv"

        def agent(client: KVStore, script: Script) -> Agent[None, str]:
            steps = self.step_store(client, ns)
            return Agent(
                FunctionModel(script),
                capabilities=[
                    Memory(store=self.memory_store(client, ns), namespace=f"{ns}-user"),
                    StepPersistence(store=steps),
                    ConversationSearch(SnapshotHistorySource(steps), scope="conversation"),
                ],
            )

        script = Script()
        first = await agent(writer, script).run(
            "remember: likes green tea", conversation_id=conversation, run_id=f"{ns}-run-1"
        )
        assert script.returns[-1]["status"] == "created", script.returns

        reader = clients()
        later = agent(reader, script)
        recalled = await later.run(
            "recall: green tea",
            message_history=first.all_messages(),
            conversation_id=conversation,
            run_id=f"{ns}-run-2",
        )
        assert "likes green tea" in recalled.output and f"run: {ns}-run-1" in recalled.output, (
            recalled.output
        )
        await later.run("what do I like?", conversation_id=f"{ns}-new", run_id=f"{ns}-run-3")
        assert "likes green tea" in script.seen[-1], "the new conversation does not see the memory"

        memory = self.memory_store(reader, ns)
        assert await memory.list_paths(f"{ns}-user/", limit=10) == [f"{ns}-user/main/MEMORY.md"]
        stored = await memory.read(f"{ns}-user/main/MEMORY.md", max_chars=1000)
        assert stored is not None and stored.content == "- likes green tea\n"
        steps = self.step_store(reader, ns)
        effect = await steps.get_tool_effect(run_id=f"{ns}-run-1", tool_call_id="mem-1")
        assert effect is not None and effect.tool_name == "write_memory", effect
        assert await steps.list_unresolved_tool_effects(run_id=f"{ns}-run-1") == []
        runs = await steps.list_runs(conversation_id=conversation)
        assert [r.run_id for r in runs] == [f"{ns}-run-1", f"{ns}-run-2"]

    async def test_conversation_store_with_the_harness_capabilities(
        self, clients: Callable[[], KVStore], ns: str
    ) -> None:
        """A conversation kept by this backend's Pydantic AI ConversationStore (load, run with
        conversation=, save), its runs on an Agent with Memory, StepPersistence, ConversationSearch
        and a sliding window over the same backend: every run is persisted under the conversation's
        id, and its last run, loaded and run on another client, finds what the window dropped."""
        from pydantic_ai.conversation import Conversation

        conversation_id, owner = f"{ns}-chat", f"{ns}-user"
        writer = clients()
        await writer.setup()
        prompts = [*CONVERSATION, "recall: locker code"]
        script = Script()

        def agent(client: KVStore) -> Agent[None, str]:
            steps = self.step_store(client, ns)
            built: Agent[None, str] = Agent(
                FunctionModel(script),
                capabilities=[
                    Memory(store=self.memory_store(client, ns), namespace=owner),
                    StepPersistence(store=steps),
                    ConversationSearch(SnapshotHistorySource(steps), scope="conversation"),
                    SlidingWindowCompaction(max_messages=4, keep_messages=4),
                ],
            )
            built.tool_plain(pay)
            return built

        output = ""
        for i, prompt in enumerate(prompts, 1):
            # The last run on another client, as another worker of the app would take it.
            client = writer if i < len(prompts) else clients()
            store = connect(client).conversations(scope_prefix=f"{ns}:conversation:")
            conversation = await store.load(conversation_id, scope=owner) or Conversation(
                conversation_id=conversation_id
            )
            result = await agent(client).run(
                prompt, conversation=conversation, run_id=f"{ns}-run-{i}"
            )
            await store.save(result, scope=owner)
            output = result.output
        assert "7731" not in script.seen[-2], "the sliding window kept the second run"
        assert "the locker code is 7731" in output and f"run: {ns}-run-2" in output, output
        runs = await self.step_store(clients(), ns).list_runs(conversation_id=conversation_id)
        assert [r.run_id for r in runs] == [f"{ns}-run-{i}" for i in range(1, len(prompts) + 1)]
        stored = (
            await connect(clients())
            .conversations(scope_prefix=f"{ns}:conversation:")
            .load(conversation_id, scope=owner)
        )
        assert stored is not None and stored.conversation_id == conversation_id
        assert "recall: locker code" in _text(stored.messages)
