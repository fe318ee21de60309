"""Functions replaced while tracing so that they accept proxies.

``torch.zeros(x.size(0), 4)`` or ``torch.cat([proxy, tensor])`` never reach
``__torch_function__`` (the proxies hide inside a size tuple or a list), and
``torch.cond`` / ``torch.vmap`` / ``torch._check`` / ``scan`` need tracing of their own.
:func:`replace_problematic_function_before_tracing` swaps them for versions that
record a node when a proxy is involved and call the original otherwise; everything is
restored on exit, also when tracing raises.

Every replacement is installed by :func:`~..isolation.patching.patched_attributes`
inside a :mod:`patch window <..isolation.patch_window>`: one trace at a time in the
process, and the functions installed on modules and classes answer with the original
behaviour in every thread but the tracing one. The kernels that fail on symbolic sizes
are :mod:`..symbolic.symbolic_kernels`'.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import operator
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.fx.proxy import Proxy

from ..isolation.patch_window import any_thread, patch_window
from ..isolation.patching import memoized_replacements, patched_attributes
from ..symbolic.symbolic_kernels import symbolic_kernels
from .loops import SymbolicPieces, SymbolicRepeat
from .proxies import find_proxy
from .range_lists import SymbolicRangeList
from .symbolic_builtins import TRACED_BUILTINS, as_builtin

#: factories whose size arguments may hold symbolic dimensions
TENSOR_FACTORIES: tuple[Callable, ...] = tuple(
    getattr(torch, name)
    for name in (
        "zeros",
        "ones",
        "full",
        "empty",
        "arange",
        "randn",
        "rand",
        "randint",
        "eye",
        "tensor",
        "as_tensor",
        "linspace",
        "empty_strided",
        "tril_indices",
        "triu_indices",
    )
)

#: factories building a tensor from Python data
_DATA_FACTORIES = (torch.tensor, torch.as_tensor)

_LIST_FUNCTIONS = ("cat", "concat", "concatenate", "stack", "hstack", "vstack", "broadcast_tensors")


def traced_len(obj: Any) -> Any:
    """``len`` in the traced code: the symbolic first dimension of a traced tensor.

    Installed in the globals of the traced functions (see
    :func:`patch_len_in`), as ``torch.fx.wrap("len")`` would do; anything else gets
    the builtin's answer, so other threads using those modules see no difference.
    """
    from .loops import SymbolicRange
    from .proxies import CustomProxy

    if _BUILTIN_ISINSTANCE(obj, CustomProxy):
        return obj.length()
    if _BUILTIN_ISINSTANCE(obj, SymbolicRange):
        return obj.length()
    proxy = _a_proxy_of(obj) if _BUILTIN_ISINSTANCE(obj, list) else None
    if proxy is not None:
        # one value per step of a loop that becomes a scan (the first one may be a
        # constant, computed by a first step kept apart): its symbolic length; a loop
        # whose values the list holds otherwise is unrolled
        length = proxy.tracer.loop_length(obj)
        if length is not None:
            return length
    return _BUILTIN_LEN(obj)


def _a_proxy_of(values: list) -> Any:
    from .proxies import CustomProxy

    return next((v for v in values if _BUILTIN_ISINSTANCE(v, CustomProxy)), None)


_BUILTIN_LEN = builtins.len
_BUILTIN_ISINSTANCE = builtins.isinstance


def patch_len_in(function: Any) -> None:
    """Replaces ``len``, ``int``, ``float`` and ``range`` in the globals of ``function``
    while the current torch.fx trace lasts (its patcher restores them): see
    :func:`traced_len` and :mod:`.symbolic_builtins`. A decorated function (transformers
    wraps most ``forward`` methods: ``@capture_outputs``, ``@can_return_tuple``) runs its
    code in the module of the function it wraps: the globals of every function of the
    ``__wrapped__`` chain are patched."""
    from ..isolation.world_state import current_fx_patcher

    patcher = current_fx_patcher()
    if patcher is None:
        return
    seen: set[int] = set()
    while function is not None and id(function) not in seen:
        seen.add(id(function))
        frame_dict = getattr(function, "__globals__", None)
        if frame_dict is not None:
            patcher.patch(frame_dict, "len", traced_len)
            for name, replacement in TRACED_BUILTINS.items():
                patcher.patch(frame_dict, name, replacement)
        function = getattr(function, "__wrapped__", None)


def _recording(original: Callable) -> Callable:
    """Wraps ``original`` so that a call involving a proxy becomes a graph node."""

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if "dtype" in kwargs:
            # torch.zeros(n, dtype=int) in the traced code, where `int` is traced_int
            kwargs["dtype"] = as_builtin(kwargs["dtype"])
        proxy = find_proxy(args, kwargs)
        if proxy is None:
            pieces = args[0] if args else kwargs.get("tensors", kwargs.get("data"))
            if _BUILTIN_ISINSTANCE(pieces, SymbolicRepeat):
                # torch.tensor([0] * n): the items' tensor repeated n times;
                # torch.cat([x] * n): x repeated (see the tracer's join_pieces)
                if original in _DATA_FACTORIES:
                    kwargs = {k: v for k, v in kwargs.items() if k != "data"}
                    return pieces.as_tensor(original, kwargs)
                proxy = find_proxy(tuple(pieces.items), {})
                if proxy is None:  # nothing traced in it: the list made for real
                    return original(pieces._real(), *args[1:], **kwargs)
            elif type(pieces) is SymbolicRangeList and original in _DATA_FACTORIES:
                # torch.tensor(list(range(n))[::-1]): an arange (see range_lists)
                kwargs = {k: v for k, v in kwargs.items() if k != "data"}
                return pieces.as_tensor(original, kwargs)
            elif _BUILTIN_ISINSTANCE(pieces, SymbolicPieces):
                # torch.stack(x.unbind(d)) on a symbolic size (see loops)
                proxy = pieces.tensor
            else:
                return original(*args, **kwargs)
        return proxy.tracer.create_proxy("call_function", original, args, kwargs)

    # a marker on the function, read by tools that unwrap the replacement
    wrapper.__yobx_original__ = original  # type: ignore[attr-defined]
    return wrapper


#: methods of real tensors taking a Python type for a dtype (``mask.to(int)``)
_DTYPE_METHODS = ("to", "type", "new_zeros", "new_ones", "new_full", "new_empty", "new_tensor")


#: methods of real tensors whose sizes, given one by one, torch's parser refuses when
#: one is a proxy (`torch.ones(4).expand(x.shape[0], 4)` raises "expand() takes 1
#: positional argument but 2 were given"), while it takes them in a list
_SIZES_METHODS = ("expand", "new_zeros", "new_ones", "new_empty")
#: other methods of real tensors that traced arguments reach unrecorded: ``split`` is
#: Python code choosing ``split_with_sizes`` for anything but an int
_TRACED_ARGUMENT_METHODS = ("split",)
#: the in-place methods torch writes in C (``add_``, ``copy_``, ``masked_fill_``...):
#: called unbound on a proxy, ``torch.Tensor.mul_(x, 0.5)``, the descriptor refuses
#: anything but a tensor before any dispatch (torch.export, running real tensors,
#: captures it). The other C methods are left alone: the tracer's own fake execution
#: calls ``size``, ``dim`` or ``stride`` in its inner loops, and each call would go
#: through the replacement while a trace runs.
_UNBOUND_INPLACE_METHODS = tuple(
    name
    for name in vars(torch._C.TensorBase)
    # torch.Tensor's Python methods (``share_memory_``) dispatch proxies themselves
    if name.endswith("_") and not name.startswith("_") and name not in vars(torch.Tensor)
)


def _real_tensor_method(name: str) -> Callable:
    """The method ``name`` of ``torch.Tensor`` taking the traced code's arguments:
    Python types for dtypes (``mask.to(int)``, where ``int`` is
    :data:`~.symbolic_builtins.traced_int`: torch receives the builtin), and traced
    values, with which the call is recorded as the method it is (torch's dispatch to
    the proxy would record this wrapper, which neither the passes nor the lowering
    know), sizes given one by one passed in a list."""
    original = getattr(torch.Tensor, name)

    takes_dtype = name in _DTYPE_METHODS

    @functools.wraps(original)
    def method(self, *args, **kwargs):
        if takes_dtype:
            args = tuple(as_builtin(a) for a in args)
            if "dtype" in kwargs:
                kwargs["dtype"] = as_builtin(kwargs["dtype"])
        if isinstance(self, Proxy):
            return getattr(self, name)(*args, **kwargs)
        proxy = find_proxy(args, kwargs)
        if proxy is None:
            return original(self, *args, **kwargs)
        if name in _SIZES_METHODS and len(args) > 1:
            args = (list(args),)
        return proxy.tracer.create_proxy("call_method", name, (self, *args), kwargs)

    return method


def _exporting() -> bool:
    """``torch.compiler.is_exporting()`` in the model's code: True.

    Models write the paths that hold at every size behind it (transformers'
    ``is_torchdynamo_exporting`` asks it on each call): gated delta-net attention
    (Qwen3-Next, Qwen3.5, OLMo hybrid) replaces ``solve_triangular``, whose fake kernel
    refuses symbolic batch sizes, by a loop over its static chunk. ``is_compiling()``
    keeps its answer (False): compiled code takes kernels yobx cannot see into
    (transformers' mixture of experts calls its own ``grouped_mm_fallback`` operator
    instead of ``torch._grouped_mm``), and the Mamba family's scan is sequential where
    exporting is True and compiling is False. ``torch.jit.is_tracing()`` and
    ``is_scripting()`` stay False: their branches are TorchScript's (Swin turns its
    sizes into tensors, ``F.interpolate`` fixes its output size). Measured on about 60
    tiny Hugging Face architectures with both exporting and compiling answering True:
    no graph differed, three families traced that did not (the test suite's
    architectures with exporting alone).

    torch's own code keeps its answer (False): it reads it to choose how to record
    guards and metadata, which must stay the tracer's.
    """
    return not sys._getframe(1).f_code.co_filename.startswith(_TORCH_DIR)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep

#: torch._dynamo's marks: hints to torch.compile about an input (its address stays the
#: same across calls, an axis is static or dynamic), nothing a graph computes
_COMPILE_HINTS = ("mark_static_address", "mark_static", "mark_dynamic", "maybe_mark_dynamic")


def _compile_hint(original: Callable) -> Callable:
    """A mark of ``torch._dynamo`` given a proxy: nothing to do.

    Caches mark the tensors they make, unless ``torch.compiler.is_compiling()``,
    which stays False in a trace (see :func:`_exporting`): a linear-attention layer
    of FalconH1's cache calls ``mark_static_address`` on its token counter, a proxy
    there, and torch raises a TypeError for anything but a tensor. torch.export takes
    the branch without the mark. Anything else goes to torch's function.
    """

    @functools.wraps(original)
    def hint(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(tensor, Proxy):
            return None
        return original(tensor, *args, **kwargs)

    return hint


def _symbolic_extremum(original: Callable, symbolic: Callable) -> Callable:
    """``max``/``min`` of dimensions stay symbolic (``torch.sym_max``)."""

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if kwargs or find_proxy(args) is None:
            return original(*args, **kwargs)
        # min(a, b, ...) or min(iterable): Swin's min(input_resolution)
        items = list(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
        if not items:
            return original(*args, **kwargs)
        result = items[0]
        for other in items[1:]:
            result = symbolic(result, other)
        return result

    return wrapper


def _proxy_aware_is_tensor(original: Callable) -> Callable:
    """``torch.is_tensor(x)`` is True for a proxy of a tensor (diffusers checks timesteps
    that way); torch's own frames never call it with a proxy."""
    from .proxies import CustomProxy

    @functools.wraps(original)
    def is_tensor(obj):
        if _BUILTIN_ISINSTANCE(obj, CustomProxy):
            return _BUILTIN_ISINSTANCE(obj.node.meta.get("val"), torch.Tensor)
        return original(obj)

    return is_tensor


def _proxy_aware_isinstance(original: Callable) -> Callable:
    """``isinstance(x, torch.Tensor)`` is True for a proxy of a tensor, in model code.

    Model code checks masks and caches that way (transformers does). torch's own code
    keeps the real answer: it treats a proxy as a non-tensor with ``__torch_function__``
    and dispatches to the tracer (a "tensor" there would reach C++ functions, as
    ``autograd.Function.apply`` does). C-level checks never see this patch.
    """
    from .proxies import CustomProxy

    tensor = torch.Tensor
    torch_dir = os.path.dirname(torch.__file__) + os.sep

    # called very often: no thread gate, the original answers for anything but a proxy
    @any_thread
    def isinstance_(obj, classinfo):
        if (
            original(obj, CustomProxy)
            and (classinfo is tensor or (original(classinfo, tuple) and tensor in classinfo))
            and not sys._getframe(1).f_code.co_filename.startswith(torch_dir)
        ):
            return original(obj.node.meta.get("val"), tensor)
        return original(obj, classinfo)

    return isinstance_


def _proxy_aware_callable(original: Callable) -> Callable:
    """``callable(x)`` answers for the value a proxy stands for: False for a tensor or
    a number. torch.fx's ``Proxy.__call__`` (there for traced methods, which are
    :class:`~.proxies.CustomAttribute`, not this) made every proxy callable, and
    transformers' ``torch_compilable_check(n_tokens == n_features, msg)`` calls a
    callable condition: the trace then called a tensor."""
    from .proxies import CustomProxy

    # called often: no thread gate, the original answers for anything but a proxy
    @any_thread
    def callable_(obj):
        if _BUILTIN_ISINSTANCE(obj, CustomProxy):
            value = obj.node.meta.get("val")
            if value is not None:
                return original(value)
        return original(obj)

    return callable_


def _indexing_with_proxies(original: Callable) -> Callable:
    """``tensor[:, n:]`` on a real tensor (built in ``forward``) with a symbolic ``n``.

    torch's C++ indexing would ask the proxy for a Python int; the tensor becomes a
    graph constant and the indexing a node instead.
    """

    @functools.wraps(original)
    def __getitem__(self, key):
        proxy = find_proxy(key)
        if proxy is None:
            return original(self, key)
        return proxy.tracer.create_proxy("call_function", operator.getitem, (self, key), {})

    return __getitem__


def _check(original: Callable) -> Callable:
    @functools.wraps(original)
    def wrapper(cond, message=None):
        if isinstance(cond, Proxy):
            cond.tracer.check(cond, message)
            return None
        return original(cond, message) if message is not None else original(cond)

    return wrapper


def _check_with(original: Callable) -> Callable:
    """``torch._check_with(error_type, cond, message)`` and
    ``torch._check_tensor_all_with`` (transformers' ``torch_compilable_check``) on a
    traced condition: recorded as ``torch._check`` records it (a check of every element
    of a tensor condition, when the graph runs)."""

    @functools.wraps(original)
    def wrapper(error_type, cond, message=None):
        if isinstance(cond, Proxy):
            cond.tracer.check(cond, message)
            return None
        return original(error_type, cond, message)

    return wrapper


@contextlib.contextmanager
def replace_problematic_function_before_tracing() -> Iterator[None]:
    """Context manager replacing the functions that cannot take proxies as they are.

    Inside it, ``torch.cat``/``torch.stack`` & co (lists mixing proxies and tensors),
    tensor factories (``torch.zeros(x.size(0), 4)``, ``torch.full(x.shape[:2], 1.0)``),
    indexing of a real tensor by symbolic sizes (``tensor[:, n:]``), ``torch.cond``,
    ``torch.vmap``/``torch.func.vmap``, ``torch.ops.higher_order.scan``,
    ``torch._check`` (``_check_with``, ``_check_tensor_all[_with]``) and the builtins
    ``max``/``min`` accept proxies, and
    ``isinstance(x, torch.Tensor)``/``torch.is_tensor(x)`` are True for a proxy of a
    tensor in model code, ``callable(x)`` is False for a proxy of a tensor or a number.
    Calls without proxies, and every call from another thread, behave as usual.
    Everything is restored on exit, including when the body raises; only one such
    block is open at a time in the process (another thread waits).
    """
    # the context expressions run in order: the originals are read inside the window,
    # once another thread's trace is over
    with (
        patch_window(),
        patched_attributes(_replacements()),
        symbolic_kernels(),
        # Inside torch, `guard_or_false(size == 1)` (broadcasting, contiguity) would
        # otherwise decide from the example and guard on it. Size-oblivious answers
        # pick the path that is right for every size, and what really needs a fact
        # still asks for it with torch._check, which the tracer checks. The config is
        # a ContextVar: only the tracing thread sees it.
        # (torch gives its config modules `patch` when they are installed: no stub)
        torch.fx.experimental._config.patch(backed_size_oblivious=True),  # type: ignore[attr-defined]
    ):
        yield


@memoized_replacements
def _replacements() -> list[tuple[Any, str, Any]]:
    import torch._dynamo  # imported by a trace anyway (torch._compile's wrappers)

    from .control_flow import cond_function, scan_function, vmap_function

    vmap = vmap_function(torch.vmap)
    return [
        *((torch, fn.__name__, _recording(fn)) for fn in TENSOR_FACTORIES),
        *(
            (torch, name, _recording(getattr(torch, name)))
            for name in _LIST_FUNCTIONS
            if hasattr(torch, name)
        ),
        *(
            (torch.Tensor, name, _real_tensor_method(name))
            for name in dict.fromkeys(_DTYPE_METHODS + _SIZES_METHODS + _TRACED_ARGUMENT_METHODS)
        ),
        # right in every thread (the original for anything but a proxy): installed
        # without a gate each, which would cost every trace a fraction of a millisecond
        *(
            (torch.Tensor, name, any_thread(_real_tensor_method(name)))
            for name in _UNBOUND_INPLACE_METHODS
            if name not in _DTYPE_METHODS + _SIZES_METHODS
        ),
        (torch, "_check", _check(torch._check)),
        (torch, "_check_tensor_all", _check(torch._check_tensor_all)),
        (torch, "_check_with", _check_with(torch._check_with)),
        (torch, "_check_tensor_all_with", _check_with(torch._check_tensor_all_with)),
        (torch.Tensor, "__getitem__", _indexing_with_proxies(torch.Tensor.__getitem__)),
        (torch, "cond", cond_function(torch.cond)),
        (torch, "vmap", vmap),
        (torch.func, "vmap", vmap),
        (torch.ops.higher_order, "scan", scan_function(torch.ops.higher_order.scan)),
        (torch.compiler, "is_exporting", _exporting),
        *(
            (torch._dynamo, name, _compile_hint(getattr(torch._dynamo, name)))
            for name in _COMPILE_HINTS
        ),
        (builtins, "isinstance", _proxy_aware_isinstance(builtins.isinstance)),
        (builtins, "callable", _proxy_aware_callable(builtins.callable)),
        (torch, "is_tensor", _proxy_aware_is_tensor(torch.is_tensor)),
        (builtins, "max", _symbolic_extremum(builtins.max, torch.sym_max)),
        (builtins, "min", _symbolic_extremum(builtins.min, torch.sym_min)),
    ]
