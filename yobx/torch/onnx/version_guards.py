"""The decisions torch takes while lowering the versions of a capture, checked where
the versions are selected.

A capture choosing between versions (:mod:`yobx.torch.tracing.constraints.versions`)
is lowered branch by branch, each version's graph alone in its own ShapeEnv
(:mod:`.version_lowering`). torch's kernels may take a decision from the version's
example there (a guard), as they may for a graph without versions
(:func:`~.declared.adopt_lowering_guards`): the branch then computes right only for the
inputs where the decision holds. Each decision is judged the same way:

* one the version's capture proves (from the ranges it knew before the lowering) is
  fine; any other is adopted as a constraint of the version, which the model checks
  when the version is selected (a dimension declared strict refuses the export);
* a version computed by another's graph (:mod:`~yobx.torch.tracing.constraints.
  version_merging`) runs that graph: each decision of its lowering, proved or not, is
  also checked where the merged version is selected, unless the merged version's
  conditions imply it;
* a decision of the graph choosing between the versions, which every input runs, is
  checked for every input.

A decision the model meets on every size eager runs is then a check that never fails
(``height >= 8`` for a convolution of 8 by 8 patches); one it does not meet is a
constraint the model reports and checks, instead of a branch computing wrongly.
"""

from __future__ import annotations

from typing import Any

import sympy

from yobx.torch.node_text import node_location
from yobx.torch.onnx.errors import OnnxExportError
from yobx.torch.tracing.constraints.runtime_checks import RuntimeCheck, condition_in_sizes
from yobx.torch.tracing.constraints.versions import implied_by, in_dimensions, version_checks
from yobx.torch.tracing.errors import TracingError
from yobx.torch.tracing.symbolic.expression_text import pretty

#: the kind of the checks added here, which a failing check's message names
_KIND = "lowering to aten"


def version_snapshots(tracer: Any) -> dict[int, Any]:
    """What each version of ``tracer``'s last trace knows of its sizes (a
    :meth:`~yobx.torch.tracing.symbolic.symbolic.SymbolicDimensions.snapshot`, by id of
    its dimensions), taken before the lowering adds its own guards."""
    versions = getattr(tracer, "versions", None) or []
    return {id(v.tracer.dims): v.tracer.dims.snapshot() for v in versions}


def check_version_lowering_guards(
    captured: Any, lowered: Any, snapshots: dict[int, Any], known: Any
) -> None:
    """Judges the guards torch added while lowering a capture choosing between versions
    (``lowered.version_guards`` for the versions' branches, ``lowered.guards`` for the
    graph choosing between them; see the module's documentation), and updates the
    tracer's and ``captured``'s constraints and checks.

    :param snapshots: :func:`version_snapshots`, taken before the lowering
    :param known: the snapshot of the joined graph's dimensions before the lowering
    :raises OnnxExportError: a decision needs a fact a named ``Dim`` does not allow, or
        reads a size no input gives
    """
    tracer = captured.tracer
    versions = list(getattr(tracer, "versions", None) or [])
    first = next((v for v in versions if v.tracer.dims is tracer.dims), None)
    if first is None or not (lowered.version_guards or lowered.guards):
        return
    by_dims = {id(v.tracer.dims): v for v in versions}
    adopted = False
    extra: list[RuntimeCheck] = []
    for dims, guards in lowered.version_guards:
        version = by_dims.get(id(dims))
        if version is None:
            raise OnnxExportError(
                f"lowering a version to aten needed `{guards[0][0].expr}` and yobx cannot "
                "tell which version: this is a bug of yobx, please report it with the model",
                guards[0][1],
            )
        merged = [v for v in versions if v.computed_by is version]
        for guard, node in guards:
            if dims.prove(guard.expr, snapshots.get(id(dims))) is not True:
                _adopt(version, guard.expr, node)
                adopted = True
            if merged:
                user = _user_condition(version, guard.expr, node)
                extra += [_check_when(first, v, user, node) for v in merged]
    for guard, node in lowered.guards:
        # the choice between versions and what all of them share: every input runs it
        if tracer.dims.prove(guard.expr, known) is not True:
            user = _user_condition(first, guard.expr, node)
            extra.append(_check_when(first, None, user, node))
    extra = [check for check in extra if check is not None]
    if not adopted and not extra:
        return
    constraints: list[Any] = []
    for version in versions:
        constraints += [c for c in version.constraints if c not in constraints]
    checks = tracer.checks if not adopted else version_checks(first, versions)
    checks += [check for check in extra if check not in checks]
    tracer.set_version_assumptions(constraints, checks)
    captured.constraints = list(tracer.constraints)
    captured.range_constraints = dict(tracer.range_constraints)


def _adopt(version: Any, fact: sympy.Basic, node: Any) -> None:
    """Adopts ``fact`` (a guard of the version's ShapeEnv) as the version's constraint."""
    refinements = version.tracer.refinements
    try:
        refinements.adopt(fact, node_location(node), "lowering to aten", known=True)
    except TracingError as exc:
        raise OnnxExportError(
            f"lowering version {version.index} to aten specialised the model: {exc}", node
        ) from exc
    strict = refinements.strict_error()
    if strict is not None:
        raise OnnxExportError(
            f"lowering version {version.index} to aten needs constraints: {strict}", node
        ) from strict


def _user_condition(version: Any, fact: sympy.Basic, node: Any) -> sympy.Basic:
    """``fact`` (on the version's symbols) in the user's names."""
    dims = version.tracer.dims
    condition = condition_in_sizes(dims, fact)
    if condition is None:
        raise OnnxExportError(
            f"lowering to aten needed `{fact}`, a fact on sizes no input of the model "
            "gives, which its checks cannot verify",
            node,
        )
    return dims.user_expression(condition)


def _check_when(first: Any, version: Any, user: sympy.Basic, node: Any) -> RuntimeCheck | None:
    """The check of ``user`` (in the user's names) on the symbols of the ``first``
    capture, made where ``version`` is selected (None: for every input); None when the
    version's conditions imply it."""
    dims = first.tracer.dims
    text = pretty(user)
    if version is None:
        return RuntimeCheck(in_dimensions(dims, user), text, node_location(node), _KIND)
    path = sympy.And(*(c.condition for c in version.conditions))
    if implied_by(user, path):
        return None
    selected = sympy.And(*(in_dimensions(dims, c.condition) for c in version.conditions))
    return RuntimeCheck(
        sympy.Or(sympy.Not(selected), in_dimensions(dims, user)),
        f"{text} when {version.when}",
        node_location(node),
        _KIND,
    )


__all__ = ["check_version_lowering_guards", "version_snapshots"]
