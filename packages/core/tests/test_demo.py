"""``agent-stores demo``: the project's main command, on the embedded default and on any URL."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_stores.cli import cli
from click.testing import CliRunner

STORY = [
    "In Paris it is sunny, 22°C.",
    'Before this you asked: "What\'s the weather in Paris?".',
    "the connection dropped",
    "refused: SESSION_RECOVERY_REQUIRED: pending effect book_table (call ",
    "store.clear_recovery(",
    "I have no confirmed booking in our conversation.",
    "Done: table for 2 at Chez Ada, 20:00, confirmation AB-1234.",
    "holds 12 messages, recovery required: False",
]


def _assert_story(output: str) -> None:
    position = 0
    for line in STORY:
        found = output.find(line, position)
        assert found >= 0, f"missing (in order): {line!r}\n{output}"
        position = found


def test_demo_on_memory() -> None:
    result = CliRunner().invoke(cli, ["demo", "--url", "memory://demo-test"])
    assert result.exit_code == 0, result.output
    _assert_story(result.output)
    assert "Chez Ada" in result.output and "memory://demo-test" in result.output


def test_demo_on_the_embedded_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --url the demo uses the embedded SQLite file; a second run may continue a session."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.delenv("AGENT_STORES_URL", raising=False)
    runner = CliRunner()
    first = runner.invoke(cli, ["demo", "--session", "kept"])
    assert first.exit_code == 0, first.output
    _assert_story(first.output)
    assert (tmp_path / "agent-stores" / "agent-stores.db").exists()
    second = runner.invoke(cli, ["demo", "--session", "kept"])
    assert second.exit_code == 0, second.output
    assert "(the agent sees 12 earlier messages)" in second.output
    shown = runner.invoke(
        cli, ["sessions", f"sqlite:///{tmp_path}/agent-stores/agent-stores.db", "show", "kept"]
    )
    assert shown.exit_code == 0 and "recovery     not required" in shown.output


@pytest.mark.parametrize(
    ("uv", "launcher"), [(True, "uv run agent-stores"), (False, "agent-stores")]
)
def test_the_closing_hint_runs_where_the_demo_ran(
    uv: bool, launcher: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if uv:
        monkeypatch.setenv("UV", "/usr/bin/uv")
    else:
        monkeypatch.delenv("UV", raising=False)
    result = CliRunner().invoke(cli, ["demo", "--url", "memory://demo-hint"])
    assert result.exit_code == 0, result.output
    assert f"look at it:  {launcher} sessions memory://demo-hint show" in result.output


def test_recall_demo_finds_a_fact_by_meaning(tmp_path: Path) -> None:
    """``demo-recall``: the agent writes a fact, then finds it through ``search_memory`` by
    a query sharing no word with it; lexical search finds nothing, semantic search finds it."""
    url = f"sqlite:///{tmp_path}/recall.db"
    result = CliRunner().invoke(cli, ["demo-recall", "--url", url])
    assert result.exit_code == 0, result.output
    story = [
        'tool write_memory({"content":"The user\'s daughter is called Maya; she is seven."',
        'tool search_memory({"query":"family members"})',
        "agent: From my notes: The user's daughter is called Maya; she is seven.",
        "lexical:  0 matches (no word in common)",
        "/main/people.md, cosine similarity 0.",
    ]
    position = 0
    for line in story:
        found = result.output.find(line, position)
        assert found >= 0, f"missing (in order): {line!r}\n{result.output}"
        position = found
