"""The sequence slots of a class, saved before a special method is patched on it and
put back after.

CPython keeps a class's special methods twice: in its ``__dict__`` and in C slots of
its type object, which C code calls directly. Four special methods have two slots, one
in the mapping table and one in the sequence table: ``__len__``, ``__getitem__``,
``__setitem__`` and ``__delitem__``. Setting ``torch.Tensor.__getitem__`` (as the
tracer does while a trace runs, see :mod:`..core.proxy_patches`) fills both the mapping slot
(``mp_subscript``) and the sequence slot (``sq_item``) with generic dispatchers;
deleting it again restores the ``__dict__`` and the mapping slot but not the sequence
slot, which ``torch.Tensor`` never had: its C base class only answers to mapping
subscripts, and when both twins are filled before an update, CPython fills the sequence
twin again with the generic dispatcher.
Every tensor then passes ``PySequence_Check``, and C code that asks it treats a tensor
as a list: after one trace, ``torch.tensor([torch.tensor(1), torch.tensor(2)])`` raised
"len() of a 0-d tensor" in eager code, anywhere in the process (Qwen2-VL's rotary
positions do that). The same holds for every subclass (``nn.Parameter``...), whose
slots follow their base's.

:func:`saved_slots` reads, for each patched ``(class, name)`` among those four names,
the sequence slot of that name in the class and in its subclasses; :func:`restore_slots`
writes each pointer back, one aligned word at a time, with the interpreter lock held
(no other thread runs while a slot is written). Nothing else is read or written: the
mapping slots and every other special method are restored by CPython itself, and the
classes whose other special methods the tracer patches (``Module.__setattr__``,
``HigherOrderOperator.__call__``) are not touched. Only heap types are (the classes
defined in Python, whose sequence table lies inside the type object), and only on a
CPython whose type layout is the one read here (checked on the class's own name);
elsewhere nothing is saved and the slots stay as CPython leaves them.
"""

from __future__ import annotations

import ctypes
import sys
import sysconfig

_WORD = ctypes.sizeof(ctypes.c_void_p)
#: positions, in words, of ``tp_name`` and ``tp_as_sequence`` in a ``PyTypeObject`` of
#: CPython 3.10 to 3.14 (default build)
_NAME, _AS_SEQUENCE = 3, 13
#: pointers in ``PySequenceMethods``
_SEQUENCE_TABLE_WORDS = 10
#: the special methods with a twin in the sequence table, and the position (in words)
#: of that twin in ``PySequenceMethods`` (``sq_length``, ``sq_item``, ``sq_ass_item``)
SEQUENCE_TWINS = {"__len__": 0, "__getitem__": 3, "__setitem__": 5, "__delitem__": 5}
_HEAP_TYPE = 1 << 9

#: (the class, the address of one of its sequence slots, the slot's value): the class
#: is held so that it lives until the slot is written back (a subclass made and dropped
#: by the model, collected while the patches hold, would have its freed memory
#: overwritten)
Saved = list[tuple[type, int, int]]


def _layout_known() -> bool:
    return sys.implementation.name == "cpython" and not sysconfig.get_config_var("Py_GIL_DISABLED")


def _word(address: int) -> int:
    return ctypes.c_void_p.from_address(address).value or 0


def _sequence_table(cls: type) -> int | None:
    """The address of the sequence table of one heap type, when it lies inside its type
    object."""
    if not cls.__flags__ & _HEAP_TYPE:
        return None
    name = ctypes.c_char_p.from_address(id(cls) + _NAME * _WORD).value
    if name is None or name.decode(errors="replace").rsplit(".", 1)[-1] != cls.__name__:
        return None  # not the layout read here
    address = _word(id(cls) + _AS_SEQUENCE * _WORD)
    end = id(cls) + type(cls).__sizeof__(cls)
    if id(cls) < address and address + _SEQUENCE_TABLE_WORDS * _WORD <= end:
        return address
    return None


def _with_subclasses(cls: type) -> list[type]:
    found, pending = [], [cls]
    while pending:
        current = pending.pop()
        if current not in found:
            found.append(current)
            pending.extend(type.__subclasses__(current))
    return found


def saved_slots(patched: list[tuple[type, str]]) -> Saved:
    """The sequence slots that the special methods ``patched`` (``(class, name)``) have
    a twin in, in each class and in its subclasses."""
    if not _layout_known():
        return []
    saved: Saved = []
    addresses: set[int] = set()
    for owner, name in patched:
        position = SEQUENCE_TWINS.get(name)
        if position is None:
            continue
        for cls in _with_subclasses(owner):
            table = _sequence_table(cls)
            address = None if table is None else table + position * _WORD
            if address is not None and address not in addresses:
                addresses.add(address)
                saved.append((cls, address, _word(address)))
    return saved


def restore_slots(saved: Saved) -> None:
    """Writes back the slots :func:`saved_slots` read (an aligned pointer each, written
    by ctypes without releasing the interpreter lock)."""
    for _cls, address, value in saved:
        ctypes.c_void_p.from_address(address).value = value or None
