"""Install each backend as docs/install.md says, with plain pip, into a fresh virtualenv.

    python scripts/install_check.py --url sqlite=sqlite:///tmp/x.db --url redis=redis://...

Builds a wheelhouse of every distribution of the checkout with ``pip wheel`` (what the
docs give for installing from a clone before the packages are published), then for each
``NAME=URL``: a new venv, ``pip install --find-links WHEELHOUSE "agent-stores[harness]"
agent-stores-NAME`` (the package names, exactly as after publishing), and, with the
installed CLI, ``agent-stores check --setup --write URL`` and one scripted agent
conversation (``agent-stores demo --url URL``). Venvs run two at a time; a failure prints
the last 40 lines of what failed. Exit status 1 if any backend failed.
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
#: The embedded backends ship in the core distribution.
EMBEDDED = {"sqlite", "memory"}
TAIL_LINES = 40
#: Arguments passed through the environment (one per line), so no URL shows in argv.
ARGS_ENV = "AGENT_STORES_INSTALL_CHECK_ARGS"


def requirements(name: str) -> list[str]:
    """What a user installs for backend ``name`` (docs/install.md)."""
    if name in EMBEDDED:
        return ["agent-stores[harness]"]
    return ["agent-stores[harness]", f"agent-stores-{name}"]


def build_wheelhouse(folder: Path, work: Path) -> None:
    """Wheels of every distribution, built by plain pip in a venv of its own (the
    interpreter running this script may have no pip: uv's venvs do not)."""
    packages = sorted(str(p.parent) for p in (ROOT / "packages").glob("*/pyproject.toml"))
    builder = work / "venv-builder"
    run([sys.executable, "-m", "venv", str(builder)])
    python = str(builder / "bin" / "python")
    run([python, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(folder), *packages])


def run(args: list[str], env: dict[str, str] | None = None) -> str:
    """The command's standard output; a failure raises with the tail of both streams.

    Standard error is kept apart: log lines (a warning that a native index is unavailable)
    go there and must not be taken for the command's own last line."""
    result = subprocess.run(
        args, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False
    )
    if result.returncode != 0:
        output = result.stdout + result.stderr
        tail = "\n".join(output.splitlines()[-TAIL_LINES:])
        raise RuntimeError(f"`{' '.join(args[:4])} ...` exited {result.returncode}:\n{tail}")
    return result.stdout


def check_backend(name: str, url: str, wheelhouse: Path, work: Path) -> str:
    started = time.monotonic()
    venv = work / f"venv-{name}"
    run([sys.executable, "-m", "venv", str(venv)])
    bin_dir = venv / "bin"
    run(
        [
            str(bin_dir / "pip"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--find-links",
            str(wheelhouse),
            *requirements(name),
        ]
    )
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", action="append", default=[], metavar="NAME=URL")
    if argv is None and os.environ.get(ARGS_ENV):
        argv = [*os.environ[ARGS_ENV].split("\n"), *sys.argv[1:]]
    args = parser.parse_args(argv)
    targets = dict(item.split("=", 1) for item in args.url)
    with tempfile.TemporaryDirectory(prefix="agent-stores-install-") as tmp:
        work = Path(tmp)
        wheelhouse = work / "wheelhouse"
        build_wheelhouse(wheelhouse, work)
        print(f"wheelhouse: {', '.join(sorted(p.name for p in wheelhouse.glob('*.whl')))}")
        failed = []
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {
                name: pool.submit(check_backend, name, url, wheelhouse, work)
                for name, url in targets.items()
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
