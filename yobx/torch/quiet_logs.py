"""Loggers of the libraries the exporter calls, quieted for a block."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def quieted(name: str, level: int = logging.ERROR) -> Iterator[None]:
    """Raises the level of the logger ``name`` to ``level`` inside the block (restored
    on exit): for warnings repeated per node or per operator that a user cannot act on."""
    logger = logging.getLogger(name)
    previous = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)


__all__ = ["quieted"]
