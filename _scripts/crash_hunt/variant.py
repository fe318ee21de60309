"""A pytest plugin disabling one piece of yobx in the test process (``YOBX_VARIANT``):
``noslots`` (type slots' write-back), ``nostatic`` (directly made fakes), ``nosymmeta``
(storages resized to a symbolic size), ``notracer``, ``nopasses``, ``noweakref``,
``skip_<pass>`` (one of ``run_default_passes``'s), ``nopropagate``, ``nolint``,
``norecompile``, ``nowalk`` / ``nolocal`` (``remove_inplace``'s two paths),
``nowriteback`` (its write-back of the final values). See
``run.sh``."""

import os
import sys

import yobx.torch.passes.remove_inplace

variant = os.environ.get("YOBX_VARIANT", "")
if variant == "noslots":
    import yobx.torch.tracing.patches as PA

    PA.restore_slots = lambda saved: None
elif variant == "nostatic":
    import yobx.torch.tracing.static_fakes as SF

    SF.StaticFakes.get = lambda self, tensor: None
elif variant == "nosymmeta":
    from yobx.torch.tracing.shape_rules import _base as B

    def _meta(self, sizes, strides, dtype):
        if strides is None:
            return B._EMPTY(tuple(sizes), dtype=dtype, device=B._META)
        return B._EMPTY_STRIDED(tuple(sizes), tuple(strides), dtype=dtype, device=B._META)

    B.TensorFactory._meta = _meta
if variant in ("notracer", "nopasses"):
    import sys

    sys.path.insert(0, os.path.join(os.getcwd(), "unittests/torch/passes"))
    import passes_fuzz as PF

    if variant == "notracer":
        original = PF.check_tool

        def check_tool(program, tool):
            if tool == "tracer":
                return PF.Outcome(tool, "correct")
            return original(program, tool)

        PF.check_tool = check_tool
    else:
        PF._run_passes = lambda tool, captured: []
if variant == "noweakref":
    import torch

    import yobx.torch.passes._storages as ST

    class _Identity:
        """The storage itself (held), compared by address."""

        __slots__ = ("key", "storage")

        def __init__(self, storage):
            self.storage, self.key = storage, storage._cdata

        def __hash__(self):
            return hash(self.key)

        def __eq__(self, other):
            return isinstance(other, _Identity) and other.key == self.key

    def tensor_storages(value):
        result = []
        for leaf in torch.utils._pytree.tree_leaves(value):
            if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided:
                try:
                    result.append(_Identity(leaf.untyped_storage()))
                except (RuntimeError, NotImplementedError):
                    continue
        return result

    ST.tensor_storages = tensor_storages
    import yobx.torch.passes.aliasing as AL

    AL.tensor_storages = tensor_storages
    import torch.multiprocessing.reductions as R

    R.StorageWeakRef = lambda storage: _Identity(storage)
if variant.startswith("skip_"):
    import yobx.torch.passes.pipeline as PL
    from yobx.torch.passes.result import PassResult

    name = variant[len("skip_") :]
    setattr(PL, name, lambda graph, *args, **kwargs: PassResult(name, 0))
if variant == "nopropagate":
    import yobx.torch.passes._mutations as MU

    RI = sys.modules["yobx.torch.passes.remove_inplace"]
    MU.propagate_values = lambda graph, original: None
    RI.propagate_values = MU.propagate_values
if variant == "nolint":
    import torch.fx

    torch.fx.Graph.lint = lambda self: None
if variant == "norecompile":
    RI2 = sys.modules["yobx.torch.passes.remove_inplace"]
    RI2.recompile_owner = lambda graph: None
if variant in ("nowalk", "nolocal"):
    import sys as _sys

    import yobx.torch.passes.remove_inplace  # noqa: F401

    RI3 = _sys.modules["yobx.torch.passes.remove_inplace"]

    scan = RI3._scan_writes

    def _scan_writes(graph):
        any_write, local = scan(graph)
        if variant == "nowalk" and any_write and local is None:
            return False, None
        if variant == "nolocal" and local is not None:
            return False, None
        return any_write, local

    RI3._scan_writes = _scan_writes
if variant == "nowriteback":
    RI4 = sys.modules["yobx.torch.passes.remove_inplace"]
    RI4.write_back = lambda graph, finals: None
    RI4.record_outputs = lambda graph, finals: None
