"""Chrome trace files: handler, stage profiles, record_run profiles, merging."""

import gzip
import json
import os

import pytest
import torch

from yobx.torch.inspect import (
    JSONTraceHandler,
    StageRecorder,
    TraceHandler,
    load_trace_events,
    merge_traces,
    record_run,
    write_stage_profile,
)

MS = 1_000_000  # nanoseconds


def _load(path):
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def _check_well_formed(events):
    for event in events:
        assert event["ph"] in {"X", "i", "C", "M"}, event
        assert isinstance(event["pid"], int) and "tid" in event
        if event["ph"] != "M":
            assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0
        if event["ph"] == "X":
            assert event["dur"] >= 0 and isinstance(event["name"], str)


def _nest(events):
    """Check the X events of each thread nest (no partial overlap); return parent of each."""
    parents = {}
    by_thread = {}
    for event in events:
        if event["ph"] == "X":
            by_thread.setdefault((event["pid"], event["tid"]), []).append(event)
    for thread_events in by_thread.values():
        stack = []
        for event in sorted(thread_events, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= event["ts"]:
                stack.pop()
            if stack:
                parent = stack[-1]
                assert event["ts"] + event["dur"] <= parent["ts"] + parent["dur"] + 1e-3, (
                    event,
                    parent,
                )
                parents[event["name"]] = parent["name"]
            stack.append(event)
    return parents


def test_json_handler_writes_all_event_kinds(tmp_path):
    handler = JSONTraceHandler(process_name="test")
    handler.set_thread_name("main")
    handler.process_duration_event("outer", ["a", "b"], True, 1 * MS)
    handler.process_duration_event("inner", "a", True, 2 * MS, args={"k": 1})
    handler.process_instant_event("mark", "a", 3 * MS)
    handler.process_duration_event("inner", "a", False, 4 * MS)
    handler.process_duration_event("outer", "a", False, 10 * MS)
    handler.process_counter_event("memory", "mem", 5 * MS, {"rss_MiB": 12.5})
    path = handler.write(tmp_path / "trace.json")
    data = _load(path)
    events = data["traceEvents"]
    _check_well_formed(events)
    assert [e["ph"] for e in events] == ["M", "M", "X", "X", "i", "C"]
    assert events[0]["args"] == {"name": "test"} and events[1]["args"] == {"name": "main"}
    outer, inner = events[2], events[3]
    assert (outer["name"], outer["ts"], outer["dur"], outer["cat"]) == ("outer", 1000, 9000, "a,b")
    assert (inner["ts"], inner["dur"], inner["args"]) == (2000, 2000, {"k": 1})
    assert events[5]["args"] == {"rss_MiB": 12.5}
    assert _nest(events) == {"inner": "outer"}
    with pytest.raises(ValueError, match="without a start"):
        handler.process_duration_event("never", "a", False, 11 * MS)


def test_gzip_and_unfinished_durations(tmp_path):
    handler = JSONTraceHandler()
    handler.process_duration_event("open", None, True, 1 * MS)
    handler.process_instant_event("later", None, 6 * MS)
    path = handler.write(tmp_path / "trace.json.gz")
    with open(path, "rb") as f:
        assert f.read(2) == b"\x1f\x8b"
    event = next(e for e in load_trace_events(path) if e["ph"] == "X")
    assert event["dur"] == 5000 and event["args"] == {"unfinished": True}


def test_base_handler_reads_files(tmp_path):
    class Collect(TraceHandler):
        def __init__(self):
            self.seen = []

        def process_duration_event(self, name, categories, is_start, timestamp_ns, *a, **k):
            self.seen.append(("D", name, is_start, timestamp_ns))

        def process_instant_event(self, name, categories, timestamp_ns, *a, **k):
            self.seen.append(("I", name, timestamp_ns))

        def process_counter_event(self, name, categories, timestamp_ns, values, pid=None):
            self.seen.append(("C", name, values))

    handler = JSONTraceHandler()
    handler.process_complete_event("x", "c", 2 * MS, 3 * MS)
    handler.process_instant_event("i", "c", 1 * MS)
    handler.process_counter_event("n", "c", 4 * MS, {"v": 2})
    path = handler.write(tmp_path / "t.json")
    collect = Collect()
    assert collect.process_chrome_json_trace_file(path, time_offset_ns=MS) == 3
    assert collect.seen == [
        ("I", "i", 2 * MS),
        ("D", "x", True, 3 * MS),
        ("D", "x", False, 6 * MS),
        ("C", "n", {"v": 2.0}),
    ]
    with pytest.raises(NotImplementedError):
        TraceHandler().process_instant_event("i", None, 0)


def test_write_stage_profile_nests_and_counts(tmp_path):
    stages = [
        {"name": "capture", "start_ns": 0, "end_ns": 10 * MS, "args": {"nodes": 12}},
        {"name": "pass:inplace", "start_ns": 2 * MS, "end_ns": 4 * MS},
        {"name": "pass:slices", "start_ns": 4 * MS, "end_ns": 9 * MS, "args": {"rss_bytes": 2**20}},
        {"name": "translate", "start_ns": 11 * MS, "end_ns": 20 * MS, "args": {"onnx_nodes": 7}},
        # Overlaps translate without nesting: goes to its own track.
        {"name": "validate", "start_ns": 15 * MS, "end_ns": 25 * MS},
    ]
    path = write_stage_profile(stages, tmp_path / "stages.json")
    events = _load(path)["traceEvents"]
    _check_well_formed(events)
    spans = {e["name"]: e for e in events if e["ph"] == "X"}
    assert set(spans) == {"capture", "pass:inplace", "pass:slices", "translate", "validate"}
    assert spans["capture"]["dur"] == 10_000 and spans["translate"]["ts"] == 11_000
    parents = _nest(events)
    assert parents == {"pass:inplace": "capture", "pass:slices": "capture"}
    assert spans["validate"]["tid"] != spans["translate"]["tid"]
    threads = [e["args"]["name"] for e in events if e["name"] == "thread_name"]
    assert threads == ["stages", "stages (overlap 1)"]
    counters = [e for e in events if e["ph"] == "C"]
    nodes = [(e["ts"], e["args"]) for e in counters if e["name"] == "nodes"]
    assert nodes == [(10_000.0, {"nodes": 12.0}), (20_000.0, {"onnx_nodes": 7.0})]
    memory = [e for e in counters if e["name"] == "memory"]
    assert [(e["ts"], e["args"]["rss_MiB"]) for e in memory] == [(9000.0, 1.0)]
    with pytest.raises(ValueError, match="ends before it starts"):
        write_stage_profile([{"name": "a", "start_ns": 5, "end_ns": 1}], tmp_path / "x.json")


def test_stage_recorder_and_objects(tmp_path):
    recorder = StageRecorder()
    with recorder.stage("export"):
        with recorder.stage("capture", nodes=3) as info:
            info["args"]["extra"] = "yes"
        with recorder.stage("translate"):
            pass
    path = recorder.write(tmp_path / "export.json")
    events = _load(path)["traceEvents"]
    _check_well_formed(events)
    assert _nest(events) == {"capture": "export", "translate": "export"}
    capture = next(e for e in events if e["name"] == "capture")
    assert capture["args"]["extra"] == "yes"
    memory = [e for e in events if e["name"] == "memory"]
    assert len(memory) == 6 and all(e["args"]["rss_MiB"] > 1 for e in memory)

    class Stage:
        def __init__(self, name, start_ns, end_ns):
            self.name, self.start_ns, self.end_ns = name, start_ns, end_ns

    path = write_stage_profile([Stage("a", 0, 5), Stage("b", 1, 2)], tmp_path / "o.json")
    assert _nest(_load(path)["traceEvents"]) == {"b": "a"}


def test_one_recorder_for_to_onnx_and_user_pipelines(tmp_path, capsys):
    # the recorder to_onnx uses: stages in the order they start, each reported when it
    # ends, printed with verbose, its counts in args, readable as before as keys
    reported = []
    recorder = StageRecorder(verbose=1, progress=reported.append, label="to_onnx")
    with recorder("capture") as args:
        args["nodes"] = 12
        with recorder.stage("inner") as record:
            record.args["onnx_nodes"] = 7
    assert [s.name for s in recorder.stages] == ["capture", "inner"]
    assert [s.name for s in reported] == ["inner", "capture"]
    capture = recorder.stages[0]
    assert capture.args["nodes"] == 12 and capture["args"] is capture.args
    assert capture.end_ns >= recorder.stages[1].end_ns >= recorder.stages[1].start_ns
    assert capture.duration_s > 0 and capture.rss_end_bytes == capture.args["rss_bytes"]
    printed = capsys.readouterr().out
    assert "[to_onnx] capture ..." in printed and "[to_onnx] inner done in" in printed
    events = _load(recorder.write(tmp_path / "stages.json"))["traceEvents"]
    _check_well_formed(events)
    assert _nest(events) == {"inner": "capture"}
    # one memory sample at each end, not two at the end (rss_end_bytes and rss_bytes)
    assert len([e for e in events if e["name"] == "memory"]) == 4


def test_record_run_profile_nests_stage_run_and_calls(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    path = str(tmp_path / "run.json")
    result = record_run(
        model,
        torch.randn(3, 4),
        inputs=[(torch.randn(2, 4),)],
        profile=path,
        dynamic_shapes={"input": {0: "batch"}},  # the second run has another batch
    )
    assert result.profile_path == path
    events = _load(path)["traceEvents"]
    _check_well_formed(events)
    spans = [e for e in events if e["ph"] == "X"]
    names = [e["name"] for e in spans]
    assert names.count("stage:eager") == 1 and names.count("stage:graph") == 1
    assert names.count("graph run 1") == 1
    parents = _nest(events)
    assert parents["eager run 0"] == "stage:eager"
    assert parents["graph run 1"] == "stage:graph"
    calls = [e for e in spans if "," in e["cat"]]
    assert len(calls) == len(result.eager) + len(result.graph) == 12
    by_key = {(c.name, c.run, stage.name): c for stage in result for c in stage}
    for event in calls:
        stage_name = event["cat"].split(",")[0]
        call = by_key[(event["name"], event["args"]["run"], stage_name)]
        assert event["dur"] == pytest.approx(call.duration_ns / 1000)
    # every call event lies inside its run
    run_events = {e["name"]: e for e in spans if e["cat"] == "run"}
    for event in calls:
        run = run_events[f"{event['cat'].split(',')[0]} run {event['args']['run']}"]
        assert run["ts"] <= event["ts"] and event["ts"] + event["dur"] <= run["ts"] + run["dur"]
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert counters == {"memory", "calls"}


def test_merge_two_files_and_torch_profiler(tmp_path):
    first = JSONTraceHandler(process_name="export")
    first.process_complete_event("capture", "stage", 1 * MS, 2 * MS)
    first.write(tmp_path / "a.json")
    second = JSONTraceHandler()
    second.process_complete_event("run", "stage", 4 * MS, 1 * MS)
    second.process_counter_event("memory", "m", 5 * MS, {"rss_MiB": 3})
    second.write(tmp_path / "b.json.gz")

    out = merge_traces(tmp_path / "merged.json", tmp_path / "a.json", tmp_path / "b.json.gz")
    events = _load(out)["traceEvents"]
    _check_well_formed(events)
    spans = {e["name"]: e for e in events if e["ph"] == "X"}
    assert spans["capture"]["ts"] == 1000 and spans["run"]["ts"] == 4000
    # Both files came from this process: the second one got its own pid and name.
    assert spans["capture"]["pid"] == os.getpid() != spans["run"]["pid"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {os.getpid(): "export", spans["run"]["pid"]: "b.json.gz"}

    aligned = merge_traces(
        tmp_path / "aligned.json", tmp_path / "a.json", tmp_path / "b.json.gz", align_start=True
    )
    spans = {e["name"]: e for e in _load(aligned)["traceEvents"] if e["ph"] == "X"}
    assert spans["capture"]["ts"] == 0 and spans["run"]["ts"] == 0

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.nn.functional.relu(torch.randn(16, 16) @ torch.randn(16, 16))
    prof.export_chrome_trace(str(tmp_path / "torch.json"))
    out = merge_traces(tmp_path / "all.json", tmp_path / "a.json", tmp_path / "torch.json")
    merged = load_trace_events(out)
    assert any(e["name"] == "capture" for e in merged)
    assert any("matmul" in e.get("name", "") for e in merged)
