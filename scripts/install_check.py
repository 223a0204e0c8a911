"""Install each backend as docs/install.md says, with plain pip, into a fresh virtualenv.

    python scripts/install_check.py --url sqlite=sqlite:///tmp/x.db --url redis=redis://... \
        [--contract sqlite --contract redis]

Builds a wheelhouse of every distribution of the checkout with ``pip wheel`` (what the
docs give for installing from a clone before the packages are published: ``packages/*/``
and ``contract-tests/``), then for each ``NAME=URL``: a new venv, ``pip install
--find-links WHEELHOUSE "agent-stores[harness]" agent-stores-NAME`` (the package names,
exactly as after publishing), and, with the installed CLI, ``agent-stores check --setup
--write URL`` and one scripted agent conversation (``agent-stores demo --url URL``).

For each ``--contract NAME`` (one of the ``--url`` names; default: sqlite and redis when
given), another new venv with ``pip install --find-links WHEELHOUSE agent-stores-contract
agent-stores-NAME``, as docs/contract.md tells a backend author, and the contract suite's
KV and port parts (``CONTRACT_SUITES``) run from that installed package against URL, from
a temporary working directory: the venv's own ``agent_stores_contract`` must be the one
imported, and nothing of the clone may be on ``sys.path``.

Venvs run two at a time; a failure prints the last 40 lines of what failed. Exit status 1
if any backend failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: How the contract suite is told its backend's URL.
URL_ENV = "AGENT_STORES_CONTRACT_URL"
#: The embedded backends ship in the core distribution.
EMBEDDED = {"sqlite", "memory"}
TAIL_LINES = 40
#: Arguments passed through the environment (one per line), so no URL shows in argv.
ARGS_ENV = "AGENT_STORES_INSTALL_CHECK_ARGS"
#: Every folder holding one distribution: the packages and the contract suite.
DISTRIBUTIONS = ["packages/*/", "contract-tests/"]
#: Backends the installed contract suite runs on when no ``--contract`` is given.
DEFAULT_CONTRACT = ("sqlite", "redis")
#: The parts of the suite run from the installed package: the KV contract (the one a
#: backend writes) and the port contract (its native paths).
CONTRACT_SUITES = ["agent_stores_contract.suite.test_kv", "agent_stores_contract.suite.test_ports"]


def requirements(name: str) -> list[str]:
    """What a user installs for backend ``name`` (docs/install.md)."""
    if name in EMBEDDED:
        return ["agent-stores[harness]"]
    return ["agent-stores[harness]", f"agent-stores-{name}"]


def build_wheelhouse(folder: Path, work: Path) -> None:
    """Wheels of every distribution, built by plain pip in a venv of its own (the
    interpreter running this script may have no pip: uv's venvs do not)."""
    packages = sorted(
        str(project.parent)
        for folder in DISTRIBUTIONS
        for project in ROOT.glob(f"{folder}pyproject.toml")
    )
    builder = work / "venv-builder"
    run([sys.executable, "-m", "venv", str(builder)])
    python = str(builder / "bin" / "python")
    run([python, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(folder), *packages])


def run(args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """The command's standard output; a failure raises with the tail of both streams.

    Standard error is kept apart: log lines (a warning that a native index is unavailable)
    go there and must not be taken for the command's own last line."""
    result = subprocess.run(
        args,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        check=False,
    )
    if result.returncode != 0:
        output = result.stdout + result.stderr
        tail = "\n".join(output.splitlines()[-TAIL_LINES:])
        raise RuntimeError(f"`{' '.join(args[:4])} ...` exited {result.returncode}:\n{tail}")
    return result.stdout


def check_backend(name: str, url: str, wheelhouse: Path, work: Path) -> str:
    started = time.monotonic()
    bin_dir = new_venv(work / f"venv-{name}", wheelhouse, requirements(name))
    # The URL goes through the environment: argv is echoed on failure and may hold a password.
    env = {"AGENT_STORES_URL": url, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    cli = str(bin_dir / "agent-stores")
    checked = run([cli, "check", "--setup", "--write", "--rounds", "2"], env)
    if "ok" not in checked.splitlines()[-1]:
        raise RuntimeError(f"check did not end with ok:\n{checked}")
    demo = run([cli, "demo"], env)
    return f"{name}: installed, checked and ran the demo in {time.monotonic() - started:.0f} s" + (
        "" if demo else " (demo printed nothing)"
    )


def new_venv(venv: Path, wheelhouse: Path, requirements: list[str]) -> Path:
    """A fresh venv with ``requirements`` installed by plain pip from the wheelhouse (and
    PyPI for their dependencies); its ``bin`` folder."""
    run([sys.executable, "-m", "venv", str(venv)])
    bin_dir = venv / "bin"
    pip = [str(bin_dir / "pip"), "install", "--quiet", "--disable-pip-version-check"]
    run([*pip, "--find-links", str(wheelhouse), *requirements])
    return bin_dir


#: Run by the contract venv's python: where the suite was imported from, and no clone.
WHERE_FROM = """
import sys, agent_stores, agent_stores_contract
clone = sys.argv[1]
for module in (agent_stores, agent_stores_contract):
    assert module.__file__.startswith(sys.prefix), f"{module.__name__} from {module.__file__}"
clone_paths = [p for p in sys.path if p and (p + "/").startswith(clone + "/")]
assert not clone_paths, f"the clone is on sys.path: {clone_paths}"
print(agent_stores_contract.__file__)
"""


def check_contract(name: str, url: str, wheelhouse: Path, work: Path) -> str:
    """``pip install agent-stores-contract agent-stores-NAME`` in a fresh venv, then the
    suite from that installed package, run from a temporary folder outside the clone."""
    started = time.monotonic()
    backend = [] if name in EMBEDDED else [f"agent-stores-{name}"]
    venv = work / f"venv-contract-{name}"
    bin_dir = new_venv(venv, wheelhouse, ["agent-stores-contract", *backend])
    python = str(bin_dir / "python")
    outside = Path(tempfile.mkdtemp(prefix=f"contract-{name}-", dir=work))
    # Nothing inherited may point back into the clone (uv run and nox set some of these).
    env = {"PYTHONPATH": "", "PYTHONSAFEPATH": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    found = run([python, "-c", WHERE_FROM, str(ROOT)], env, cwd=outside).strip()
    if not found.startswith(str(venv)):
        raise RuntimeError(f"agent_stores_contract imported from {found}, not the venv {venv}")
    # The URL goes through the environment: argv is echoed on failure and may hold a password.
    env[URL_ENV] = url
    args = ["-p", "no:cacheprovider", "-q", "--pyargs", *CONTRACT_SUITES]
    # pytest's closing line, such as "120 passed, 3 skipped in 40.1s"
    summary = run([python, "-m", "pytest", *args], env, cwd=outside).strip().splitlines()[-1]
    took = time.monotonic() - started
    return f"{name}: agent-stores-contract from {found}: {summary.strip('= ')} ({took:.0f} s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", action="append", default=[], metavar="NAME=URL")
    parser.add_argument("--contract", action="append", default=None, metavar="NAME")
    if argv is None and os.environ.get(ARGS_ENV):
        argv = [*os.environ[ARGS_ENV].split("\n"), *sys.argv[1:]]
    args = parser.parse_args(argv)
    targets = dict(item.split("=", 1) for item in args.url)
    contract = args.contract if args.contract is not None else DEFAULT_CONTRACT
    unknown = [name for name in args.contract or () if name not in targets]
    if unknown:
        parser.error(f"--contract {unknown}: not among the --url names {sorted(targets)}")
    with tempfile.TemporaryDirectory(prefix="agent-stores-install-") as tmp:
        work = Path(tmp)
        wheelhouse = work / "wheelhouse"
        build_wheelhouse(wheelhouse, work)
        wheels = sorted(p.name for p in wheelhouse.glob("*.whl"))
        print(f"wheelhouse: {', '.join(wheels)}")
        if not any(wheel.startswith("agent_stores_contract-") for wheel in wheels):
            print("the wheelhouse lacks agent-stores-contract")
            return 1
        failed = []
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {
                name: pool.submit(check_backend, name, url, wheelhouse, work)
                for name, url in targets.items()
            }
            futures |= {
                f"{name} (contract)": pool.submit(
                    check_contract, name, targets[name], wheelhouse, work
                )
                for name in contract
                if name in targets
            }
            for name, future in futures.items():
                try:
                    print(future.result(), flush=True)
                except Exception as exc:  # reported per backend, the others still run
                    failed.append(name)
                    print(f"{name}: FAILED\n{exc}", flush=True)
        if failed:
            print(f"install check failed for {', '.join(failed)}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
