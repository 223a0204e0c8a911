"""``agent-stores demo-recall [--url URL]``: an agent recalls a fact by meaning, offline.

A scripted Pydantic AI agent (a ``FunctionModel``: no API key) with the harness ``Memory``
capability on a memory store searching in hybrid mode with WordLlama, whose model ships
in its wheel (no network). In one conversation the user mentions their daughter and the
agent writes it to memory; in a later conversation, with no history, the user asks
about "family members" — a query sharing no word with the fact — and the agent's
``search_memory`` tool finds it. The same query searched lexically finds nothing.
"""

from __future__ import annotations

import os
import secrets

import click
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

from ..selection import default_url
from ..url import StoreURL
from .common import run_async

FACT = "The user's daughter is called Maya; she is seven."
QUESTION = "Who are my family members?"
QUERY = "family members"
FILE = "people.md"
_BOUNDS = {"limit": 5, "max_files": 100, "max_chars": 2000, "max_file_chars": 65536}


def _script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Writes the fact when told it, searches when asked, and answers from what came back."""
    last = messages[-1]
    returns = [p for p in last.parts if isinstance(p, ToolReturnPart)]
    if returns:
        result = returns[0]
        if result.tool_name == "search_memory" and isinstance(result.content, dict):
            matches = result.content.get("matches")
            if isinstance(matches, list) and matches:
                return ModelResponse(parts=[TextPart(f"From my notes: {matches[0]['snippet']}")])
            return ModelResponse(parts=[TextPart("I have no notes about that.")])
        return ModelResponse(parts=[TextPart("Noted, I will remember that.")])
    prompt = next(
        (str(p.content) for p in last.parts if isinstance(p, UserPromptPart)),
        "",
    )
    if isinstance(last, ModelRequest) and prompt == QUESTION:
        call = ToolCallPart("search_memory", {"query": QUERY}, tool_call_id="search-1")
        return ModelResponse(parts=[call])
    call = ToolCallPart("write_memory", {"content": FACT, "file": FILE}, tool_call_id="write-1")
    return ModelResponse(parts=[call])


@click.command("demo-recall")
@click.option(
    "--url",
    default=None,
    help="Store URL (default: $AGENT_STORES_URL, else the embedded SQLite file).",
)
@run_async
async def demo_recall(url: str | None) -> None:
    """Run a scripted agent that recalls a fact by meaning (offline, no API key needed)."""
    from pydantic_ai_harness.memory import Memory

    from ..connection import open_memory
    from ..memory import SearchConfig
    from ..memory.wordllama import WordLlamaEmbeddingModel

    target = url or default_url()
    shown = StoreURL.parse(target).render()
    namespace = f"demo-{secrets.token_hex(3)}"
    echo = click.echo
    search = SearchConfig(mode="hybrid", embedder=WordLlamaEmbeddingModel())
    echo(f"agent-stores demo-recall: memory in {shown}, namespace {namespace!r}")
    echo("scripted model; memory search: hybrid, WordLlama embeddings (offline)\n")
    agent = Agent(FunctionModel(_script))
    async with open_memory(target, search=search) as memory:
        capability = Memory(store=memory, namespace=namespace)
        for number, prompt in [(1, "By the way, my daughter Maya turned seven."), (2, QUESTION)]:
            echo(f"conversation {number}  user: {prompt}")
            result = await agent.run(prompt, capabilities=[capability])
            for message in result.new_messages():
                for part in message.parts:
                    if isinstance(part, ToolCallPart):
                        echo(f"        tool {part.tool_name}({part.args_as_json_str()})")
            echo(f"        agent: {result.output}\n")
            await memory.wait_indexed()
        # The harness keeps an agent's files under NAMESPACE/AGENT_NAME/.
        [path] = await memory.list_paths(f"{namespace}/", limit=2)
        prefix = path.rpartition("/")[0] + "/"
        lexical = await memory.search(prefix, QUERY, mode="lexical", **_BOUNDS)
        semantic = await memory.search(prefix, QUERY, mode="semantic", **_BOUNDS)
        echo(f"the store searched directly for {QUERY!r} in {prefix}:")
        echo(f"        lexical:  {len(lexical.matches)} matches (no word in common)")
        for match in semantic.matches:
            echo(f"        semantic: {match.path}, cosine similarity {match.score:.2f}")
        launcher = "uv run agent-stores" if "UV" in os.environ else "agent-stores"
        echo(f"\nlook at it:  {launcher} memory {shown} cat {path}")
