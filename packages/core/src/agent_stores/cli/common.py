"""Helpers shared by CLI commands: running coroutines, URL arguments, error display."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import click

from ..errors import AppError
from ..selection import default_url

P = ParamSpec("P")
T = TypeVar("T")


def run_async(fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """Run an async click callback with asyncio, turning agent-stores errors into clean exits."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return asyncio.run(fn(*args, **kwargs))
        except AppError as exc:
            raise click.ClickException(f"{exc.code}: {exc.detail}") from None

    return wrapper


def url_argument() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """An optional ``URL`` positional argument (see :func:`resolve_url` for the default)."""
    return click.argument("url", required=False, default=None, metavar="[URL]")


def resolve_url(url: str | None) -> str:
    """The URL given, or the default one."""
    return url or default_url()


def scope_prefix_option(
    default: str, store: str
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--scope-prefix``: the one isolation flag every store's command group takes."""
    return click.option(
        "--scope-prefix",
        default=default,
        show_default=True,
        help=f"The scope_prefix the {store} was opened with.",
    )
