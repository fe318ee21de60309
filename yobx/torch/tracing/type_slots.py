"""The C slots of a class, saved before a special method is patched on it and put back
after.

CPython keeps a class's special methods twice: in its ``__dict__`` and in C slots of
its type object, which C code calls directly. Setting ``torch.Tensor.__getitem__``
(as the tracer does while a trace runs, see :mod:`.patches`) fills both the mapping
slot (``mp_subscript``) and the sequence slot (``sq_item``) with generic dispatchers;
deleting it again restores the ``__dict__`` but not the sequence slot, which
``torch.Tensor`` never had: its C base class only answers to mapping subscripts. Every
tensor then passes ``PySequence_Check``, and C code that asks it treats a tensor as a
list: after one trace, ``torch.tensor([torch.tensor(1), torch.tensor(2)])`` raised
"len() of a 0-d tensor" in eager code, anywhere in the process (Qwen2-VL's rotary
positions do that). The same holds for every subclass (``nn.Parameter``...), whose
slots follow their base's.

:func:`saved_slots` copies the sequence and mapping slot tables of a class and of its
subclasses, :func:`restore_slots` writes them back. Only heap types are touched (the
classes defined in Python, whose tables live inside the type object), and only on a
CPython whose type layout is the one read here (checked on the class's own name);
elsewhere nothing is saved and the slots stay as CPython leaves them.
"""

from __future__ import annotations

import ctypes
import sys
import sysconfig

_WORD = ctypes.sizeof(ctypes.c_void_p)
#: positions, in words, of ``tp_name``, ``tp_as_sequence`` and ``tp_as_mapping`` in a
#: ``PyTypeObject`` of CPython 3.10 to 3.14 (default build)
_NAME, _AS_SEQUENCE, _AS_MAPPING = 3, 13, 14
#: pointers in ``PySequenceMethods`` and ``PyMappingMethods``
_TABLES = ((_AS_SEQUENCE, 10), (_AS_MAPPING, 3))
_HEAP_TYPE = 1 << 9

#: (the class, the address of one of its slot tables, the table's bytes): the class is
#: held so that it lives until the tables are written back (a subclass made and dropped
#: by the model, collected while the patches hold, would have its freed memory
#: overwritten, a crash much later anywhere in the process)
Saved = list[tuple[type, int, bytes]]


def _layout_known() -> bool:
    return sys.implementation.name == "cpython" and not sysconfig.get_config_var("Py_GIL_DISABLED")


def _word(cls: type, position: int) -> int:
    return ctypes.c_void_p.from_address(id(cls) + position * _WORD).value or 0


def _tables(cls: type) -> Saved:
    """The slot tables of one heap type, when they lie inside its type object."""
    if not cls.__flags__ & _HEAP_TYPE:
        return []
    name = ctypes.c_char_p.from_address(id(cls) + _NAME * _WORD).value
    if name is None or name.decode(errors="replace").rsplit(".", 1)[-1] != cls.__name__:
        return []  # not the layout read here
    end = id(cls) + sys.getsizeof(cls)
    saved = []
    for position, count in _TABLES:
        address = _word(cls, position)
        if id(cls) < address and address + count * _WORD <= end:
            saved.append((cls, address, ctypes.string_at(address, count * _WORD)))
    return saved


def _with_subclasses(cls: type) -> list[type]:
    found, pending = [], [cls]
    while pending:
        current = pending.pop()
        if current not in found:
            found.append(current)
            pending.extend(type.__subclasses__(current))
    return found


def saved_slots(classes: list[type]) -> Saved:
    """The sequence and mapping slot tables of ``classes`` and of their subclasses."""
    if not _layout_known():
        return []
    saved: Saved = []
    for cls in classes:
        for current in _with_subclasses(cls):
            saved.extend(_tables(current))
    return saved


def restore_slots(saved: Saved) -> None:
    """Writes back the tables :func:`saved_slots` copied."""
    for _cls, address, data in saved:
        ctypes.memmove(address, data, len(data))
