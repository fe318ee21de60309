"""torch_lib imported with its translations deferred: each one, made when asked for,
equals onnxscript's, and nothing stays patched."""

import subprocess
import sys
import textwrap

# run in a process of its own: the test process may have imported torch_lib already
# (then import_torch_lib leaves it as it is)
_CHECK = textwrap.dedent(
    """
    import sys
    import onnxscript
    import torch
    from onnxscript._internal import main, values
    from onnxscript.ir import _schemas

    init = values.TracedOnnxFunction.__init__
    from yobx.torch.onnx import lazy_torch_lib

    lazy_torch_lib.import_torch_lib()
    from onnxscript.function_libs.torch_lib import registration

    # the patches are gone
    assert onnxscript.script is main.script
    assert values.TracedOnnxFunction.__init__ is init

    functions = {
        id(f): f
        for overloads in registration.default_registry.values()
        for f in (*overloads.overloads, *overloads.complex)
    }
    scripted = [f for f in functions.values() if not isinstance(f, values.TracedOnnxFunction)]
    traced = [f for f in functions.values() if isinstance(f, values.TracedOnnxFunction)]
    assert len(scripted) > 40 and len(traced) > 300, (len(scripted), len(traced))
    assert all(isinstance(f, lazy_torch_lib.DeferredOnnxFunction) for f in scripted)
    assert all(isinstance(f, lazy_torch_lib.DeferredTracedOnnxFunction) for f in traced)
    # nothing translated yet
    assert not any("_compiled" in vars(f) or f._signature is not None for f in scripted)
    assert not any(f._signature is not None for f in traced)

    def same_signature(a, b):
        return str(a) == str(b)

    for f in scripted:
        eager = onnxscript.script(f.opset)(f.function)
        assert f.function_ir.to_function_proto() == eager.to_function_proto(), f.name
        assert f.source == eager.source and f.name == eager.name, f.name
        assert f.to_function_proto() == eager.to_function_proto(), f.name
        assert same_signature(f.op_signature, eager.op_signature), f.name
    for f in traced:
        expected = _schemas.op_signature_from_function(f.func, domain="_traced", name=f.name)
        assert same_signature(f.op_signature, expected), f.name
    # an export in this process translates with them
    from yobx.torch.onnx import to_onnx

    class Model(torch.nn.Module):
        def forward(self, x, y):
            return torch.addcmul(x, x, y, value=0.5).logsumexp(-1) + torch.erf(y).sum(-1)

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    result = to_onnx(Model(), (x, y), dynamic_shapes=({0: "n"}, {0: "n"}), validate=True)
    assert result.validation.ok, result.validation.format()
    print("OK")
    """
)


def test_deferred_translations_equal_onnxscripts():
    done = subprocess.run(
        [sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]


def test_import_after_torch_lib_keeps_it():
    # torch_lib imported already (here or by transformers' exporter): left alone
    code = textwrap.dedent(
        """
        import onnxscript.function_libs.torch_lib.ops as ops
        from yobx.torch.onnx import lazy_torch_lib
        lazy_torch_lib.import_torch_lib()
        assert not isinstance(ops.core.aten_addcmul, lazy_torch_lib.DeferredOnnxFunction)
        print("OK")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]
