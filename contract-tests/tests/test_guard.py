"""The guard: a backend's test module cannot silently drop or override a contract test."""

from __future__ import annotations

import inspect

import pytest
from agent_stores_contract import KVContract
from agent_stores_contract.plugin import check_contract_class, standard_tests

HEADER = """
import pytest
from agent_stores_contract import KVContract
"""


def _run(pytester: pytest.Pytester, body: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_backend=HEADER + body)
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--store-url", "memory://", *args
    )


def test_plain_subclass_runs_every_standard_test(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "class TestMine(KVContract):\n    pass\n")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == len(standard_tests(KVContract))


def test_dropping_a_test_fails_the_run(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "class TestMine(KVContract):\n    test_create_then_get = None\n")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*test_create_then_get is dropped*"])


def test_silent_override_fails_the_run(pytester: pytest.Pytester) -> None:
    body = """
class TestMine(KVContract):
    async def test_create_then_get(self, kv, ns):
        pass
"""
    result = _run(pytester, body)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*test_create_then_get overrides a standard test*"])


def test_non_strict_xfail_override_fails_the_run(pytester: pytest.Pytester) -> None:
    body = """
class TestMine(KVContract):
    @pytest.mark.xfail(reason="flaky")
    async def test_create_then_get(self, kv, ns):
        await super().test_create_then_get(kv, ns)
"""
    result = _run(pytester, body)
    assert result.ret != 0


def test_strict_xfail_with_reason_is_accepted_and_strict(pytester: pytest.Pytester) -> None:
    # The test passes on memory://, so a strict xfail must turn it red (XPASS(strict)).
    body = """
class TestMine(KVContract):
    contract_xfails = {"test_create_then_get": "emulator X lacks conditional writes"}
"""
    result = _run(pytester, body, "-k", "test_create_then_get")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*XPASS(strict)*emulator X lacks conditional writes*"])


def test_marked_override_is_accepted(pytester: pytest.Pytester) -> None:
    body = """
class TestMine(KVContract):
    @pytest.mark.xfail(strict=True, reason="known gap of emulator Y")
    async def test_create_then_get(self, kv, ns):
        raise AssertionError("emulator Y returns nothing")
"""
    result = _run(pytester, body, "-k", "test_create_then_get")
    result.assert_outcomes(xfailed=1)


def test_contract_xfails_must_name_real_tests() -> None:
    class Mine(KVContract):
        contract_xfails = {"test_does_not_exist": "x", "test_create_then_get": " "}

    problems = check_contract_class(Mine)
    assert any("test_does_not_exist" in p for p in problems)
    assert any("has no reason" in p for p in problems)


def test_every_contract_test_states_its_guarantee() -> None:
    import agent_stores_contract as contract

    classes = [KVContract]
    for name in ("SessionContract", "MemoryContract", "CheckpointerContract", "PortContract"):
        try:
            classes.append(getattr(contract, name))
        except (ImportError, AttributeError):
            continue
    for cls in classes:
        tests = standard_tests(cls)
        assert tests, cls
        for name, func in tests.items():
            doc = inspect.getdoc(func)
            assert doc and len(doc) > 20, (
                f"{cls.__name__}.{name} has no docstring stating its guarantee"
            )


def test_store_url_repr_hides_the_password() -> None:
    from agent_stores_contract.plugin import RedactedURL

    url = RedactedURL("redis://user:s3cret@localhost:6379/0?prefix=ct")
    assert url == "redis://user:s3cret@localhost:6379/0?prefix=ct"
    assert "s3cret" not in repr(url)
    assert "s3cret" not in repr([url])


def test_failing_test_output_hides_the_password(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_leak="""
def test_fails(contract_store_url):
    assert contract_store_url.startswith("memory://")
    raise AssertionError("the backend misbehaved")
"""
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--store-url", "memory://u:s3cret@x"
    )
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert "contract_store_url = 'memory://u:***@x'" in output
    assert "s3cret" not in output.replace("--store-url memory://u:s3cret@x", "")


def test_a_skipped_contract_test_fails_unless_a_capability_justifies_it(
    pytester: pytest.Pytester,
) -> None:
    body = """
class TestMine(KVContract):
    @pytest.fixture
    def kv_factory(self):
        pytest.skip("no server here")
"""
    result = _run(pytester, body, "-k", "test_create_then_get or test_multiprocess_cas_one_key")
    # Skipped in a fixture, so reported as errors at setup: the run fails either way.
    result.assert_outcomes(errors=2)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*was skipped (no server here)*require_capability*"])


def test_capability_skips_are_listed_in_the_summary(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "class TestMine(KVContract):\n    pass\n", "-k", "multiprocess")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        [
            "*agent-stores contract: skipped by declared capability*",
            "*test_multiprocess_cas_one_key: not applicable: capability "
            "shared_across_processes=False (memory)*",
        ]
    )


def test_a_hung_backend_fails_with_a_clear_message(pytester: pytest.Pytester) -> None:
    body = """
import asyncio
from agent_stores.backends.memory import MemoryKV

class Hangs(MemoryKV):
    async def _get(self, scope, key):
        await asyncio.sleep(3600)

class TestMine(KVContract):
    @pytest.fixture
    def kv_factory(self):
        return lambda: Hangs("hung")
"""
    result = _run(pytester, body, "-k", "test_create_then_get", "--contract-timeout", "2")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*did not finish within 2 s: the backend under test hung*"])


@pytest.mark.parametrize(
    "skip",
    [
        'pytest.importorskip("a_client_library_not_installed_here")',
        'pytest.skip("no server here", allow_module_level=True)',
    ],
    ids=["importorskip", "module-level-skip"],
)
def test_a_skipped_contract_module_fails_the_run(pytester: pytest.Pytester, skip: str) -> None:
    result = _run(pytester, f"{skip}\n\nclass TestMine(KVContract):\n    pass\n")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*uses the agent-stores contract and was skipped*"])


def test_a_skipped_module_without_contract_classes_stays_skipped(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_other="""
import pytest
import agent_stores_contract
pytest.skip("unrelated", allow_module_level=True)
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
