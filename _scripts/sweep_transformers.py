"""Sweep: every model class of the installed transformers for a task, built tiny, through
torch.export, yobx's tracer, yobx's ONNX export and torch.onnx, side by side.

Each architecture gets its configuration class with small sizes passed to ``__init__``
where it takes them, random weights (matrices initialised to zeros, such as routers,
get small random values: ties between experts would be broken differently by each
runtime), and inputs ``input_ids`` and ``attention_mask`` of
shape (2, 7) with dynamic batch and sequence. Each path captures at that size and is
compared with eager at another one (3, 11); the cache is off (``use_cache=False``), the
output compared is ``logits`` (or ``last_hidden_state``). A model of another family
(vision, audio, speech, encoder-decoder, vision-text) gets ``hf:``'s configuration,
inputs and dynamic dimensions instead (:func:`yobx.models.hf_families.hf_family_case`:
a dimension is dynamic where eager runs the model with it at another size)::

    python _scripts/sweep_transformers.py [--task causal-lm] [--limit N] [--timeout S]
                                          [--only PATHS] [NAME ...]

Every architecture runs in a forked process (a crash or a hang costs that line only).
A line per architecture, then the counts per path and the architectures torch.export
(or torch.onnx) takes and yobx (or yobx's ONNX) does not. Statuses: ``ok`` (exact at
the other size), ``WRONG`` (values differ: the worst outcome), ``UNSTABLE`` (values
differ only where eager in float64 differs from eager in float32 on the same inputs, or
the values are eager's with ``topk``'s ties broken by the lower index: eager's output is
not determined there, see :func:`unstable_reference` and
:func:`tie_broken_reference`), ``fail`` (an error, its first line), ``timeout``, ``-``
(eager itself fails on the tiny configuration).
"""

from __future__ import annotations

import argparse
import inspect
import math
import multiprocessing
import os
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PATHS = ("export", "yobx", "yobx-onnx", "torch-onnx")
EXAMPLE, OTHER = (2, 7), (3, 11)
TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_layers": 2,
    "n_layer": 2,
    "num_attention_heads": 4,
    "n_head": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 128,
    "max_position_embeddings": 128,
    "n_positions": 128,
    "n_embd": 32,
    "emb_dim": 32,
    "n_layers": 2,
    "n_heads": 4,
    "d_model": 32,
    "ffn_dim": 64,
    "n_inner": 64,
    "num_experts": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "sliding_window": 64,
    "attention_window": 8,
    "layer_types": None,
    "use_cache": False,
}
TASKS = {
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "base": "MODEL_MAPPING_NAMES",
}


def architectures(task: str) -> list[tuple[str, str]]:
    """``(model_type, class name)`` of every model the task's auto mapping lists."""
    from transformers.models.auto import modeling_auto

    mapping = getattr(modeling_auto, TASKS[task])
    result, seen = [], set()
    for model_type, names in mapping.items():
        for name in names if isinstance(names, (list, tuple)) else [names]:
            # several model types share a class (one line per class)
            if name not in seen:
                seen.add(name)
                result.append((model_type, name))
    return result


def build(model_type: str, name: str):
    """``(model, example, other, dims)``: the tiny model (eval mode, output as one
    tensor), its keyword inputs at the example's sizes and at other ones, and each
    input's dynamic dimensions by name. A text model gets ``input_ids`` and
    ``attention_mask``; a model of another family (vision, audio, encoder-decoder...)
    gets the inputs and dynamic dimensions of ``hf:`` (:mod:`yobx.models.hf_families`).
    """
    import transformers

    from yobx.models.hf_families import family_of, hf_family_case

    if family_of(getattr(transformers, name)) == "text":
        import torch

        try:
            case = _build_text(model_type, name)
            with torch.no_grad():
                case[0](**case[1])
                case[0](**case[2])
            return case
        except Exception:
            # the generic sizes do not fit this configuration (layer types listed per
            # layer, a padding index beyond the vocabulary...): hf:'s, shrunk from the
            # configuration's own values, may
            pass
    model, example, dims, other = hf_family_case(name)
    return _first_output(model, list(example)), example, other, dims


def tiny_kwargs(config_class) -> dict:
    """The sizes of :data:`TINY` the configuration class takes (all of them when its
    ``__init__`` takes ``**kwargs``), without the ``None`` ones."""
    accepted = inspect.signature(config_class.__init__).parameters
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    return {k: v for k, v in TINY.items() if v is not None and (k in accepted or takes_kwargs)}


def quiet_child() -> None:
    """A forked child: no warnings nor logs, one core (``SWEEP_THREADS``) so that the
    machine's other core stays free for the rest."""
    warnings.filterwarnings("ignore")
    import logging

    import torch

    logging.disable(logging.CRITICAL)
    torch.set_num_threads(int(os.environ.get("SWEEP_THREADS", "1")))


def _build_text(model_type: str, name: str):
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type](**tiny_kwargs(CONFIG_MAPPING[model_type]))
    for attribute in ("text_config", "decoder"):
        sub = getattr(config, attribute, None)
        if sub is not None and hasattr(sub, "hidden_size"):
            for key, value in TINY.items():
                if value is not None and hasattr(sub, key):
                    setattr(sub, key, value)
    torch.manual_seed(0)
    from yobx.models.hf_configs import spread_zero_matrices

    model = spread_zero_matrices(getattr(transformers, name)(config).eval())
    vocab = min(int(getattr(config, "vocab_size", 128) or 128), 128)

    def inputs(batch: int, seq: int) -> dict:
        generator = torch.Generator().manual_seed(batch * 100 + seq)
        ids = torch.randint(3, vocab, (batch, seq), generator=generator)
        return {"input_ids": ids, "attention_mask": torch.ones(batch, seq, dtype=torch.int64)}

    dims = {0: "batch", 1: "seq"}
    wrapped = _first_output(model, ["input_ids", "attention_mask"], use_cache=False)
    return wrapped, inputs(*EXAMPLE), inputs(*OTHER), {"input_ids": dims, "attention_mask": dims}


def _first_output(model, names: list[str], **fixed):
    """A module taking ``names`` as parameters (so that every exporter sees them by
    name) that returns the model's ``logits``, else ``last_hidden_state``, else its
    first output."""
    import torch

    def first(out):
        for key in ("logits", "last_hidden_state"):
            if key in out and out[key] is not None:
                return out[key]
        return out[0]

    namespace = {"first": first}
    parameters = ", ".join(names)
    passed = ", ".join(f"{n}={n}" for n in names)
    exec(
        f"def forward(self, {parameters}):\n    return first(self.model({passed}, **self.fixed))\n",
        namespace,
    )
    wrapper = type(
        "FirstOutput",
        (torch.nn.Module,),
        {"forward": namespace["forward"]},
    )()
    wrapper.model = model
    wrapper.fixed = fixed
    return wrapper


def _close(expected, got) -> bool:
    """Every tensor of ``expected`` (a tensor, or a tuple of them: a backbone's feature
    maps) close to ``got``'s (onnxruntime gives the first one only)."""
    import torch

    far = _far(expected, got)
    given = torch.utils._pytree.tree_leaves(got)
    return len(given) > 0 and all(f is not None and not f.any() for f in far)


def _max_diff(expected, got) -> float:
    """The largest difference between the first tensors of ``expected`` and ``got``."""
    import torch

    expected = torch.utils._pytree.tree_leaves(expected)[0]
    got = torch.as_tensor(torch.utils._pytree.tree_leaves(got)[0])
    if expected.shape != got.shape:
        return math.inf
    return float((expected.float() - got.float()).abs().max())


def _far(expected, got) -> list:
    """Per output tensor, where ``got`` is not close to ``expected`` (None for a tensor
    of another shape)."""
    import torch

    expected = torch.utils._pytree.tree_leaves(expected)
    got = [torch.as_tensor(g) for g in torch.utils._pytree.tree_leaves(got)]
    return [
        ~torch.isclose(e.float(), g.float(), atol=1e-3, rtol=1e-3, equal_nan=True)
        if e.shape == g.shape
        else None
        for e, g in zip(expected, got)
    ]


def unstable_reference(model, run, expected, got) -> float | None:
    """Whether eager itself is undetermined, to the sweep's tolerance, wherever ``got``
    differs from it.

    ``run(model, cast)`` calls ``model`` on the inputs with ``cast`` applied to each
    tensor. A float64 copy of the model runs them in float64. When every value where
    ``got`` differs from ``expected`` (eager in float32) also differs between eager in
    float32 and in float64, returns the largest of those differences: the model's
    outputs are not determined there (``topk`` over equal scores, a threshold met
    exactly), and the path is ``UNSTABLE``, not ``WRONG``. None otherwise, or when the
    copy cannot run in float64.
    """
    import copy

    import torch

    def to_double(value):
        is_float = isinstance(value, torch.Tensor) and value.is_floating_point()
        return value.double() if is_float else value

    try:
        double = copy.deepcopy(model).double()
        with torch.no_grad():
            reference = run(double, to_double)
    except Exception:
        return None
    wrong, unstable = _far(expected, got), _far(expected, reference)
    if not any(w is not None and w.any() for w in wrong):
        return None
    for w, u in zip(wrong, unstable):
        if w is None or u is None or (w & ~u).any():
            return None  # a difference where eager is determined
    return _max_diff(expected, reference)


def _stable_topk(values, k, dim=-1, largest=True, sorted=True):
    """``torch.topk`` breaking ties by the lower index, as ONNX's TopK specifies
    (torch's order of equal values is unspecified)."""
    import torch

    ordered, indices = torch.sort(values, dim=dim, descending=largest, stable=True)
    return torch.return_types.topk((ordered.narrow(dim, 0, k), indices.narrow(dim, 0, k)))


def tie_broken_reference(model, run):
    """Eager's outputs with every ``topk`` breaking ties by the lower index (ONNX's
    rule), None when the model cannot run so. A model whose output differs from
    eager's there depends on an order torch leaves unspecified (RT-DETR's query
    selection over equal scores from random weights)."""
    import torch

    originals = torch.topk, torch.Tensor.topk
    torch.topk = _stable_topk
    torch.Tensor.topk = _stable_topk
    try:
        with torch.no_grad():
            return run(model, lambda value: value)
    except Exception:
        return None
    finally:
        torch.topk, torch.Tensor.topk = originals


def compared(expected, got, model, run) -> str:
    """The status of a path's outputs ``got`` against eager's ``expected``: ``ok``,
    ``UNSTABLE`` (eager in float64 differs too wherever ``got`` does, see
    :func:`unstable_reference`; or ``got`` is eager's output with ``topk``'s ties broken
    by the lower index, see :func:`tie_broken_reference`) or ``WRONG``, with the
    largest difference."""
    if _close(expected, got):
        return "ok"
    difference = _max_diff(expected, got)
    unstable = unstable_reference(model, run, expected, got)
    if unstable is not None:
        return f"UNSTABLE: max diff {difference:.3g}, eager float64 {unstable:.3g}"
    tied = tie_broken_reference(model, run)
    if tied is not None and not _close(expected, tied) and _close(tied, got):
        return (
            f"UNSTABLE: max diff {difference:.3g}, exact against eager with topk's ties "
            f"broken by the lower index (ONNX's rule)"
        )
    return f"WRONG: max diff {difference:.3g}"


def _run_path(path: str, model, example: dict, other: dict, dims: dict) -> str:
    import torch

    with torch.no_grad():
        expected = model(**other)
    if path == "export":
        from torch.export import Dim

        dynamic = {n: {a: Dim.DYNAMIC for a in axes} for n, axes in dims.items()}
        program = torch.export.export(model, (), example, dynamic_shapes=dynamic)
        with torch.no_grad():
            got = program.module()(**other)
    elif path == "yobx":
        from yobx.torch.tracing import CustomTracer

        tracer = CustomTracer()
        graph = tracer.trace(model, concrete_args=dict(example), dynamic_shapes=dims)
        with torch.no_grad():
            got = torch.fx.GraphModule(tracer.traced_model, graph)(**other)
    else:
        got = _run_onnx(path, model, example, other, dims)
    return compared(
        expected, got, model, lambda m, cast: m(**{k: cast(v) for k, v in other.items()})
    )


def _run_onnx(path: str, model, example: dict, other: dict, dims: dict):
    """The first output of the ONNX model on ``other``; saved to a file first, so that
    models past 2 GB (their weights in external data) run too."""
    import tempfile

    import onnxruntime
    import torch

    with tempfile.TemporaryDirectory() as folder:
        filename = os.path.join(folder, "model.onnx")
        if path == "yobx-onnx":
            from yobx.torch.onnx import to_onnx

            to_onnx(model, (), example, dynamic_shapes=dims, filename=filename)
        else:
            from torch.export import Dim

            dynamic = {n: {a: Dim.DYNAMIC for a in axes} for n, axes in dims.items()}
            program = torch.onnx.export(
                model, (), kwargs=example, dynamic_shapes=dynamic, dynamo=True, verbose=False
            )
            program.save(filename, external_data=True)
        session = onnxruntime.InferenceSession(filename, providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        feeds = {n: t.numpy() for n, t in other.items() if n in names}
        return session.run(None, feeds)[0]


def _child(model_type: str, name: str, paths: list[str], queue) -> None:
    quiet_child()
    import torch

    results = {}
    try:
        model, example, other, dims = build(model_type, name)
        with torch.no_grad():
            model(**example)
            first, second = model(**other), model(**other)
    except Exception as e:
        queue.put(("eager", f"fail: {_first_line(e)}"))
        return
    if not _close(first, second):
        # values no capture can be compared with (memory left uninitialized)
        queue.put(("eager", "fail: nondeterministic: two runs on the same inputs differ"))
        return
    queue.put(("eager", "ok"))
    for path in paths:
        start = time.perf_counter()
        try:
            status = _run_path(path, model, example, other, dims)
        except Exception as e:
            status = f"fail: {_first_line(e)}"
            if os.environ.get("SWEEP_TRACEBACK"):
                traceback.print_exc()
        results[path] = status
        queue.put((path, status, time.perf_counter() - start))


def _first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0][:160]


def run_forked(target, args: tuple, paths: list[str], timeout: float) -> dict:
    """Runs ``target(*args, queue)`` in a forked process, which puts ``("eager",
    status, ...)`` then ``(path, status, seconds)`` for each path; returns the status
    of each (``timeout`` or ``crash`` for a path the process never reported, ``-``
    when eager itself failed)."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=target, args=(*args, queue))
    process.start()
    results: dict = {}
    deadline = time.perf_counter() + timeout
    expected = 1 + len(paths)
    while len(results) < expected and time.perf_counter() < deadline:
        try:
            item = queue.get(timeout=max(0.1, min(5.0, deadline - time.perf_counter())))
        except Exception:
            if not process.is_alive() and queue.empty():
                break
            continue
        results[item[0]] = item[1:]
        if item[0] == "eager" and item[1] != "ok":
            break
    if process.is_alive():
        process.kill()
    process.join()
    lost = ("timeout" if process.exitcode in (None, -9) else "crash",)
    results.setdefault("eager", lost)
    for path in paths:
        if path not in results:
            results[path] = ("-",) if results["eager"][0] != "ok" else lost
    return results


def sweep_one(model_type: str, name: str, paths: list[str], timeout: float) -> dict:
    """The status of each path for one architecture (a forked process)."""
    return run_forked(_child, (model_type, name, paths), paths, timeout)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="class names (default: every one)")
    parser.add_argument("--task", default="causal-lm", choices=sorted(TASKS))
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--only", default=",".join(PATHS), help="comma-separated paths")
    parser.add_argument(
        "--shard",
        default="0/1",
        help="K/N: every N-th architecture from the K-th (a long sweep split over cores "
        "or sessions; the N shards together cover every architecture once)",
    )
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    paths = [p for p in args.only.split(",") if p]
    todo = [(t, n) for t, n in architectures(args.task) if not args.names or n in args.names]
    index, count = (int(part) for part in args.shard.split("/"))
    todo = todo[index::count]
    if args.limit:
        todo = todo[: args.limit]
    counts = {p: {} for p in ["eager", *paths]}
    table = []
    start = time.perf_counter()
    print(f"{'architecture':40s} " + " ".join(f"{p:10s}" for p in ["eager", *paths]), flush=True)
    for model_type, name in todo:
        results = sweep_one(model_type, name, paths, args.timeout)
        short = {p: results[p][0].split(":")[0] for p in ["eager", *paths]}
        for p, s in short.items():
            counts[p][s] = counts[p].get(s, 0) + 1
        table.append((name, results))
        print(f"{name:40s} " + " ".join(f"{short[p]:10s}" for p in ["eager", *paths]), flush=True)
        for p in ["eager", *paths]:
            if results[p][0].startswith("fail"):
                print(f"    {p}: {results[p][0][6:]}", flush=True)
            elif results[p][0].startswith(("WRONG", "UNSTABLE")):
                print(f"    {p}: {results[p][0]}", flush=True)
    print(f"\n{len(todo)} architectures in {time.perf_counter() - start:.0f} s")
    for p in ["eager", *paths]:
        print(f"  {p:12s} " + ", ".join(f"{k} {v}" for k, v in sorted(counts[p].items())))
    for theirs, ours in (("export", "yobx"), ("torch-onnx", "yobx-onnx")):
        if theirs in paths and ours in paths:
            lost = [n for n, r in table if r[theirs][0] == "ok" and r[ours][0] != "ok"]
            ahead = [n for n, r in table if r[ours][0] == "ok" and r[theirs][0] != "ok"]
            print(f"{theirs} ok, {ours} not ({len(lost)}): {', '.join(lost)}")
            print(f"{ours} ok, {theirs} not ({len(ahead)}): {', '.join(ahead)}")


if __name__ == "__main__":
    main(sys.argv[1:])
