"""What yobx relies on from torch.onnx's private exporter internals, the dimension
names, output names and error messages."""

import pytest
import sympy
import torch
import torch.utils._pytree as pytree

from yobx.torch.onnx import OnnxExportError, UnsupportedOperatorError, to_onnx
from yobx.torch.onnx import _torch_onnx_internals as internals
from yobx.torch.onnx.capture import output_names
from yobx.torch.onnx.dimensions import DimensionRenamer


def test_registry_has_what_we_dispatch_to():
    from yobx.torch.ops import rnn

    rnn.operators()  # defined the first time a process needs them (run alone: now)
    # the registry the translation reads: the one built once per process, with the
    # custom operators defined since (another test may have built it before them)
    registry = internals._registry_with_custom_operators(18)
    for op in (
        torch.ops.aten.linear.default,
        torch.ops.aten.scaled_dot_product_attention.default,
        torch.ops.aten.layer_norm.default,
        torch.ops.higher_order.cond,
        torch.ops.higher_order.scan,
        torch.ops.yobx.lstm.default,
        torch.ops.yobx.gru.default,
    ):
        assert registry.is_registered(op), op
    table = internals.decomposition_table(18)
    # Decomposed only when torch_lib lacks them.
    assert torch.ops.aten.addmm.default not in table


def test_torchlib_ops_read_as_onnxscript_reads_them():
    # the registry is built from a cheaper get_torchlib_ops (no signature parsed): the
    # same functions, names and domains, in the same order
    from torch.onnx._internal.exporter import _registration

    def key(metas):
        return [(m.qualified_name, m.function, m.domain, m.name, m.is_complex) for m in metas]

    expected = _registration.onnxscript_apis.get_torchlib_ops()
    assert key(internals._torchlib_ops()) == key(expected)


def test_signatures_are_inferred_when_a_function_is_translated():
    # the registry is built without inferring its ~600 signatures; a translated
    # function gets its own from the graph builder, and the model is right
    from torch.onnx._internal.exporter import _registration

    registry = internals.onnx_registry(18)
    # addcmul: an onnxscript function (not traced: its signature binds the inputs)
    (entry,) = registry.get_decomps(torch.ops.aten.addcmul.default)
    assert entry.signature is None
    assert _registration.OnnxDecompMeta is not internals._UnsignedDecompMeta

    class AddCMul(torch.nn.Module):
        def forward(self, x, y):
            return torch.addcmul(x, x, y, value=0.5)

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    result = to_onnx(AddCMul(), (x, y), dynamic_shapes=({0: "n"}, {0: "n"}), validate=True)
    assert result.validation.ok, result.validation.format()
    assert getattr(entry.onnx_function, "_pt_onnx_signature", None) is not None


def test_composite_ops_preserved_and_restored():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        return torch.nn.functional.linear(x, w)

    x, w = torch.randn(2, 3), torch.randn(4, 3)
    with internals.preserve_translatable_composite_ops(18):
        graph = make_fx(f)(x, w).graph
    assert any(n.target is torch.ops.aten.linear.default for n in graph.nodes)
    # Outside the context, make_fx decomposes as usual: the patch was undone.
    graph = make_fx(f)(x, w).graph
    assert not any(n.target is torch.ops.aten.linear.default for n in graph.nodes)


def test_preserved_composite_ops_are_torch_onnxs():
    """Found from the registry's names, the operators kept whole are those torch.onnx
    keeps: every valid CompositeImplicitAutograd operator the registry translates."""
    from torch._export.utils import _collect_all_valid_cia_ops

    registry = internals.onnx_registry(18)
    theirs = {op for op in _collect_all_valid_cia_ops() if registry.is_registered(op)}
    ours = internals._preserved_composite_ops(18)
    assert len(ours) == len(set(ours))
    assert set(ours) == theirs
    assert torch.ops.aten.linear.default in theirs


def test_composite_override_matches_torch_export_and_restores():
    """Our direct writes into the kernel tables install what torch.export's
    _override_composite_implicit_decomp installs, and leave every table and fake rule
    as they were."""
    from torch._subclasses import fake_impls
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.export.exported_program import _override_composite_implicit_decomp

    kernels = internals._preserving_kernels(18)
    ops = list(kernels)
    before = {op: dict(op.py_kernels) for op in ops}
    rules_before = dict(fake_impls.op_implementations_dict)
    with _override_composite_implicit_decomp(kernels):
        theirs = {op: set(op.py_kernels) for op in ops}
        their_rules = {op for op in ops if fake_impls._is_op_registered_to_fake_rule(op)}
    # torch's exit drops fake rules that existed before: put them back
    fake_impls.op_implementations_dict.update(rules_before)
    with internals._composite_kernels_overridden(kernels):
        ours = {op: set(op.py_kernels) for op in ops}
        our_rules = {op for op in ops if fake_impls._is_op_registered_to_fake_rule(op)}
        composite = torch._C.DispatchKey.CompositeImplicitAutograd
        assert all(op.py_kernels[composite] is kernels[op] for op in ops)
        # a fake tensor runs the decomposition: same result as eager
        x, w = torch.randn(2, 3), torch.randn(4, 3)
        with FakeTensorMode() as mode:
            out = torch.ops.aten.linear.default(mode.from_tensor(x), mode.from_tensor(w))
        assert out.shape == (2, 4)
    assert ours == theirs
    assert our_rules == their_rules
    assert {op: dict(op.py_kernels) for op in ops} == before
    assert dict(fake_impls.op_implementations_dict) == rules_before


def test_composite_override_restores_after_an_error():
    kernels = internals._preserving_kernels(18)
    before = {op: dict(op.py_kernels) for op in kernels}
    with pytest.raises(RuntimeError, match="inside"):
        with internals._composite_kernels_overridden(kernels):
            raise RuntimeError("inside")
    assert {op: dict(op.py_kernels) for op in kernels} == before


def test_op_signatures_memoized_only_while_translating():
    import onnx
    import onnx_ir as ir

    original = ir.schemas.OpSignature.from_op_schema
    schema = onnx.defs.get_schema("Slice", 13)
    with internals._op_signatures_memoized():
        first = ir.schemas.OpSignature.from_op_schema(schema)
        assert ir.schemas.OpSignature.from_op_schema(schema) is first
    assert ir.schemas.OpSignature.from_op_schema == original
    fresh = ir.schemas.OpSignature.from_op_schema(schema)
    assert fresh is not first
    assert [p.name for p in fresh.params] == [p.name for p in first.params]


def test_dimension_renamer_simplifies_with_user_names():
    renamer = DimensionRenamer({"s1": "seq", "s2": "past"})
    assert renamer.rename("s1 + s2") in ("past+seq", "seq+past")
    assert renamer.rename("2*s1") == "2*seq"
    assert renamer.rename("s1 + s1") == "2*seq"
    assert renamer.rename("s9") == "s9"
    assert renamer.expression(sympy.Symbol("s2") + 1) == "past+1"


def test_output_names_readable():
    spec = pytree.tree_structure({"logits": 0, "past": [(1, 2)]})
    assert output_names(spec, 3) == ["logits", "past_0_0", "past_0_1"]
    assert output_names(pytree.tree_structure((0, 1)), 2) == ["output_0", "output_1"]
    assert output_names(pytree.tree_structure(0), 1) == ["output"]


def test_unsupported_operator_names_node_and_source_line():
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.special.zeta(x, x + 1)

    with pytest.raises(UnsupportedOperatorError) as info:
        to_onnx(Model(), (torch.rand(3, 4) + 1,), dynamic_shapes={"x": {0: "batch"}})
    assert isinstance(info.value, OnnxExportError)
    message = str(info.value)
    assert "zeta" in message
    assert "node 'special_zeta'" in message
    assert "test_onnx_internals.py" in message
    assert "torch.special.zeta(x, x + 1)" in message


def test_parameters_are_named_initializers_and_profile(tmp_path):
    model = torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.ReLU())
    profile = tmp_path / "stages.json"
    result = to_onnx(
        model,
        (torch.randn(2, 4),),
        dynamic_shapes={"input": {0: "batch"}},
        filename=tmp_path / "m.onnx",
        profile=str(profile),
    )
    initializers = {i.name for i in result.model_proto.graph.initializer}
    assert {"0.weight", "0.bias"} <= initializers
    assert (tmp_path / "m.onnx").exists()
    assert profile.exists() and "capture" in profile.read_text()
