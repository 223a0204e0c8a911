"""``agent-stores backends``: what is installed, and what failed to load."""

from __future__ import annotations

import json
from typing import Any

import click

from ..plugins import get_registry


def backends_report() -> dict[str, Any]:
    """Installed backends, plugin failures and disabled plugins, as plain data."""
    registry = get_registry()
    return {
        "backends": [
            {
                "scheme": info.scheme,
                "plugin": info.plugin,
                "distribution": info.distribution,
                "version": info.version,
                "factory": info.factory,
                "description": info.description,
            }
            for info in sorted(registry.backends.values(), key=lambda i: i.scheme)
        ],
        "failures": [
            {"plugin": f.plugin, "distribution": f.distribution, "error": f.error}
            for f in registry.failures
        ],
        "disabled": sorted(registry.disabled),
        "clashes": [
            {"scheme": clash.scheme, "plugins": list(clash.plugins), "error": clash.message()}
            for clash in sorted(registry.clashes.values(), key=lambda c: c.scheme)
        ],
    }


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def backends(as_json: bool) -> None:
    """List installed backends (scheme, plugin, distribution, version) and plugin load errors."""
    report = backends_report()
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    rows = [("SCHEME", "DISTRIBUTION", "VERSION", "PLUGIN", "DESCRIPTION")]
    rows += [
        (b["scheme"], b["distribution"] or "-", b["version"] or "-", b["plugin"], b["description"])
        for b in report["backends"]
    ]
    widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
    for row in rows:
        click.echo(
            "  ".join(str(c).ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
        )
    for failure in report["failures"]:
        click.secho(
            f"plugin {failure['plugin']!r} ({failure['distribution'] or 'unknown distribution'}) failed to load: "
            f"{failure['error']}",
            fg="red",
            err=True,
        )
    for clash in report["clashes"]:
        click.secho(clash["error"], fg="red", err=True)
    if report["disabled"]:
        click.echo(
            f"disabled by AGENT_STORES_DISABLE_PLUGINS: {', '.join(report['disabled'])}", err=True
        )
