"""Errors raised while tracing, with the fields a program needs to act on them.

Every error is a :class:`torch.fx.proxy.TraceError` (what torch.fx users catch) whose
message starts with the user's ``file:line``; the same facts are fields:
:attr:`TracingError.location`, :attr:`TracingError.expression` (in the user's
dimension names) and :attr:`TracingError.dimensions`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from torch.fx.proxy import TraceError


class TracingError(TraceError):
    """A program that cannot be traced soundly as it is written.

    :param message: the full message (starts with the location)
    :param location: the user's ``file:line``
    :param expression: the condition or value involved, in the user's dimension names
    :param dimensions: the user names of the dimensions involved
    """

    def __init__(
        self,
        message: str,
        *,
        location: str = "",
        expression: str = "",
        dimensions: Sequence[str] = (),
    ):
        super().__init__(message)
        self.location = location
        self.expression = expression
        self.dimensions = tuple(dimensions)

    @classmethod
    def at(
        cls: type[_Error],
        location: str,
        text: str,
        *,
        expression: str = "",
        dimensions: Sequence[str] = (),
    ) -> _Error:
        """The error for ``text`` at the user's ``location``: the one place where a
        message is built from the fields (``file:line: text``)."""
        message = f"{location}: {text}" if location else text
        return cls(message, location=location, expression=expression, dimensions=dimensions)


#: the class :meth:`TracingError.at` is called on, which it returns an instance of
_Error = TypeVar("_Error", bound=TracingError)


class DataDependentError(TracingError):
    """Python control flow depends on tensor values (``if x.sum() > 0``)."""


class SpecializationError(TracingError):
    """A dimension declared dynamic would become a constant.

    :attr:`fact` is the equality the trace needed (``d == 3``, in the user's dimension
    names), None when the error comes from elsewhere: with ``narrowing="versions"``
    the tracer captures sizes where it is false, and the example's side becomes a
    version.
    """

    fact: Any = None
    #: the capture holds the dimension at the example's size through inequalities
    #: (``n < 3`` with ``n`` from 2, see ``constraints.example_pins``), not an equality
    #: it needs: when no other size does better, the example's capture stands
    pinned_by_ranges: bool = False


class LayoutAliasNeeded(TracingError):
    """A write into what ``x.contiguous()`` or ``x.reshape(...)`` returned (or into
    ``x``), traced as a copy where the sizes did not settle whether it is a view of
    ``x``, while at the example's sizes it is: :meth:`CustomTracer.trace` captures
    again, deciding that call's layout (:attr:`copy_location`, the user's ``file:line``
    of the call; see :mod:`yobx.torch.tracing.core.layout_copies`)."""

    copy_location = ""


class StrictDimensionError(TracingError):
    """Dimensions declared with a named ``torch.export.Dim`` need constraints.

    :param needed: every constraint the trace needed, each with its suggested fix
    """

    def __init__(self, message: str, needed: Sequence[tuple[object, str]]):
        first = needed[0][0] if needed else None
        super().__init__(
            message,
            location=getattr(first, "location", ""),
            expression=getattr(first, "expression", ""),
            dimensions=sorted({d for c, _ in needed for d in getattr(c, "dimensions", ())}),
        )
        self.needed = list(needed)


def exception_summary(e: BaseException) -> str:
    """``Type: first line of the message`` of an exception torch raised underneath,
    for the message of the :class:`TracingError` that wraps it."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else repr(e)}"


def autocast_refused(location: str) -> TracingError:
    """The error for a node recorded while ``torch.autocast`` is enabled.

    The fake values would be computed under autocast (lower precision dtypes) while the
    graph, which records no autocast region, computes without it: other dtypes and
    values than the code gives, silently.
    """
    return TracingError.at(
        location,
        "torch.autocast is enabled here, and the traced graph does not record autocast "
        "regions: it would compute in other dtypes than this code does under autocast. "
        "Trace without autocast, and cast explicitly where a lower precision is wanted "
        "(x.to(torch.bfloat16)).",
    )
