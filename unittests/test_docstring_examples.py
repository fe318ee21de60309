"""The examples in the docstrings of the main entry points run and print what they say."""

from __future__ import annotations

import doctest

import pytest

from yobx.torch.inspect import record_run
from yobx.torch.passes import (
    graph_erase_node,
    remove_batch_dim_nodes,
    remove_inplace,
    remove_unnecessary_slices,
    run_default_passes,
)
from yobx.torch.tracing import CustomTracer, recursive_trace

ENTRY_POINTS = [
    CustomTracer.trace,
    recursive_trace,
    record_run,
    remove_inplace,
    remove_unnecessary_slices,
    remove_batch_dim_nodes,
    graph_erase_node,
    run_default_passes,
]


@pytest.mark.parametrize("function", ENTRY_POINTS, ids=lambda f: f.__qualname__)
def test_docstring_example_runs(function):
    tests = doctest.DocTestFinder(recurse=False).find(function, function.__qualname__)
    assert tests and tests[0].examples, f"{function.__qualname__} has no example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0 and result.attempted > 0, result
