"""The sequence slots of a class saved before a trace patches its special methods,
written back after: into classes that are still alive, and nowhere else."""

import gc
import weakref

import torch

from yobx.torch.tracing import CustomTracer
from yobx.torch.tracing.isolation.type_slots import restore_slots, saved_slots


def test_a_subclass_dropped_during_a_trace_lives_until_its_slots_are_written_back():
    # a model may make a tensor subclass and drop it while a trace runs: writing its
    # saved slots back into freed memory would corrupt the heap
    class Temporary(torch.Tensor):
        pass

    alive = weakref.ref(Temporary)
    saved = saved_slots([(torch.Tensor, "__getitem__")])
    if not saved:  # a CPython whose type layout is not the one read (nothing saved)
        return
    assert any(entry[0] is Temporary for entry in saved)
    del Temporary
    gc.collect()
    assert alive() is not None
    restore_slots(saved)
    del saved
    gc.collect()
    assert alive() is None


def test_written_back_slots_keep_tensors_out_of_the_sequence_protocol():
    # setting and deleting __getitem__ leaves CPython's sequence slot filled: without
    # the slot written back, torch.tensor([...]) of 0-d tensors raises "len() of a
    # 0-d tensor"
    saved = saved_slots([(torch.Tensor, "__getitem__")])
    original = torch.Tensor.__getitem__
    torch.Tensor.__getitem__ = lambda self, index: original(self, index)
    del torch.Tensor.__getitem__
    restore_slots(saved)
    assert torch.equal(torch.tensor([torch.tensor(1), torch.tensor(2)]), torch.tensor([1, 2]))
    assert torch.equal(torch.arange(4)[1:3], torch.tensor([1, 2]))


def test_only_the_sequence_twins_of_patched_names_are_saved():
    # one pointer per class and name: the special methods without a sequence twin
    # (Module.__setattr__, __call__) and the mapping slots are CPython's to restore
    assert saved_slots([(torch.nn.Module, "__setattr__")]) == []
    saved = saved_slots([(torch.Tensor, "__getitem__"), (torch.Tensor, "__setitem__")])
    tensor_classes = {entry[0] for entry in saved}
    assert torch.Tensor in tensor_classes or not saved
    assert len(saved) <= 2 * len(tensor_classes)


def test_a_trace_leaves_tensors_out_of_the_sequence_protocol():
    class Model(torch.nn.Module):
        def forward(self, x):
            return x[: x.shape[0] // 2] + torch.arange(8.0)[: x.shape[0] // 2, None]

    CustomTracer().trace(Model(), (torch.randn(6, 3),), dynamic_shapes=({0: "n"},))
    assert torch.equal(torch.tensor([torch.tensor(1), torch.tensor(2)]), torch.tensor([1, 2]))
