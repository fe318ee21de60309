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

A buffer a version writes into (``self.acc[:n] += ...``, a cache held by the model) is
treated the same way once it is an input of the branches: the joined graph reads it
(``get_attr``), passes it to the ``cond`` and writes its new value back, so the export
sees one write into the model's own buffer (``acc`` in, ``acc_updated`` out) instead of
writes into a version's attribute inside a branch.

The copies are what the model computes only when the tensor written into shares its
memory with no other input, parameter or buffer: for ``f(x, x[1])`` writing into ``x``,
the model's ``x[1]`` sees the write, a version's copy of ``x`` does not, nor does the
write back after the choice happen in the model's order. Such versions are not joined
(:class:`SharedStorageWrite`): the capture keeps the example's version, checked at run
time, whose in-place writes replay the model's on the memory it is given.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.fx

from ...passes import MUTATIONS_KEY, STORAGE_KEY, run_default_passes
from ...passes._inplace_walk import WRITE_BACK_KEY
from ...passes._side_effects import writes_in
from ..symbolic.symbolic_kernels import symbolic_kernels


def version_mutations(versions: list) -> list[list[dict]]:
    """The writes into inputs and buffers of each of the ``versions``, as the passes
    find them on a copy of its graph (run once per version: the passes take most of a
    join's time on a large graph)."""
    return [_mutations(v.graph, v.tracer.traced_model) for v in versions]


def _mutations(graph: torch.fx.Graph, module: torch.nn.Module) -> list[dict]:
    """The writes into inputs and buffers the passes find on a copy of ``graph``."""
    if not writes_in(graph):
        return []
    copied = torch.fx.Graph()
    copied.output(copied.graph_copy(graph, {}))
    gm = torch.fx.GraphModule(module, copied)
    # the passes compute the fake values of the nodes they make, as the capture does
    with symbolic_kernels():
        run_default_passes(gm.graph, mutations="outputs", exc=False, recursive=False)
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return list(output.meta.get(MUTATIONS_KEY, ()))


class SharedStorageWrite(Exception):
    """The versions write into an example input or buffer that shares its memory with
    another: joined, each version would write into a copy of it (see the module's
    documentation)."""


def check_unshared(graph: torch.fx.Graph, written: list[str]) -> None:
    """Raises :class:`SharedStorageWrite` if a name among ``written`` (inputs and
    buffers the versions write into, targets of ``graph``'s placeholders and
    ``get_attr`` nodes) shares storage with another input, parameter or buffer of the
    first capture's ``graph``, as the tracer marked them from the real tensors
    (:func:`yobx.torch.passes.mark_storages`)."""
    groups: dict[Any, set[str]] = {}
    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr") and STORAGE_KEY in node.meta:
            groups.setdefault(node.meta[STORAGE_KEY], set()).add(str(node.target))
    for name in written:
        for names in groups.values():
            others = sorted(names - {name})
            if name in names and others:
                raise SharedStorageWrite(
                    f"the versions were not joined: the model writes into {name!r}, which "
                    f"shares memory with {others[0]!r} in the example, and a version "
                    f"would write into a copy of it; the capture keeps the example's "
                    f"version, checked at run time (inputs that share no memory, such "
                    f"as clones, give every version)"
                )


def written_inputs(mutations: list[list[dict]], operands: list[str]) -> list[str]:
    """The inputs some version writes into (``mutations``: :func:`version_mutations`),
    in the order of ``operands``."""
    written = {
        record["target"]
        for records in mutations
        for record in records
        if record["kind"] == "USER_INPUT_MUTATION" and record["target"] in operands
    }
    return sorted(written, key=operands.index)


def buffer_operands(mutations: list[list[dict]], operands: list[str]) -> dict[str, str]:
    """The buffers some version writes into (``mutations``: :func:`version_mutations`),
    each with the name of the branches' input that replaces it (a name no operand
    has)."""
    written = {
        record["target"]
        for records in mutations
        for record in records
        if record["kind"] == "BUFFER_MUTATION"
    }
    names: dict[str, str] = {}
    taken = set(operands)
    for target in sorted(written):
        name = "buffer_" + "".join(c if c.isalnum() else "_" for c in target)
        while name in taken:
            name += "_"
        taken.add(name)
        names[target] = name
    return names


def buffers_as_inputs(graph: torch.fx.Graph, buffers: dict[str, str]) -> None:
    """Makes a branch's ``graph`` read each buffer of ``buffers`` (target: name) from a
    new input after the others (in the order of ``buffers``) instead of its attribute."""
    last = [n for n in graph.nodes if n.op == "placeholder"][-1]
    for target, name in buffers.items():
        with graph.inserting_after(last):
            last = graph.placeholder(name)
        for node in list(graph.find_nodes(op="get_attr", target=target)):
            last.meta.setdefault("val", node.meta.get("val"))
            node.replace_all_uses_with(last)
            graph.erase_node(node)


def lift_buffers(holder: torch.nn.Module, module: torch.nn.Module, targets: list[str]) -> None:
    """Registers in ``holder`` (the joined graph's module) each buffer of ``module`` at
    ``targets``, under the same name, so that the joined graph reads and writes it."""
    for target in targets:
        *path, leaf = target.split(".")
        owner = holder
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        # a buffer or a plain tensor attribute: the tensor itself, shared with the model
        tensor = functools.reduce(getattr, target.split("."), module)
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{target!r} is written in place but is not a tensor")
        owner.register_buffer(leaf, tensor)


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
