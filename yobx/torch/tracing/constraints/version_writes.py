"""Versions that write into their inputs: the write happens once, after the choice.

A model writing into an input in place (``x[: n // 2] *= 2``, a static cache's
``index_copy_``) is captured by each version as a write into the version's own input.
In the joined graph each version is a branch of a ``torch.cond``, whose inputs no branch
may write into (torch's rule, and the passes would keep such a write in place, which ONNX
cannot express: the export then fell back to the example's side alone). So the branches
write into a copy of such an input, which they return as an extra output, and the
joined graph copies that value back into the input after the choice
(``x.copy_(cond(...)[k])``): the passes make the copy an extra output of the graph, as
for any model writing into its inputs, and every version then runs functionally.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from ...passes import MUTATIONS_KEY, run_default_passes
from ...passes._inplace_walk import WRITE_BACK_KEY
from ...passes._side_effects import writes_in
from ..symbolic.symbolic_kernels import symbolic_kernels


def written_operands(
    graph: torch.fx.Graph, module: torch.nn.Module, operands: list[str]
) -> set[str]:
    """The inputs (placeholder targets among ``operands``) a version's ``graph`` writes
    into, itself or through a view, as the passes find them on a copy of it."""
    if not writes_in(graph):
        return set()
    copied = torch.fx.Graph()
    copied.output(copied.graph_copy(graph, {}))
    gm = torch.fx.GraphModule(module, copied)
    # the passes compute the fake values of the nodes they make, as the capture does
    with symbolic_kernels():
        run_default_passes(gm.graph, mutations="outputs", exc=False, recursive=False)
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return {
        record["target"]
        for record in output.meta.get(MUTATIONS_KEY, ())
        if record["kind"] == "USER_INPUT_MUTATION" and record["target"] in operands
    }


def written_inputs(versions: list, operands: list[str]) -> list[str]:
    """The inputs some of the ``versions`` write into, in the order of ``operands``."""
    written: set[str] = set()
    for version in versions:
        written |= written_operands(version.graph, version.tracer.traced_model, operands)
    return sorted(written, key=operands.index)


def write_into_copies(graph: torch.fx.Graph, written: list[str]) -> list[torch.fx.Node]:
    """Makes a branch's ``graph`` write into copies of its inputs ``written``: each is
    cloned first and every use reads the clone; returns the clones (in the order of
    ``written``), the values the branch returns for them."""
    placeholders = {n.target: n for n in graph.nodes if n.op == "placeholder"}
    anchor = next(n for n in graph.nodes if n.op != "placeholder")
    clones = []
    for name in written:
        placeholder = placeholders[name]
        with graph.inserting_before(anchor):
            clone = graph.call_method("clone", (placeholder,))
        clone.meta["val"] = fresh_value(placeholder.meta.get("val"))
        placeholder.replace_all_uses_with(clone, delete_user_cb=lambda user, c=clone: user is not c)
        clones.append(clone)
    return clones


def fresh_value(value: Any) -> Any:
    """A fake value like ``value`` with storage of its own: the passes tell which
    tensors may share storage from their values, and a copy shares none."""
    return value.clone() if isinstance(value, torch.Tensor) else value


def copy_back(
    graph: torch.fx.Graph, placeholders: dict[str, torch.fx.Node], written: list[str], values: list
) -> None:
    """After the choice: ``input.copy_(value)`` for each input the versions write into."""
    for name, value in zip(written, values):
        node = graph.call_method("copy_", (placeholders[name], value))
        node.meta["val"] = placeholders[name].meta.get("val")
        # the passes' own form of a final value written back into an input: its value
        # is the input's from then on (a mutation output for the ONNX export)
        node.meta[WRITE_BACK_KEY] = True
