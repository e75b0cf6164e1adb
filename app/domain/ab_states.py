"""A/B run and overlay version states, and every transition between them: pure, like lease_states.py.

A run is measured pass by pass: a pass (one arm, one band, one round) is stored whole or not at all, so a run
stopped anywhere holds only whole passes and is re-driven from the first missing one. A fault (an unreachable
endpoint, a server that died) interrupts it: its verdict reads void with the fault's reason until a re-drive
resumes it. Booking (finish) needs every pass; a booked run is final (its verdict may still be void: the control,
engagement or accuracy said so, and those are facts of the data, not of the drive).
"""

from __future__ import annotations

from enum import StrEnum

from app.domain.lease_states import TransitionError


class RunState(StrEnum):
    CREATED = "created"
    DRIVING = "driving"
    INTERRUPTED = "interrupted"  # a fault stopped the drive; its reason is the run's void reason until resumed
    BOOKED = "booked"  # every pass measured, verdicts made: final


class VersionState(StrEnum):
    CANDIDATE = "candidate"  # made, not (yet) promoted
    PROMOTED = "promoted"  # the one the overlay download and deploy plan serve by default
    SUPERSEDED = "superseded"  # was promoted; a later promotion replaced it
    REJECTED = "rejected"  # its A/B regressed or voided the promotion; a rollback version may follow


def start(state: RunState) -> RunState:
    """A driver begins or resumes the run."""
    if state is RunState.BOOKED:
        raise TransitionError("the run is booked: start a new run to measure again")
    return RunState.DRIVING


def accept_pass(state: RunState) -> RunState:
    if state is not RunState.DRIVING:
        raise TransitionError(f"passes are posted to a driving run, not a {state} one (start it first)")
    return state


def interrupt(state: RunState) -> RunState:
    if state not in (RunState.DRIVING, RunState.CREATED):
        raise TransitionError(f"a {state} run is not interrupted")
    return RunState.INTERRUPTED


def book(state: RunState, missing: int) -> RunState:
    if state is not RunState.DRIVING:
        raise TransitionError(f"only a driving run is booked, not a {state} one")
    if missing:
        raise TransitionError(f"{missing} pass(es) not measured yet: nothing is booked until every pass is")
    return RunState.BOOKED


def promote(state: VersionState) -> VersionState:
    if state is VersionState.PROMOTED:  # a rejected version may pass a later run (a quieter node, a fixed rank)
        raise TransitionError(f"a {state} version is not promoted")
    return VersionState.PROMOTED


def reject(state: VersionState) -> VersionState:
    if state is VersionState.PROMOTED:
        raise TransitionError("the promoted version is not rejected by a later run: promote another one")
    return VersionState.REJECTED
