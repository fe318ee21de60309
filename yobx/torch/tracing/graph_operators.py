"""The graph operators of ``torch.cond`` and ``scan`` in traced graphs.

:class:`CondCCOp` and :class:`ScanCCOp` are the targets of the nodes the tracer records
for them (see :mod:`.core.control_flow`) and of the choice between a capture's versions
(:mod:`.constraints.versions`); the ONNX lowering recognises them. They depend on torch
alone, so that every room of the tracer can name them.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch._ops import HigherOrderOperator

#: torch's own operators, read when this module is imported (before any patch)
_ORIGINAL_COND = torch.cond
_ORIGINAL_SCAN = torch.ops.higher_order.scan


class _GraphOperator(HigherOrderOperator):
    """A HigherOrderOperator with one instance per class: torch registers operators in
    a global table by name, and graphs compare their targets by identity."""

    _registered_name = ""
    _instances: dict[type, _GraphOperator] = {}

    def __new__(cls):
        if cls not in _GraphOperator._instances:
            instance = super().__new__(cls)
            HigherOrderOperator.__init__(instance, cls._registered_name)
            _GraphOperator._instances[cls] = instance
        return _GraphOperator._instances[cls]

    def __init__(self):
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class CondCCOp(_GraphOperator):
    """Graph target of ``torch.cond``: ``CondCCOp()(pred, true_gm, false_gm, operands)``.

    A torch :class:`~torch._ops.HigherOrderOperator` registered as
    ``torch.ops.higher_order.yobx_cond``, so generated code, pickling and graph
    printing resolve it like torch's own control-flow operators. Calling it runs
    ``torch.cond``, so ``make_fx`` and ``torch.export`` of a traced graph still see a
    ``cond``. Every ``CondCCOp()`` is the same operator.
    """

    _registered_name = "yobx_cond"

    def __call__(self, pred, true_fn, false_fn, operands):
        return _ORIGINAL_COND(pred, true_fn, false_fn, tuple(operands))


class ScanCCOp(_GraphOperator):
    """Graph target of scan: ``ScanCCOp()(body_gm, init, xs, additional_inputs)``.

    A torch :class:`~torch._ops.HigherOrderOperator` registered as
    ``torch.ops.higher_order.yobx_scan``. Calling it runs
    ``torch.ops.higher_order.scan`` and returns the final carries followed by the
    stacked per-step outputs (for zero steps, which torch's scan refuses: the carries
    as they came in, the same tensors as in the user's loop, and empty stacks). Every
    ``ScanCCOp()`` is the same operator.
    """

    _registered_name = "yobx_scan"

    def __call__(self, combine_fn, init, xs, additional_inputs):
        init, xs, additional_inputs = list(init), list(xs), list(additional_inputs)
        if xs and all(type(x.shape[0]) is int and x.shape[0] == 0 for x in xs):
            return _no_step(combine_fn, init, xs, additional_inputs)
        if _differentiable_eager(init, xs, additional_inputs):
            return _steps(combine_fn, init, xs, additional_inputs)
        return _ORIGINAL_SCAN(combine_fn, init, xs, additional_inputs)


def _differentiable_eager(*groups: list) -> bool:
    """Whether the scan runs on real tensors with autograd on, nothing tracing it.

    torch's scan then traces its body on fake tensors to differentiate it
    (``gen_schema``), which fails on the parameters of the body's submodules (real
    tensors the body reads itself, not inputs): a carry starting from a parameter (a
    learned initial state) or from a first step kept apart failed so. Where nothing
    traces the scan, its steps run one after the other instead, as in the user's loop,
    which autograd follows, parameters of the body included.
    """
    if not torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    if torch._C._len_torch_dispatch_stack() > 0:
        return False  # make_fx, FakeTensorMode...: they see torch's scan
    from torch._subclasses.fake_tensor import FakeTensor

    tensors = [t for group in groups for t in group if isinstance(t, torch.Tensor)]
    plain = (torch.Tensor, torch.nn.Parameter)
    return not any(isinstance(t, FakeTensor) or type(t) not in plain for t in tensors)


def _steps(combine_fn, init: list, xs: list, additional_inputs: list) -> list:
    """The scan's steps run one after the other: the final carries, then each per-step
    output stacked."""
    carries, per_step = list(init), []
    for k in range(xs[0].shape[0]):
        # the carries then the step's outputs, flat (as torch's scan reads them)
        results = pytree.tree_leaves(combine_fn(*carries, *(x[k] for x in xs), *additional_inputs))
        carries, outputs = results[: len(init)], results[len(init) :]
        per_step.append(outputs)
    stacked = [torch.stack([outputs[j] for outputs in per_step]) for j in range(len(per_step[0]))]
    return [*carries, *stacked]


def _no_step(combine_fn, init: list, xs: list, additional_inputs: list) -> list:
    """A scan of zero steps (a loop over ``range(1, n)`` at ``n = 1``), which torch's
    scan refuses (it reads the first step to know the outputs): the carries as they
    came in and empty stacked outputs, whose shapes a step on zeros gives. The carries
    are the tensors themselves, as after a loop that runs no step: a write into one
    reaches what it views (a loop starting from ``x[:1]``)."""
    steps = [x.new_zeros(x.shape[1:]) for x in xs]
    outputs = list(combine_fn(*init, *steps, *additional_inputs))[len(init) :]
    return [*init, *(y.new_empty((0, *y.shape)) for y in outputs)]
