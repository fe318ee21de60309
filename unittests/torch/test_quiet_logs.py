"""Loggers quieted for a block and restored after it, also after an error."""

import logging

import pytest

from yobx.torch.quiet_logs import quieted


def test_logger_is_quiet_inside_and_restored_after_an_error(caplog):
    logger = logging.getLogger("yobx.test.quieted")
    logger.setLevel(logging.INFO)
    with pytest.raises(RuntimeError), quieted("yobx.test.quieted"):
        logger.warning("hidden")
        raise RuntimeError("boom")
    logger.warning("shown")
    assert [r.getMessage() for r in caplog.records if r.name == logger.name] == ["shown"]
    assert logger.level == logging.INFO
