"""The C slots of a class saved before a trace patches its special methods, written
back after: into classes that are still alive."""

import gc
import weakref

import torch

from yobx.torch.tracing.type_slots import restore_slots, saved_slots


def test_a_subclass_dropped_during_a_trace_lives_until_its_slots_are_written_back():
    # a model may make a tensor subclass and drop it while a trace runs: writing its
    # saved slots back into freed memory corrupted the heap (a worker of the test
    # suite crashed later, in unrelated sympy code)
    class Temporary(torch.Tensor):
        pass

    alive = weakref.ref(Temporary)
    saved = saved_slots([torch.Tensor])
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
    # the tables written back, torch.tensor([...]) of 0-d tensors raises "len() of a
    # 0-d tensor"
    saved = saved_slots([torch.Tensor])
    original = torch.Tensor.__getitem__
    torch.Tensor.__getitem__ = lambda self, index: original(self, index)
    del torch.Tensor.__getitem__
    restore_slots(saved)
    assert torch.equal(torch.tensor([torch.tensor(1), torch.tensor(2)]), torch.tensor([1, 2]))
