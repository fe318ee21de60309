"""Key paths of containers registered with or without ``flatten_with_keys_fn``."""

import collections

import torch
import torch.utils._pytree as pytree

from yobx.torch.pytree_paths import flatten_with_paths


class Named(collections.OrderedDict):
    """A container registered as diffusers registers its outputs: no key paths."""


class Bare:
    def __init__(self, *items):
        self.items = list(items)


pytree.register_pytree_node(
    Named, lambda n: (list(n.values()), list(n.keys())), lambda v, k: Named(zip(k, v))
)
pytree.register_pytree_node(Bare, lambda b: (b.items, None), lambda v, _: Bare(*v))


def test_paths_as_torch_gives_them_and_for_containers_without_keys():
    a, b, c = torch.zeros(1), torch.ones(1), torch.ones(2)
    tree = {"x": [a, (b,)], "y": c}
    assert flatten_with_paths(tree) == pytree.tree_flatten_with_path(tree)[0]
    paths = flatten_with_paths({"out": Named(sample=a, hidden=Bare(b, c))})
    assert [pytree.keystr(p) for p, _ in paths] == [
        "['out']['sample']",
        "['out']['hidden'][0]",
        "['out']['hidden'][1]",
    ]
    assert [leaf for _, leaf in paths] == [a, b, c]
