"""The pytree registrations are restored after each module of this folder.

transformers' exporters register their own flattening of caches (it keeps every
attribute of a cache layer) in place of yobx's. The tests here run them; a module run
after them in the same process (pytest-xdist groups modules at random) would otherwise
trace caches with transformers' flattening, which no test outside this folder is
written for.
"""

import pytest

from unittests.pytree_registrations import pytree_registrations_restored


@pytest.fixture(autouse=True, scope="module")
def _pytree_registrations_restored():
    with pytree_registrations_restored():
        yield
