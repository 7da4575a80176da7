"""How the engine words a failure: the text every rank's error carries, in one place.

An operation's error names its operation, sequence number and group (``allreduce #17 in group
'default': ...``) so that the logs of different ranks line up, and leads its detail with
torch's phrase for a timeout or a lost peer (``errors.with_torch_phrase``), so that code
matching torch's backends' wording matches pyc10d's too. A later operation of a broken group
raises the same type, saying it is unusable and why; peers told of an error that is not
pyc10d's own (a reduction kernel failing once bytes had moved) get its type and text, so
every rank names the cause, not only the one it happened on. The engine (``base.py``) decides
*when* a group fails; this module only says it.
"""

from __future__ import annotations

from ..algorithms.comm import describe_fingerprint
from ..errors import DistBackendError, DistError, DistNetworkError, with_torch_phrase


def reworded(error: BaseException, text: str) -> BaseException:
    """``error`` with the message ``text``: same type, same cause (an error class with another
    constructor is kept as it is)."""
    try:
        new = type(error)(text)
    except TypeError:
        return error
    new.__cause__ = error.__cause__
    return new


def without_trace(error: BaseException) -> str:
    """``error``'s text less the ``[flight recorder: path]`` note ``with_trace`` added: an
    error that quotes it gets a note of its own."""
    text = str(error)
    cut = text.rfind(" [flight recorder: ")
    return text[:cut] if cut >= 0 and text.endswith("]") else text


def with_trace(error: BaseException, path: str) -> BaseException:
    """``error`` saying where the flight recorder's dump of its group went."""
    return reworded(error, f"{error} [flight recorder: {path}]")


def annotated(error: BaseException, opname: str, seq: int, group_name: str) -> BaseException:
    """pyc10d's own ``error`` headed by the operation, its sequence number and its group, the
    detail led by torch's phrase; any other error as it is."""
    if not isinstance(error, DistError):
        return error
    head = f"{opname} #{seq} in group {group_name!r}"
    msg = str(error)
    if msg.startswith(head):
        return error
    if msg.startswith(f"{opname}: "):
        msg = msg[len(opname) + 2:]
    return reworded(error, f"{head}: {with_torch_phrase(error, msg)}")


def foreign_cause(error: BaseException, opname: str, seq: int, group_name: str, rank: int) -> str:
    """What the peers are told when an error not of pyc10d's own fails an operation here."""
    return (f"{opname} #{seq} in group {group_name!r} failed on rank {rank} "
            f"after it had started: {type(error).__name__}: {error}")


def unusable(broken: BaseException) -> BaseException:
    """The error of an operation issued on a group that ``broken`` already failed."""
    return type(broken)(f"unusable after an earlier failure: {without_trace(broken)}")


def peer_aborted(error: BaseException, who: int, reason: str) -> DistNetworkError:
    """A lost peer, with the reason a member gave when it aborted the group (the root cause)."""
    return DistNetworkError(f"{error}; rank {who} had aborted the group: {reason}")


def desync(opname: str, seq: int, group_name: str, who: int, theirs: int, rank: int,
           mine: int) -> DistBackendError:
    """Ranks ``who`` and ``rank`` sent messages of different collectives on one channel."""
    return DistBackendError(
        f"{opname} #{seq} in group {group_name!r}: desync: rank {who} is running "
        f"{describe_fingerprint(theirs)}, rank {rank} is running {describe_fingerprint(mine)} "
        f"(the ranks called different collectives, or one with a different reduce op or root)"
    )


def destroyed(opname: str, group_name: str) -> DistBackendError:
    return DistBackendError(f"{opname}: process group {group_name!r} was destroyed")


def destroyed_pending(group_name: str) -> DistBackendError:
    return DistBackendError(f"process group {group_name!r} was destroyed with operations pending")


def aborted_by(group_name: str, rank: int) -> DistBackendError:
    """``abort()`` called here. The peers' error already says "aborted by rank N"
    (``transport.base.abort_error``) and names the group and operation: the reason they get
    is only what happened ("it called abort()")."""
    return DistBackendError(f"group {group_name!r} aborted by rank {rank}")
