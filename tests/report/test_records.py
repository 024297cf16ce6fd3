"""The memory report: like-for-like savings against TVM's default build, and the fallback."""

from relax_memplan.report import CompileReport, FunctionMemoryReport, ShapeMeasurement
from relax_memplan.report.text import format_side_by_side


def _report(**fields):
    f = FunctionMemoryReport(name="main", num_tensors=3, num_planned=2, **fields)
    return CompileReport(model="m", target="llvm", inputs={}, functions={"main": f})


def test_saved_compares_whole_builds_per_call():
    """Regression for "saved -200 %": TVM's planned storage alone (128 B) was compared with our
    planned storage (384 B) although both builds allocate 512 B per call."""
    report = _report(arena_bytes=384, planned_bytes=384, unplanned_bytes=128,
                     tvm_default_bytes=512, tvm_default_unplanned_bytes=384)
    main = report.main
    assert (main.saved_bytes, main.saved_percent) == (0, 0.0)
    text = report.format_text()
    assert "-" not in text.split("saved vs TVM default")[1].splitlines()[0]
    assert report.to_dict()["saved_percent"] == 0.0


def test_saved_percent_is_consistent_with_the_bytes_shown():
    main = _report(arena_bytes=8_512, planned_bytes=8_512, unplanned_bytes=1_028,
                   tvm_default_bytes=13_917).main
    assert main.saved_bytes == 13_917 - 9_540
    assert main.saved_percent == 100 * 4_377 / 13_917
    assert "4,377 B (4.27 KiB)  31.5 %" in _report(
        planned_bytes=8_512, unplanned_bytes=1_028, tvm_default_bytes=13_917).format_text()


def test_more_than_tvm_is_said_in_words_not_as_a_negative_saving():
    text = _report(planned_bytes=600, tvm_default_bytes=500).format_text()
    assert "MORE than TVM default" in text and "100 B  20.0 %" in text
    assert "saved vs TVM default" not in text


def test_fallback_is_shown():
    reason = "TVM's plan is smaller (432 B vs our 528 B per call)"
    report = _report(planned_bytes=288, unplanned_bytes=144, tvm_default_bytes=432,
                     fallback=reason)
    assert f"our arena not used: {reason}" in report.format_text()
    assert report.to_dict()["fallback"] == reason
    assert report.to_dict()["functions"]["main"]["fallback"] == reason


def test_static_report_keeps_main_keys_at_top_level_and_one_row():
    report = _report(arena_bytes=384, lower_bound_bytes=320, planned_bytes=384)
    report.shapes.append(ShapeMeasurement(dims={}, runtime_alloc_bytes=400, arena_bytes=384,
                                          lower_bound_bytes=320))
    report.main.record_run(report.shapes[0])
    data = report.to_dict()
    assert (data["arena_bytes"], data["lower_bound_bytes"], data["runtime_alloc_bytes"]) == (384, 320, 400)
    assert data["strategy"] == "static" and data["shapes"][0]["dims"] == {}
    assert "ratio_check" not in data


def test_side_by_side_prints_shared_notes_once_and_the_others_per_strategy():
    reports = {}
    for name, notes, arena in (("exact", ["imported", "only exact"], 64), ("buckets", ["imported"], 128)):
        r = CompileReport(model="m", strategy=name, dims={"n": (1, 4)}, notes=notes,
                          buckets={"n": [2]} if name == "buckets" else {})
        r.shapes.append(ShapeMeasurement({"n": 1}, 200, arena, 64, tvm_default_runtime_alloc_bytes=900))
        reports[name] = r
    lines = format_side_by_side(reports).splitlines()
    assert "n in [1, 4]; buckets n=2" in lines[1]
    assert lines[4].split() == ["n=1", "64", "1.000", "200", "2.000", "200", "900", "-"]
    assert lines[5:] == ["  fusion: off", "  note: imported", "  exact: note: only exact"]


def test_side_by_side_shows_no_ratio_for_a_strategy_that_planned_nothing():
    reports = {}
    for name, planned, arena in (("exact", True, 96), ("buckets", False, 0)):
        r = CompileReport(model="m", strategy=name, dims={"n": (1, 4)},
                          not_planned_reason=None if planned else "offset expression too long")
        r.shapes.append(ShapeMeasurement({"n": 1}, 200, arena, 64 if planned else 0,
                                         tvm_default_runtime_alloc_bytes=900, planned=planned))
        reports[name] = r
    lines = format_side_by_side(reports).splitlines()
    assert lines[4].split() == ["n=1", "64", "1.500", "200", "-", "200", "900", "-"]


def test_text_shows_the_ten_largest_tensors_live_at_the_peak():
    tensors = [{"name": f"t{k}", "producer": f"fused_kernel_{k}", "shape": [k + 1], "dtype": "float32",
                "size_bytes": 4 * (k + 1), "live_range": [0, 3], "arena": 0, "offset_bytes": 64 * k}
               for k in range(12)]
    live = [t["name"] for t in sorted(tensors, key=lambda t: -t["size_bytes"])]
    text = _report(tensors=tensors, peak_step=1, live_at_peak=live).format_text()
    assert "live at the peak (step 1): 12 tensors, 312 B; the 10 largest:" in text
    rows = [line.split() for line in text.splitlines()
            if line.startswith("    t") and not line.startswith("    tensor")]
    assert [r[0] for r in rows] == live[:10]
    assert rows[0] == ["t11", "fused_kernel_11", "12", "float32", "48", "704", "[0,", "3)"]


def test_side_by_side_ratios_are_against_the_lowest_bound_of_the_row():
    """Regression: with in-place reuse exact's bound (786,432) is below upper_bound's
    (917,504, no in-place); the LB column showed upper_bound's and exact said 1.000 against
    it. Now one LB column, the lowest, and every x LB against it."""
    reports = {}
    for name, arena, lb in (("exact", 786432, 786432), ("upper_bound", 917504, 917504)):
        r = CompileReport(model="m", strategy=name, dims={"n": (1, 4)})
        r.shapes.append(ShapeMeasurement({"n": 1}, arena + 40, arena, lb,
                                         tvm_default_runtime_alloc_bytes=10**6))
        reports[name] = r
    lines = format_side_by_side(reports).splitlines()
    assert lines[4].split()[:6] == ["n=1", "786,432", "1.000", "786,472", "1.167", "917,544"]
    reports = {"upper_bound": reports["upper_bound"], "exact": reports["exact"]}  # order free
    assert format_side_by_side(reports).splitlines()[4].split()[1:3] == ["786,432", "1.167"]


def test_no_static_saving_when_loop_bodies_allocate_per_iteration():
    """Regression: a Loop with a run-time trip count read "TVM default 0 B" and
    saved_bytes -49,152 while TVM's build allocated 655,360 B at run time against our
    49,152 B: TVM's static figure leaves out its per-iteration allocations, so no saving is
    computed from it and the text says to compare the run-time lines."""
    report = _report(planned_bytes=1_024, unplanned_bytes=64, loop_storage_bytes=48_064,
                     tvm_default_bytes=0)
    main = report.main
    assert main.saved_bytes is None and main.saved_percent is None
    data = report.to_dict()
    assert data["saved_bytes"] is None and data["saved_percent"] is None
    text = report.format_text()
    assert "MORE than TVM default" not in text and "saved vs TVM default" not in text
    assert "so no saving is computed from it: compare the run-time lines" in text
    # without loop bodies the static comparison stands, even against 0 B
    plain = _report(planned_bytes=1_024, unplanned_bytes=64, tvm_default_bytes=2_048).main
    assert plain.saved_bytes == 960


def test_each_without_row_names_what_is_off_and_the_steps_credit_concat_in_place():
    """Regression (yolov8n): 2,457,600 -> 2,048,000 B came from concat in place, but the
    "without in-place reuse" row (also without concat in place) and the steps line
    ("-> in-place 2,048,000 B") credited in-place reuse alone."""
    report = _report(lower_bound_bytes=2_048_000, arena_bytes=2_048_000,
                     inplace_capable_kernels=11, inplace_calls=7,
                     lower_bound_without_inplace_bytes=2_457_600, concat_inplace=9,
                     concat_refusals={}, lower_bound_without_concat_bytes=2_457_600,
                     lower_bound_importer_order_bytes=2_457_600,
                     lower_bound_reordered_bytes=2_457_600)
    text = report.format_text()
    rows = {line[:40].strip(): line[40:].split() for line in text.splitlines()}
    assert rows["without in-place reuse or concat"] == ["2,457,600", "B", "(2.34", "MiB)",
                                                        "1.200", "x", "LB"]
    assert rows["without concat in place only"][0] == "2,457,600"
    assert "-> reordered 2,457,600 B -> in-place + concat in place 2,048,000 B;" in text
    # in-place alone: the row and the step say in-place only
    alone = _report(lower_bound_bytes=100, inplace_capable_kernels=1, inplace_calls=1,
                    lower_bound_without_inplace_bytes=200, lower_bound_importer_order_bytes=300,
                    lower_bound_reordered_bytes=200).format_text()
    assert "    without in-place reuse " in alone and "or concat" not in alone
    assert "-> reordered 200 B -> in-place 100 B;" in alone


def test_fusion_line_names_the_skipped_chains_and_the_bound_baseline():
    """Regression (yolov8n --schedule): "conv chains fused 0x, conv chains refused 0x"
    while auto had skipped the stem's dense consumer; the fusion bound's planner settings.
    Then (yolov8n without --schedule): "fused 2x, refused 4x", no reason, a candidate missing."""
    report = _report(lower_bound_bytes=100)
    report.fusion = {"conv_chain": 2, "conv_chain_refused": 4, "conv_chain_candidates": 7}
    report.fusion_skipped = {"refused: intermediate has another reader": 4,
                             "skipped: input not made by a conv": 1}
    refused = ([{"reason": "intermediate has another reader", "bindings": ["lv3"]}] * 4
               + [{"reason": "input not made by a conv", "bindings": ["lv0"]}])
    report.fusion_patterns = {"conv_chain": {"verb": "fused", "candidates": 7, "fused": 2,
                                             "refused": refused}}
    report.fusion_summary = {"kernels_ours": 9, "kernels_tvm": 9, "ort_nodes": None,
                             "intermediate_bytes_ours": 10, "intermediate_bytes_removed": 0,
                             "lower_bound_bytes_tvm": 120, "lower_bound_bytes_ours": 100,
                             "planner_settings": "in-place, concat in place"}
    text = report.format_text()
    assert ("fusion: on\n    conv chains: 2 of 7 fused: 4 x intermediate has another reader; "
            "1 x input not made by a conv\n") in text
    assert ("lower bound 120 B without our fusion -> 100 B (both with this build's planner: "
            "in-place, concat in place)") in text
    assert report.to_dict()["fusion"]["skipped"] == report.fusion_skipped
    assert "onnxruntime optimized graph: - nodes)" in text
    report.fusion_summary.update(ort_nodes=78, ort_subgraph_nodes=74)  # silero: an If
    assert "onnxruntime optimized graph: 78 nodes, 74 of them in If/Loop bodies)" in \
        report.format_text()
    report.fusion = {"attention": 1, "conv_chain": "off"}
    report.fusion_skipped = {}
    report.fusion_patterns = {"attention": {"verb": "fused", "candidates": 1, "fused": 1,
                                            "refused": []}}
    assert "fusion: on\n    attention: 1 of 1 fused\n    conv chains: off\n" in \
        report.format_text()
    assert report.to_dict()["fusion"]["patterns"] == report.fusion_patterns
    assert report.to_dict()["fusion"]["fused"]["conv_chain"] == "off"


def test_fusion_skips_gives_every_reason_a_chain_was_not_fused():
    from relax_memplan.report.fusion_summary import fusion_skips
    from relax_memplan.pipeline import fusion_counts
    from relax_memplan.transform.fuse_conv_chain import FuseConvChain

    chain = FuseConvChain(consumers="depthwise")
    chain.fused = 1
    chain.skipped = {"dense_consumer": 2, "other_consumer": 1, "scratch": 1, "no_producer": 1}
    assert fusion_skips([chain]) == {"skipped: dense consumer under --schedule": 2,
                                     "refused: intermediate has another reader": 1,
                                     "refused: scratch of the threads not smaller than the "
                                     "intermediate": 1,
                                     "skipped: input not made by a conv": 1}
    counts = fusion_counts([chain])
    assert (counts["conv_chain"], counts["conv_chain_refused"],
            counts["conv_chain_candidates"]) == (1, 2, 6)
    chain.skipped = {}
    assert fusion_skips([chain]) == {} and fusion_skips(None) == {}


def test_long_dim_names_keep_the_table_columns_aligned():
    """Regression: dims text longer than the 28-character column pushed that row's cells
    right of their headers in the side-by-side table (and the per-shape table)."""
    dims = {"sequence_length_of_the_encoder": 7, "batch_size_of_requests": 3}
    reports = {}
    for name in ("exact", "upper_bound"):
        r = CompileReport(model="m", strategy=name, dims={n: (1, 8) for n in dims})
        r.shapes.append(ShapeMeasurement(dict(dims), 1_000_040, 1_000_000, 1_000_000,
                                         tvm_default_runtime_alloc_bytes=2_000_000))
        reports[name] = r
    for text in (format_side_by_side(reports), reports["exact"].format_text()):
        lines = text.splitlines()
        header = next(line for line in lines if line.strip().startswith("dims"))
        row = next(line for line in lines if "sequence_length_of_the_encoder=7" in line)
        # every header ends where its column's cell ends
        assert header.index("LB") + 2 == row.index("1,000,000") + len("1,000,000"), (header, row)
        assert len(header.rstrip()) <= len(row.rstrip()) + 8
        assert row.index("1,000,000") > len("  sequence_length_of_the_encoder=7, "
                                            "batch_size_of_requests=3")


def test_side_by_side_widens_byte_columns_to_the_longest_number():
    """Regression: at batch=1..1000000 12-wide byte cells ran together."""
    reports = {}
    for name, arena in (("exact", 393_216_000_000), ("upper_bound", 393_216_000_000)):
        r = CompileReport(model="m", strategy=name, dims={"batch": (1, 1_000_000)})
        r.shapes.append(ShapeMeasurement({"batch": 1_000_000}, arena + 64, arena, arena,
                                         tvm_default_runtime_alloc_bytes=786_432_000_000))
        reports[name] = r
    lines = format_side_by_side(reports).splitlines()
    assert lines[4].split() == ["batch=1000000", "393,216,000,000", "1.000", "393,216,000,064",
                                "1.000", "393,216,000,064", "786,432,000,000", "-"]
    assert lines[2].index("upper_bound") + len("upper_bound") == len(lines[4]) - 10 - 17


def test_fusion_line_says_when_its_bound_is_not_this_builds():
    """Regression (bert-tiny --schedule): "-> 393,216 B" beside a report bound of
    458,752 B. The summary carries the build's bound; the line names it when they differ."""
    report = _report(lower_bound_bytes=130)
    report.fusion = {"attention": 2}
    report.fusion_summary = {"kernels_ours": 9, "kernels_tvm": 9, "ort_nodes": None,
                             "intermediate_bytes_ours": 10, "intermediate_bytes_removed": 0,
                             "lower_bound_bytes_tvm": 120, "lower_bound_bytes_ours": 100,
                             "planner_settings": "in-place", "lower_bound_bytes_build": 130}
    assert ("-> 100 B (both with this build's planner: in-place); NOT this build's lower bound, "
            "130 B: the comparison's rebuild planned differently") in report.format_text()
    report.fusion_summary["lower_bound_bytes_build"] = 100
    assert "NOT this build's" not in report.format_text()
    assert report.to_dict()["fusion"]["lower_bound_bytes_build"] == 100
