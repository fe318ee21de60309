"""What a pass returns: an int (the seed's convention) carrying what was done and why not."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    """A node a pass left as it was.

    :param node: name of the node
    :param reason: why it could not be rewritten, with the user's source line
    """

    node: str
    reason: str

    def __str__(self) -> str:
        return self.reason


class PassResult(int):
    """The result of a pass, usable as the int the passes always returned.

    Its int value is the number of rewritten or removed nodes, or ``-k`` when ``k``
    nodes could not be rewritten (passes called with ``exc=False``).

    :param name: the pass
    :param count: nodes rewritten or removed
    :param refused: what could not be rewritten and why
    """

    name: str
    count: int
    refused: tuple[Refusal, ...]

    def __new__(cls, name: str, count: int, refused: tuple[Refusal, ...] = ()) -> PassResult:
        value = -len(refused) if refused else count
        result = super().__new__(cls, value)
        result.name = name
        result.count = count
        result.refused = tuple(refused)
        return result

    @property
    def modified(self) -> bool:
        """True if the pass changed the graph."""
        return self.count > 0

    def __repr__(self) -> str:
        refused = f", refused={len(self.refused)}" if self.refused else ""
        return f"PassResult({self.name!r}, count={self.count}{refused})"

    def summary(self) -> str:
        """One line per refusal after a headline, for logs and error messages."""
        lines = [f"{self.name}: {self.count} node(s) changed, {len(self.refused)} refused"]
        lines.extend(f"  - {r.reason}" for r in self.refused)
        return "\n".join(lines)
