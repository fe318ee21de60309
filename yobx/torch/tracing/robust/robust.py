"""Robust tracing: capture what can be captured, report what cannot and why.

:class:`RobustTracer` traces like :class:`~yobx.torch.tracing.CustomTracer`; when
tracing into a submodule raises, that submodule becomes a leaf (a ``call_module``
node) and the trace is repeated, until no new module fails.
:func:`~yobx.torch.tracing.recursive_trace` (:mod:`.recursive`) then traces every
failing module on its own.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, ClassVar

import torch
import torch.fx
import torch.utils._pytree as pytree

from ..core.tracer import CustomTracer
from ..errors import TracingError
from ..inputs import bind_example_inputs, flatten_example_inputs
from ..symbolic.symbolic import Guard, SymbolicDimensions
from .collection import ModuleFailure
from .recorded_calls import RecordedCall, example_call, failure_location, record_calls


class _Restart(BaseException):
    """Aborts one attempt of :meth:`RobustTracer.trace`.

    A BaseException so that ``except Exception`` in the user's code (or in torch)
    never swallows it.
    """


class _ModuleFailed(_Restart):
    """A module failed; it is a leaf in the next attempt."""


class _NeedExampleRun(_Restart):
    """A leaf cannot run on fake tensors: record one eager run, then retry."""


class _LeafRoot(torch.nn.Module):
    """Holds a root that is not traced into; its graph is one ``call_module`` node."""

    def __init__(self, root: torch.nn.Module):
        super().__init__()
        self.root = root


def _leaf_root_wrapper(root: torch.nn.Module) -> torch.nn.Module:
    """A module with the signature of ``root.forward`` that calls ``root`` as a leaf."""

    def forward(self, *args, **kwargs):
        return self.root(*args, **kwargs)

    # what inspect reads first: the wrapper shows the model's signature (no stub has it)
    forward.__signature__ = inspect.signature(type(root).forward)  # type: ignore[attr-defined]
    cls = type(f"LeafRoot_{type(root).__name__}", (_LeafRoot,), {"forward": forward})
    return cls(root)


def is_container(module: torch.nn.Module) -> bool:
    """ModuleList, ModuleDict and the like define no forward of their own."""
    return type(module).forward is torch.nn.Module.forward


@dataclasses.dataclass
class RobustTraceState:
    """What :class:`RobustTracer` finds over the attempts of one trace (a fresh one for
    each :meth:`RobustTracer.trace`): the failures persist from one attempt to the next,
    the modules called are those of the last attempt."""

    #: the model traced (None before any trace)
    root: torch.nn.Module | None = None
    #: the inputs each module received in one eager run, when one was needed
    recording: dict[torch.nn.Module, list[RecordedCall]] | None = None
    #: the submodules that cannot be traced, run as leaves in the next attempts
    failures: dict[torch.nn.Module, ModuleFailure] = dataclasses.field(default_factory=dict)
    #: the attempts so far
    attempts: int = 0
    #: the modules the last attempt traced into, with their paths
    called: dict[torch.nn.Module, str] = dataclasses.field(default_factory=dict)
    #: the modules the last attempt called as leaves, with their paths
    leaves_called: dict[torch.nn.Module, str] = dataclasses.field(default_factory=dict)
    #: how many times the last attempt called each leaf
    leaf_call_count: dict[torch.nn.Module, int] = dataclasses.field(default_factory=dict)
    #: the modules the last attempt never reached, with their paths
    unvisited: dict[torch.nn.Module, str] = dataclasses.field(default_factory=dict)

    def start_attempt(self) -> None:
        """A new attempt: the failures stay, the calls start again."""
        self.attempts += 1
        self.called = {}
        self.leaves_called = {}
        self.leaf_call_count = {}
        self.unvisited = {}


class RobustTracer(CustomTracer):
    """A :class:`~yobx.torch.tracing.CustomTracer` that survives failing submodules.

    When tracing into a submodule raises (``TraceError``, ``TypeError``,
    ``RuntimeError``, ``NotImplementedError``, ``AssertionError``..., anything but
    ``KeyboardInterrupt``/``SystemExit``), the module is recorded as failed, the trace
    is restarted, and the module is a leaf from then on: a ``call_module`` node whose
    ``meta["val"]`` is computed by running it on fake tensors. The loop stops when no
    new module fails. The error is attributed to the innermost module being traced
    into when it was raised.

    Behaviours:

    * A failed or registered leaf runs on fake tensors with the ShapeEnv's guards
      suppressed: comparisons on dynamic dimensions inside it follow the example
      without narrowing what is known for the rest of the graph. When its inputs have
      dynamic dimensions, its output shapes are reported in :attr:`guards`
      (``"output shapes of <path> == [batch, 8]"``, reason ``"specialized"``): the
      module runs eagerly in the graph, only its output's ``meta["val"]`` relies on
      the example's branches.
    * When such a leaf cannot run on fake tensors at all (a branch on tensor values),
      the model is run once eagerly and the leaf's output on the example gives its
      ``meta["val"]``, with static shapes; a guard ``"output shapes of <path> == ..."``
      (reason ``"example"``) reports it.
    * When the root's own code fails or the root is a registered leaf, the root is not
      traced into: the graph has one ``call_module`` node calling it, and
      :attr:`traced_model` is a wrapper holding the root as submodule ``root``. A
      failure of the root is reported by :meth:`is_failed` (path ``""``).
    * A module is *unvisited* when the traced code never called it; submodules of a
      leaf, and containers (``ModuleList``, ``ModuleDict``) one of whose children was
      called, are not.

    Leaf registration is class-level (shared by every RobustTracer), per type, and
    applies to subclasses that do not override ``forward``.

    :param kwargs: passed to :class:`~yobx.torch.tracing.CustomTracer`
    """

    _registered_leaves: ClassVar[set[type]] = set()
    # a module needing a constraint on a named Dim fails where it needs it, and is
    # isolated as a leaf like any other failure
    _strict_at_once = True

    def __init__(
        self,
        recording: dict[torch.nn.Module, list[RecordedCall]] | None = None,
        **kwargs: Any,
    ):
        """
        :param recording: inputs each module received in one eager run of the model
            (:func:`~yobx.torch.tracing.record_calls`); made when first needed if None
        :param kwargs: see :class:`~yobx.torch.tracing.CustomTracer`
        """
        super().__init__(**kwargs)
        self._shared_recording = recording
        #: what the last :meth:`trace` found, over its attempts
        self.robust_state = RobustTraceState()

    @property
    def attempts(self) -> int:
        """The number of attempts the last :meth:`trace` needed."""
        return self.robust_state.attempts

    # leaf registration

    @classmethod
    def register_leaf(cls, module_type: type) -> None:
        """Makes every instance of ``module_type`` a leaf (also subclasses keeping its forward).

        :raises TypeError: when ``module_type`` is not a ``torch.nn.Module`` subclass
        """
        if not (isinstance(module_type, type) and issubclass(module_type, torch.nn.Module)):
            raise TypeError(
                f"register_leaf expects a torch.nn.Module subclass, got {module_type!r}"
            )
        RobustTracer._registered_leaves.add(module_type)

    @classmethod
    def unregister_leaf(cls, module_type: type) -> bool:
        """Removes a registration; a no-op for a type that is not registered.

        :return: whether ``module_type`` was registered
        """
        registered = module_type in RobustTracer._registered_leaves
        RobustTracer._registered_leaves.discard(module_type)
        return registered

    @classmethod
    def is_registered_leaf(cls, m: torch.nn.Module | type) -> bool:
        """Whether ``m`` (an instance or a type) is a registered leaf.

        True when ``m`` is a registered type, or a subclass of one that does not
        override ``forward`` (it runs the registered type's code).
        """
        module_type = m if isinstance(m, type) else type(m)
        forward = getattr(module_type, "forward", None)
        return any(
            base in RobustTracer._registered_leaves and forward is getattr(base, "forward", None)
            for base in module_type.__mro__
        )

    # status

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        """Failed and registered modules are leaves, then as in CustomTracer."""
        if m in self.robust_state.failures or self.is_registered_leaf(m):
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def is_failed(self, m: torch.nn.Module) -> bool:
        """Whether tracing into ``m`` failed during the last :meth:`trace`."""
        return m in self.robust_state.failures

    def failure_msg(self, m: torch.nn.Module) -> str | None:
        """``"<ExceptionType>: <message>"`` of the failure of ``m``, None if it did not fail."""
        failure = self.robust_state.failures.get(m)
        return None if failure is None else str(failure)

    def failure(self, m: torch.nn.Module) -> ModuleFailure | None:
        """The :class:`~yobx.torch.tracing.robust.collection.ModuleFailure` of ``m`` or None."""
        return self.robust_state.failures.get(m)

    @property
    def failures(self) -> dict[str, ModuleFailure]:
        """Failures of the last :meth:`trace` by module path (``""`` is the root)."""
        return {f.path: f for f in self.robust_state.failures.values()}

    def is_unvisited(self, m: torch.nn.Module) -> bool:
        """Whether ``m`` (a submodule of the root) was never called in the final trace."""
        return m in self.robust_state.unvisited

    def unvisited_modules(self) -> dict[str, torch.nn.Module]:
        """Unvisited modules of the last :meth:`trace` by path."""
        return {path: m for m, path in self.robust_state.unvisited.items()}

    def called_modules(self) -> dict[torch.nn.Module, tuple[str, bool]]:
        """Modules called in the final trace: ``{module: (path, is_leaf)}``."""
        return {
            m: (path, m in self.robust_state.leaves_called)
            for m, path in self.robust_state.called.items()
        }

    def record_call_module(
        self, m: torch.nn.Module, e: BaseException | None = None
    ) -> ModuleFailure | None:
        """Records that the traced code called ``m``; with ``e``, that tracing into it failed.

        :return: the failure recorded for ``e``, else None
        """
        path = self._path(m)
        self.robust_state.called.setdefault(m, path)
        if e is None:
            return None
        failure = ModuleFailure(
            path=path,
            type_name=type(m).__name__,
            error_type=type(e).__name__,
            message=str(e).strip() or repr(e),
            location=failure_location(e),
        )
        self.robust_state.failures.setdefault(m, failure)
        return failure

    def _path(self, m: torch.nn.Module) -> str:
        if m is self.robust_state.root:
            return ""
        try:
            path = self.path_of_module(m)
        except NameError:
            return type(m).__name__
        return path

    # tracing

    # narrower than CustomTracer.trace on purpose: a module, not any callable (its
    # submodules are what become leaves)
    def trace(  # type: ignore[override]
        self,
        root: torch.nn.Module,
        concrete_args: dict[str, Any] | None = None,
        dynamic_shapes: Any = None,
        **kwargs: Any,
    ) -> torch.fx.Graph:
        """Traces ``root``, making leaves of the submodules that cannot be traced.

        :param root: the model
        :param concrete_args: example input per parameter name (see CustomTracer)
        :param dynamic_shapes: torch.export's format (see CustomTracer)
        :param kwargs: other arguments of :meth:`CustomTracer.trace`
            (``remove_inplace``, ``verbose``)
        :return: the graph; run it with ``torch.fx.GraphModule(tracer.traced_model, graph)``
        :raises TypeError, ValueError: for a root that is not a module or inputs that do
            not match its signature or ``dynamic_shapes`` (nothing is traced then)
        :raises TraceError: when the root cannot even be run as a leaf on fake tensors
            or on the example
        """
        if not isinstance(root, torch.nn.Module):
            raise TypeError(
                f"RobustTracer.trace expects a torch.nn.Module, got {type(root).__name__}; "
                f"use CustomTracer for plain callables"
            )
        flatten_example_inputs(
            bind_example_inputs(root.forward, concrete_args), dynamic_shapes, SymbolicDimensions()
        )
        # recursive_trace shares its eager run; otherwise it is made when first needed
        self.robust_state = RobustTraceState(root, self._shared_recording)
        while True:
            self.robust_state.start_attempt()
            count = len(self.robust_state.failures)
            leaf_root = root in self.robust_state.failures or self.is_registered_leaf(root)
            traced = _leaf_root_wrapper(root) if leaf_root else root
            try:
                graph = super().trace(
                    traced, concrete_args, dynamic_shapes=dynamic_shapes, **kwargs
                )
            except _NeedExampleRun:
                self.robust_state.recording = record_calls(
                    root, *example_call(root.forward, concrete_args)
                )
                continue
            except _ModuleFailed:
                if len(self.robust_state.failures) == count:  # pragma: no cover - defensive
                    raise RuntimeError("a module failure was signalled but not recorded") from None
                continue
            except Exception as e:
                if leaf_root:
                    reason = self.failure_msg(root) or "it is a registered leaf"
                    raise TracingError.at(
                        failure_location(e),
                        f"{type(root).__name__} cannot be traced ({reason}) and running it "
                        f"as a leaf failed too: {type(e).__name__}: {e}",
                    ) from e
                self.record_call_module(root, e)
                continue
            self._collect_unvisited(traced)
            return graph

    def call_module(self, m, forward, args, kwargs):
        """Traces into ``m``; if that raises, records the failure and restarts the trace."""
        if self.state.in_fake:
            return forward(*args, **kwargs)
        if m is self.robust_state.root:
            # the root of a leaf-root wrapper
            self.robust_state.called.setdefault(m, "")
            self.robust_state.leaves_called[m] = ""
            self.robust_state.leaf_call_count[m] = self.robust_state.leaf_call_count.get(m, 0) + 1
            return super().call_module(m, forward, args, kwargs)
        name = self.path_of_module(m)
        self.record_call_module(m)
        if self.is_leaf_module(m, name):
            self.robust_state.leaves_called[m] = self.robust_state.called[m]
            self.robust_state.leaf_call_count[m] = self.robust_state.leaf_call_count.get(m, 0) + 1
            return super().call_module(m, forward, args, kwargs)
        try:
            return super().call_module(m, forward, args, kwargs)
        except _Restart:
            raise
        except Exception as e:
            self.record_call_module(m, e)
            raise _ModuleFailed(self.robust_state.called[m]) from e

    def _collect_unvisited(self, traced: torch.nn.Module) -> None:
        root = self.robust_state.root
        assert root is not None, "called at the end of a trace, which set its root"
        leaf_paths = list(self.robust_state.leaves_called.values())
        if "" in leaf_paths:
            return
        called_paths = list(self.robust_state.called.values())
        for path, m in root.named_modules():
            if m is root or m in self.robust_state.called:
                continue
            if any(path.startswith(p + ".") for p in leaf_paths):
                continue
            if is_container(m) and any(c.startswith(path + ".") for c in called_paths):
                continue
            self.robust_state.unvisited[m] = path

    # leaves on fake tensors

    def _is_opaque(self, m: torch.nn.Module) -> bool:
        return m in self.robust_state.failures or self.is_registered_leaf(m)

    def _run_leaf_module(self, target: str, args, kwargs) -> Any:
        module = self.root.get_submodule(target)
        if not self._is_opaque(module):
            return super()._run_leaf_module(target, args, kwargs)
        path = self.robust_state.called.get(module, target)
        try:
            # The module runs eagerly in the graph; on fake tensors it follows the
            # example's branches. Its decisions must not narrow what is known about the
            # dimensions for the rest of the graph: guards are suppressed, and the
            # resulting output shapes are reported as one assumption.
            with self.shape_env.suppress_guards():
                output = super()._run_leaf_module(target, args, kwargs)
        except Exception:
            output = self._example_output(module, args, kwargs)
            if output is None:
                raise
        else:
            symbolic = any(
                isinstance(d, torch.SymInt)
                for t in pytree.tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor)
                for d in t.shape
            )
            if symbolic:
                shapes_text = ", ".join(
                    f"[{', '.join(self.trace_dims().render(d) for d in t.shape)}]"
                    for t in pytree.tree_leaves(output)
                    if isinstance(t, torch.Tensor)
                )
                self.guards.append(
                    Guard(
                        f"output shapes of {path or '<root>'} == {shapes_text}",
                        True,
                        "specialized",
                        self.location(),
                    )
                )
            return output
        shapes = [tuple(t.shape) for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
        shapes_text = ", ".join(str(list(s)) for s in shapes)
        self.guards.append(
            Guard(f"output shapes of {path or '<root>'} == {shapes_text}", True, "example")
        )
        return pytree.tree_map(
            lambda t: self.trace_dims().from_real(t) if isinstance(t, torch.Tensor) else t, output
        )

    def _example_output(self, module: torch.nn.Module, args, kwargs) -> Any:
        """The output of the same call in the eager run, if its input shapes match."""
        if self.robust_state.recording is None:
            raise _NeedExampleRun()
        calls = self.robust_state.recording.get(module, [])
        index = self.robust_state.leaf_call_count.get(module, 1) - 1
        if index >= len(calls):
            return None
        call = calls[index]
        fake = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        real = [
            t for t in pytree.tree_leaves((call.args, call.kwargs)) if isinstance(t, torch.Tensor)
        ]
        if len(fake) != len(real):
            return None
        for f, r in zip(fake, real):
            if f.dtype != r.dtype or [self.trace_dims().hint(d) for d in f.shape] != list(r.shape):
                return None
        return call.output


__all__ = ["RobustTracer", "is_container"]
