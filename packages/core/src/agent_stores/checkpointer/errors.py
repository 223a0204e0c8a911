"""Errors raised by the checkpointer, all in the :class:`~agent_stores.errors.AppError` hierarchy."""

from __future__ import annotations

from ..errors import AppError, ErrorCode, Severity


class UncertainEffect(AppError):
    """A step has a recorded intent but no result, and its effect is not idempotent.

    The process stopped between writing the intent and writing the result, so the effect
    may or may not have happened. Repeating it blindly could do it twice; skipping it could
    lose it. Neither the loop nor the store can tell, so this is raised for whoever can
    decide (the harness, or a person). ``step_id`` names the step; ``intent`` is the
    recorded intent (a :class:`~agent_stores.checkpointer.JournalEntry`) when known.
    """

    default_code = ErrorCode.RUN_UNCERTAIN_EFFECT
    default_severity = Severity.WARNING

    def __init__(self, step_id: str, *, detail: str = "", intent: object = None) -> None:
        message = f"step {step_id!r} was attempted without a recorded result and is not idempotent"
        super().__init__(detail=f"{message}; {detail}" if detail else message)
        self.step_id = step_id
        self.intent = intent


class ReplayMismatchError(AppError, ValueError):
    """The journal holds a different kind of step at the position the loop asks about.

    Step ids are positional (``000003-model``): a loop that emits one step more or fewer
    than the one that wrote the journal asks about shifted positions and would re-run
    everything, non-idempotent steps included. Give the run a new id, or resume it with
    the code version that wrote it.
    """

    default_code = ErrorCode.RUN_JOURNAL_MISMATCH


class RunExistsError(AppError, ValueError):
    """``register_run`` was called for a run id that another registration already claimed.

    Run ids are single-shot (the tool-effect ledger keys on ``(run_id, tool_call_id)``);
    use ``conversation_id`` to group several runs. A retry of the *same* registration
    (same ``registration_id``) is not an error.
    """

    default_code = ErrorCode.RUN_EXISTS


class RunNotFoundError(AppError, LookupError):
    """The run named does not exist (never written, deleted, or expired).

    Raised where an unknown run cannot mean "nothing happened yet", as it does for
    ``load``: forking a run that is not there would create an empty run by mistake.
    """

    default_code = ErrorCode.RUN_NOT_FOUND


class ForkPointError(AppError, LookupError):
    """The point a fork was asked to start from is not in the source run.

    ``at=`` names a snapshot by its position (as ``runs show`` lists them) or a journal
    step by its id; a pruned snapshot is no longer a point.
    """

    default_code = ErrorCode.RUN_FORK_POINT_UNKNOWN


class ForkIncompleteError(AppError, RuntimeError):
    """The run is a fork whose copy was cut off (``fork_run`` did not return).

    Part of the effect knowledge may be missing, so resuming it could repeat an effect:
    run ``fork_run`` again with the same arguments to finish it, or delete the run.
    """

    default_code = ErrorCode.RUN_FORK_INCOMPLETE
