"""Every error agent-stores raises, one typed hierarchy.

All errors are :class:`AppError` instances carrying a stable :class:`ErrorCode`, a
human-readable ``detail`` and a :class:`Severity`, so callers can branch on the code
instead of parsing messages. Subclasses also inherit the builtin exception a Python
user would expect (``ValueError`` for bad input, ``ConnectionError`` for an unreachable
server), so ``except ValueError`` keeps working.

No message built here ever contains a password, key or token: URLs are rendered through
:meth:`agent_stores.url.StoreURL.render`, which hides them.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """Stable machine-readable error codes.

    The session codes map one to one onto the Cortex Agent SDK codes they replace
    (see ``docs/sessions.md``).
    """

    UNKNOWN = "UNKNOWN"
    CONFIG_INVALID = "CONFIG_INVALID"
    RESOURCE_CLOSED = "RESOURCE_CLOSED"
    SESSION_BUSY = "SESSION_BUSY"
    SESSION_LEASE_LOST = "SESSION_LEASE_LOST"
    SESSION_RECOVERY_REQUIRED = "SESSION_RECOVERY_REQUIRED"
    SESSION_INVALID = "SESSION_INVALID"
    SESSION_STORE_FAILURE = "SESSION_STORE_FAILURE"
    SESSION_STORE_UNAVAILABLE = "SESSION_STORE_UNAVAILABLE"
    # Key-value layer and plugin selection.
    URL_MALFORMED = "URL_MALFORMED"
    SCHEME_UNKNOWN = "SCHEME_UNKNOWN"
    BACKEND_NOT_INSTALLED = "BACKEND_NOT_INSTALLED"
    PLUGIN_LOAD_FAILED = "PLUGIN_LOAD_FAILED"
    KV_CONFLICT = "KV_CONFLICT"
    VALUE_TOO_LARGE = "VALUE_TOO_LARGE"
    INVALID_ID = "INVALID_ID"
    BACKEND_UNAVAILABLE = "BACKEND_UNAVAILABLE"
    RECORD_CORRUPTED = "RECORD_CORRUPTED"
    UNSUPPORTED = "UNSUPPORTED"
    # Checkpointer (run journal and step store).
    RUN_EXISTS = "RUN_EXISTS"
    RUN_UNCERTAIN_EFFECT = "RUN_UNCERTAIN_EFFECT"
    RUN_JOURNAL_MISMATCH = "RUN_JOURNAL_MISMATCH"
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    RUN_FORK_POINT_UNKNOWN = "RUN_FORK_POINT_UNKNOWN"
    RUN_FORK_INCOMPLETE = "RUN_FORK_INCOMPLETE"
    # Subjects (erasure).
    SUBJECT_ERASING = "SUBJECT_ERASING"


class Severity(StrEnum):
    """How bad an error is, for logging and alerting."""

    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"


class AppError(Exception):
    """Base of every agent-stores error: ``AppError(code, detail, severity)``."""

    default_code: ErrorCode = ErrorCode.UNKNOWN
    default_severity: Severity = Severity.ERROR

    def __init__(
        self,
        code: ErrorCode | None = None,
        detail: str = "",
        severity: Severity | None = None,
    ) -> None:
        self.code = code if code is not None else self.default_code
        self.detail = detail
        self.severity = severity if severity is not None else self.default_severity
        super().__init__(f"{self.code}: {detail}" if detail else str(self.code))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code.value!r}, detail={self.detail!r}, severity={self.severity.value!r})"


# -- configuration and selection -------------------------------------------------------


class ConfigError(AppError, ValueError):
    """The configuration given to agent-stores cannot be used."""

    default_code = ErrorCode.CONFIG_INVALID


class MalformedURLError(ConfigError):
    """A store URL could not be parsed."""

    default_code = ErrorCode.URL_MALFORMED


class UnknownOptionError(ConfigError):
    """An option (URL query parameter or keyword argument) that nothing understands."""

    def __init__(
        self, where: str, unknown: list[str], valid: list[str], *, kind: str = "option"
    ) -> None:
        self.where = where
        self.unknown = unknown
        self.valid = valid
        names = ", ".join(repr(n) for n in unknown)
        choices = ", ".join(valid) if valid else "(none)"
        plural = "s" if len(unknown) > 1 else ""
        super().__init__(detail=f"{where}: unknown {kind}{plural} {names}; valid: {choices}")


class UnknownSchemeError(ConfigError):
    """No installed backend handles the URL's scheme."""

    default_code = ErrorCode.SCHEME_UNKNOWN

    def __init__(self, detail: str, *, scheme: str, installed: list[str], suggestion: str | None):
        super().__init__(detail=detail)
        self.scheme = scheme
        self.installed = installed
        self.suggestion = suggestion


class BackendNotInstalledError(ConfigError, ImportError):
    """The scheme belongs to a known distribution that is not installed."""

    default_code = ErrorCode.BACKEND_NOT_INSTALLED

    def __init__(self, detail: str, *, scheme: str, distribution: str):
        AppError.__init__(self, detail=detail)
        self.scheme = scheme
        self.distribution = distribution


class PluginLoadError(AppError, ImportError):
    """A plugin failed to load while strict plugin loading was on."""

    default_code = ErrorCode.PLUGIN_LOAD_FAILED
    default_severity = Severity.CRITICAL


class UnsupportedError(AppError, NotImplementedError):
    """The backend does not offer this optional operation."""

    default_code = ErrorCode.UNSUPPORTED


class ResourceClosedError(AppError, RuntimeError):
    """The store was closed and cannot be used any more."""

    default_code = ErrorCode.RESOURCE_CLOSED


# -- key-value layer --------------------------------------------------------------------


class KVError(AppError):
    """Base of errors raised by the key-value layer."""


class ConflictError(KVError):
    """A conditional write lost: the entry is not in the expected state.

    Expected in normal operation (optimistic concurrency); its severity is INFO.
    """

    default_code = ErrorCode.KV_CONFLICT
    default_severity = Severity.INFO

    def __init__(
        self, detail: str = "", *, scope: str = "", key: str = "", index: int | None = None
    ):
        super().__init__(detail=detail)
        self.scope = scope
        self.key = key
        # For ``commit``: position of the first operation whose condition failed.
        self.index = index


class ValueTooLargeError(KVError, ValueError):
    """A value exceeds the backend's item limit; nothing was written."""

    default_code = ErrorCode.VALUE_TOO_LARGE

    def __init__(self, detail: str, *, size: int, limit: int):
        super().__init__(detail=detail)
        self.size = size
        self.limit = limit


class InvalidIdError(KVError, ValueError):
    """A scope or key is empty, too long or not representable."""

    default_code = ErrorCode.INVALID_ID


class BackendUnavailableError(KVError, ConnectionError):
    """The server could not be reached or failed; the URL in the message is redacted."""

    default_code = ErrorCode.BACKEND_UNAVAILABLE
    default_severity = Severity.CRITICAL


class CorruptRecordError(KVError):
    """A stored record cannot be decoded; it was left untouched."""

    default_code = ErrorCode.RECORD_CORRUPTED
    default_severity = Severity.CRITICAL
