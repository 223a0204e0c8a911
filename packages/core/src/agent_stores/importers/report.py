"""What an import did, and what it could not carry over."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ImportReport:
    """Counts per outcome, and one line per thing that was not carried over (with why)."""

    source: str
    imported: int = 0
    updated: int = 0
    identical: int = 0
    not_carried: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing failed (things deliberately not carried over are not failures)."""
        return not self.failed

    def lines(self) -> list[str]:
        """A human summary: the counts, then each item not carried over or failed."""
        out = [
            f"{self.source}: {self.imported} imported, {self.updated} updated, "
            f"{self.identical} already identical"
        ]
        out += [f"  not carried over: {item}" for item in self.not_carried]
        out += [f"  FAILED: {item}" for item in self.failed]
        return out
