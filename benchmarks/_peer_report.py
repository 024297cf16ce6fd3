"""Statistics and the text table of ``peer_bench.py``.

Per runtime: ``median_ms`` over every timed call of every round, ``spread`` = (90th - 10th
percentile) / median, the per-round medians, and resident memory in bytes, each the median
over the rounds: ``rss_after_load``, ``rss_after_run`` (absolute), ``added_by_load`` and
``added`` (after the run minus after the imports: what loading and running the model cost).
"""

from __future__ import annotations

import statistics
from typing import Dict, List, Optional

import numpy as np

ORT, OV, OV_F32 = "onnxruntime", "openvino", "openvino-f32"


def _median(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _stats(run: Dict) -> Dict:
    rounds = [r for r in run["rounds"] if "error" not in r]
    errors = [r["error"] for r in run["rounds"] if "error" in r]
    if not rounds:
        return {"error": errors[0] if errors else "not run"}
    times = [t for r in rounds for t in r["times_ms"]]
    median = statistics.median(times)
    p10, p90 = np.percentile(times, [10, 90])
    out = {"median_ms": median, "spread": float((p90 - p10) / median) if median else None,
           "round_medians_ms": [r["median_ms"] for r in rounds], "calls": len(times),
           "precision": rounds[0].get("precision"), "load_s": _median(r["load_s"] for r in rounds),
           "first_call_ms": _median(r["first_call_ms"] for r in rounds)}
    for key, after in (("rss_after_load", "rss_after_load"), ("rss_after_run", "rss_after_run")):
        out[key] = _median(r[after]["VmRSS"] for r in rounds)
    out["added_by_load"] = _median(r["rss_after_load"]["VmRSS"] - r["rss_before_load"]["VmRSS"]
                                   for r in rounds)
    out["added"] = _median(r["rss_after_run"]["VmRSS"] - r["rss_before_load"]["VmRSS"]
                           for r in rounds)
    out["added_file_backed"] = _median(r["rss_after_run"]["RssFile"]
                                       - r["rss_before_load"]["RssFile"] for r in rounds)
    out["peak_added"] = _median(r["rss_after_run"]["VmHWM"] - r["rss_before_load"]["VmRSS"]
                                for r in rounds)
    if errors:
        out["errors"] = errors
    if "check" in run:
        out["check"] = run["check"]
    return out


def summarize(entry: Dict) -> Dict:
    """``entry`` with ``stats`` per runtime and ``ratios`` per build of ours."""
    entry["stats"] = {name: _stats(run) for name, run in entry["runs"].items()}
    for run in entry["runs"].values():
        run.pop("outputs", None)
    peers = {p: entry["stats"].get(p, {}).get("median_ms") for p in (ORT, OV, OV_F32)}
    entry["ratios"] = {}
    for build in entry["builds"]:
        ours = entry["stats"].get(build, {}).get("median_ms")
        if ours is None:
            continue
        known = [v for v in (peers[ORT], peers[OV]) if v]
        entry["ratios"][build] = {
            "ours_over_ort": ours / peers[ORT] if peers[ORT] else None,
            "ours_over_openvino": ours / peers[OV] if peers[OV] else None,
            "ours_over_openvino_f32": ours / peers[OV_F32] if peers[OV_F32] else None,
            "ours_over_min": ours / min(known) if known else None}
    return entry


def _ms(stats: Dict) -> str:
    if not stats:
        return "-"  # not run
    if "median_ms" not in stats:
        return "error"
    spread = stats.get("spread")
    return f"{stats['median_ms']:.2f} ±{100 * spread:.0f}%" if spread is not None else \
        f"{stats['median_ms']:.2f}"


def _mb(n: Optional[float]) -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"


def _x(r: Optional[float]) -> str:
    return "-" if r is None else f"{r:.2f}"


def _check(stats: Dict) -> str:
    check = stats.get("check")
    if check is None:
        return ""
    if "max_abs_error" not in check:
        return "MISMATCH " + check.get("why", "")
    return ("ok" if check["ok"] else "DIFF") + f" {check['max_abs_error']:.1e}"


def format_table(results: List[Dict], builds: List[str]) -> str:
    """Latency and ratios, then resident memory, one row per model and build."""
    lines = ["latency: median ms ± spread (p90-p10)/median; ratios of medians",
             f"{'model':<22}{'build':<12}{'ours':>16}{'onnxruntime':>16}{'openvino':>16}"
             f"{'ov f32':>16}{'/ort':>7}{'/ov':>7}{'/ov32':>7}{'/min':>7}  check ours, ov, ov32"]
    for entry in results:
        s = entry["stats"]
        for build in builds:
            if build not in s:
                continue
            r = entry["ratios"].get(build, {})
            lines.append(
                f"{entry['model']:<22}{build:<12}{_ms(s[build]):>16}{_ms(s.get(ORT, {})):>16}"
                f"{_ms(s.get(OV, {})):>16}{_ms(s.get(OV_F32, {})):>16}"
                f"{_x(r.get('ours_over_ort')):>7}{_x(r.get('ours_over_openvino')):>7}"
                f"{_x(r.get('ours_over_openvino_f32')):>7}{_x(r.get('ours_over_min')):>7}  "
                + ", ".join(_check(s.get(k, {})) for k in (build, OV, OV_F32)))
    lines += ["", "resident memory, MiB: added by loading and one run (after the run minus "
              "after the imports) / absolute after the run",
              f"{'model':<22}" + "".join(f"{name:>18}" for name in builds + [ORT, OV, OV_F32])]
    for entry in results:
        s = entry["stats"]
        lines.append(f"{entry['model']:<22}" + "".join(
            f"{_mb(s.get(n, {}).get('added')) + ' / ' + _mb(s.get(n, {}).get('rss_after_run')):>18}"
            for n in builds + [ORT, OV, OV_F32]))
    return "\n".join(lines)
