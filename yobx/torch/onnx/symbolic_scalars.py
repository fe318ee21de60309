"""Symbolic numbers of a higher kind than the tensor they meet, as 0-d tensors.

``bool_mask * (seq - 1)`` and ``int_positions - seq / 2`` are, in the lowered graph,
``aten.mul.Tensor(bool tensor, SymInt)`` and ``aten.sub.Tensor(int64 tensor,
SymFloat)``: torch promotes the tensor to the number's kind (int64, float32). The
ONNX translation of a symbolic number is an int64 or float tensor computed from the
shapes, and torch_lib's promotion of the operation then reads it as a Python number
(``int() argument must be ... not 'SymbolicTensor'``). A ``scalar_tensor`` of the
number, with the dtype torch gives a Python number of its kind, promotes the same way
(a 0-d tensor of a higher kind sets the result's dtype) and translates. The same holds
for a Python number the decompositions put where the schema wants a tensor
(``aten.sub.Tensor(1.0, mask)``, from ``1.0 - mask``).
"""

from __future__ import annotations

import torch
import torch.fx

from yobx.torch.fx_code import recompile_alone

_KINDS = {torch.SymBool: 0, torch.SymInt: 1, torch.SymFloat: 2}


def symbolic_scalars_as_tensors(graph_module: torch.fx.GraphModule) -> int:
    """Rewrites, in every graph, the symbolic numbers a tensor argument of an aten
    operator receives when their kind is higher than a tensor operand's; returns how
    many."""
    count = 0
    for module in graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        changed = 0
        for node in list(module.graph.nodes):
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
                changed += _rewrite(module.graph, node)
        if changed:
            recompile_alone(module)
        count += changed
    return count


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node) -> int:
    tensors = [
        a.meta["val"]
        for a in node.args
        if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)
    ]
    lowest = min((_tensor_kind(t) for t in tensors), default=None)
    schema = node.target._schema.arguments
    args = list(node.args)
    tensor_overload = _tensor_overload(node.target)
    changed = 0
    for position, arg in enumerate(args):
        if position >= len(schema):
            continue
        is_tensor = isinstance(schema[position].type, torch.TensorType)
        val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        kind = _KINDS.get(type(val))
        if is_tensor and tensors and position == 0 and type(arg) in (bool, int, float):
            # `aten.sub.Tensor(1.0, mask)`: the decomposition of rsub put a Python number
            # where the schema wants the tensor `self`, which the translation's type
            # promotion cannot run again (ProphetNet's `1.0 - mask`); a 0-d tensor of
            # the result's dtype promotes the same way (numbers in the other tensor
            # arguments, `where(c, x, 0.0)`, translate as they are)
            dtype = torch.result_type(tensors[0], arg)
        elif kind == 2:
            # a symbolic float is a double in ONNX (see _torch_onnx_internals'
            # _symbolic_floats_in_double); torch computes `x * (n * 0.7)` in x's dtype,
            # the number converted to it first, and `torch.full((2,), n / 3)` in the
            # result's dtype
            dtype = _float_dtype(node, tensors)
            if dtype is None:
                continue
        elif is_tensor and tensors and kind is not None and kind > lowest:
            dtype = {0: torch.bool, 1: torch.int64}[kind]
        elif not is_tensor and tensors and kind is not None and tensor_overload is not None:
            # `arange(n) % (n - 1)` is `remainder.Scalar` with a symbolic int, whose
            # translation makes a constant of it: the `.Tensor` overload takes it as a
            # 0-d tensor of the dtype torch computes in
            dtype = torch.result_type(tensors[0], (False, 1, 1.0)[kind])
        else:
            continue  # a Scalar argument of a lower kind: translated as a number already
        with graph.inserting_before(node):
            tensor = graph.call_function(
                torch.ops.aten.scalar_tensor.default, (arg,), {"dtype": dtype}
            )
        like = tensors[0] if tensors else node.meta["val"]
        tensor.meta["val"] = like.new_zeros((), dtype=dtype)
        args[position] = tensor
        changed += 1
    if changed:
        node.args = tuple(args)
        if tensor_overload is not None:
            node.target = tensor_overload
    return changed


def _tensor_overload(target: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``aten.X.Tensor`` for ``aten.X.Scalar`` (same arguments, tensors for the
    numbers); None for other overloads."""
    if target._overloadname != "Scalar":
        return None
    return getattr(target.overloadpacket, "Tensor", None)


def _float_dtype(node: torch.fx.Node, tensors: list[torch.Tensor]) -> torch.dtype | None:
    """The dtype a symbolic float becomes in ``node``'s computation: that of its
    tensor operands (the default float dtype for integer or boolean ones), else of its
    floating result; ``None`` when nothing says (it stays a double)."""
    if tensors:
        return torch.result_type(tensors[0], 1.0)
    out = node.meta.get("val")
    if isinstance(out, torch.Tensor) and out.dtype.is_floating_point:
        return out.dtype
    return None


def _tensor_kind(tensor: torch.Tensor) -> int:
    if tensor.dtype == torch.bool:
        return 0
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        return 2
    return 1


__all__ = ["symbolic_scalars_as_tensors"]
