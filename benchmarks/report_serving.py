"""The tables of `benchmarks/report.py` on serving: decoding, the server, hostile images, artifact checks.

Each `t_<name>` renders the table of that name from the newest records
(`benchmarks/report_records.py`).
"""
from __future__ import annotations

from typing import Any, Dict, List

from benchmarks.report_records import Context, Rendered, num, span, table


def t_decode(ctx: Context) -> Rendered:
    recs = [ctx.latest(s) for s in ("decode", "decode-general", "decode-glimpse", "decode-spatial_transformer")]
    rows = []
    for rec in recs:
        f = rec.figures
        rows.append([f"{f['attention']}, {f['attention_score']}", f["precision"], num(f["ours_greedy_ms"], 1),
                     num(f["ours_beam_ms"], 1), num(f["baseline_greedy_ms"], 1), f"**{num(f['ratio'], 2)}**",
                     f["runs"]])
    lines = table(["attention, score", "precision", "ours greedy ms", f"ours beam-{recs[0].figures['beam_size']} ms",
                   "tutorial eager greedy ms", "ratio (tutorial / ours greedy)", "runs (medians)"], rows)
    return lines, recs


def _serving_rows(f: Dict[str, Any]) -> Dict[str, List[str]]:
    rows: Dict[str, List[str]] = {}
    o = f["overhead"]
    rows["in process, 1"] = [num(o["in_process_p50_ms"], 1), num(o["in_process_p99_ms"], 1), ""]
    for mode, label in (("no_batching", "no batching"), ("batching", "batching")):
        for c in ("c1", "c32"):
            r = f["results"][mode][c]
            rows[f"{label}, {c[1:]}"] = [num(r["p50_ms"], 1), num(r["p99_ms"], 1), num(r["rps"], 0)]
    return rows


def t_serving_fixture(ctx: Context) -> Rendered:
    pools, one = ctx.latest("serving-default"), ctx.latest("serving-intra1")
    a, b = _serving_rows(pools.figures), _serving_rows(one.figures)
    rows = [[key.split(", ")[0], key.split(", ")[1], *a[key], *b[key]] for key in a]
    for label, key in (("gRPC overhead at concurrency 1 (ratio, + ms)", "overhead"),
                       ("REST overhead at concurrency 1 (ratio, + ms)", "rest_overhead")):
        oa, ob = pools.figures[key], one.figures[key]
        rows.append([label, "", f"**{num(oa['ratio'], 3)}**", num(oa["overhead_ms"], 2), "",
                     f"**{num(ob['ratio'], 3)}**", num(ob["overhead_ms"], 2), ""])
    rows.append(["batching / no batching, req/s at 32", "", f"**{num(pools.figures['batching_speedup_c32'], 2)}x**",
                 "", "", f"**{num(one.figures['batching_speedup_c32'], 2)}x**", "", ""])
    lines = table(["mode", "concurrency", "pools p50 ms", "p99 ms", "req/s", "one thread p50 ms", "p99 ms",
                   "req/s"], rows)
    return lines, [pools, one]


def t_serving_overhead_demo(ctx: Context) -> Rendered:
    servers = [
        ("default: one thread per op (its choice for this encoder)", "fully trained",
         ["serving-overhead-threads-auto1", "serving-overhead-threads-auto2"]),
        ("`--tensorflow_intra_op_parallelism=0`: TensorFlow's pools", "fully trained",
         ["serving-overhead-threads-tf1", "serving-overhead-threads-tf2"]),
        ("TensorFlow's pools, spinning on, REST through the request pool", "2 epochs, loaded host",
         ["serving-overhead-float32-before"]),
        ("TensorFlow's pools, spinning off (auto on 2 CPUs), a small REST request on the event loop",
         "2 epochs, loaded host", ["serving-overhead-float32-after"]),
    ]
    rows, recs = [], []
    for label, export, stems in servers:
        for run, stem in enumerate(stems, 1):
            rec = ctx.latest(stem)
            recs.append(rec)
            g, h = rec.figures["overhead"], rec.figures["rest_overhead"]
            rows.append([label if run == 1 else "same, second run", export, f"**{num(g['ratio'], 3)}**",
                         num(g["overhead_ms"], 2), f"**{num(h['ratio'], 3)}**", num(h["overhead_ms"], 2),
                         num(g["in_process_p50_ms"], 1)])
    lines = table(["server", "float32 demo export", "gRPC ratio", "gRPC + ms", "REST ratio", "REST + ms",
                   "in process p50 ms"], rows)
    return lines, recs


def t_serving_threads(ctx: Context) -> Rendered:
    rec = ctx.latest("serving_threads")
    names = {"demo": "demo small CNN, 64 px", "mobilenetv2": "MobileNetV2 to `out_relu`, 224 px",
             "small_cnn_128": "small CNN, 128 px, width 32", "resnet50": "ResNet50 to `conv5_block3_out`, 224 px"}
    encoders = sorted(rec.figures["encoders"].items(), key=lambda kv: kv[1]["encoder_gflops"])
    rows = [[names.get(k, k), num(e["encoder_gflops"], 3), num(e["default_ms"], 2), num(e["one_thread_ms"], 2),
             f"**{num(e['speedup'], 2)}x**" if e["speedup"] > 1 else f"{num(e['speedup'], 2)}x"] for k, e in encoders]
    lines = table(["encoder (`weights=None`)", "GFLOPs per image", "TensorFlow's pools ms", "one thread ms",
                   "one thread faster by"], rows)
    f = rec.figures
    load = ", ".join(f"{x:.1f}" for x in f["load_average"])
    return lines + ["", f"Beam {f['beam_size']}, up to {f['max_length']} words; medians of {f['repeats']} "
                        f"alternating child processes of {f['calls']} calls; load average {load}."], [rec]


# The hostile-image cases the table shows (the record holds more).
DECODE_CPU_CASES = ("progressive 2000x2000 grey, last scan x4000", "same, x492: the most the default allows",
                    "progressive 8x8, last scan x500,000", "GIF 1x1, 1,000,000 frames",
                    "photo 8000x5000 progressive 4:4:4 (PIL)")


def t_decode_cpu_images(ctx: Context) -> Rendered:
    rec = ctx.latest("decode_cpu")
    rows = []
    cases = rec.figures["cases"]
    for c in [c for c in cases if c["image"] in DECODE_CPU_CASES] or cases:
        decode = "" if c["decode_no_checks_s"] is None else f"{c['decode_no_checks_s']:g} s"
        rows.append([c["image"], f"{c['bytes']:,}", c["decode_work"] or "", decode, f"{c['checks_ms']:g}",
                     "yes" if c["refused"] else "no", f"{c['grpc_predict_ms']:g} ms"])
    lines = table(["image", "bytes", "decode work", "decode, no checks", "checks ms", "refused?", "gRPC Predict"],
                  rows)
    shown = len(rows)
    return lines + ([f"{shown} of the record's {len(cases)} images."] if shown < len(cases) else []), [rec]


def t_decode_cpu_fairness(ctx: Context) -> Rendered:
    rec = ctx.latest("decode_cpu")
    rows = [[r["label"], f"{r['own_ms']:g} ms", f"{r['p50_ms']:,} ms", f"**{r['p99_ms']:,} ms**"
             if r["label"] == "with the defaults" else f"{r['p99_ms']:,} ms", r["expensive_ok"]]
            for r in rec.figures["fairness"]]
    lines = table(["server", "normal request alone", "normal p50", "normal p99", "expensive answered in 30 s"], rows)
    return lines + ["", f"Load average {rec.figures['load_average']}."], [rec]


def t_artifact_checks(ctx: Context) -> Rendered:
    rec = ctx.latest("artifact_checks")
    f = rec.figures

    def ms(v: Any) -> str:
        return f"{span(v, 1) if isinstance(v, list) else num(v, 1)} ms"
    rows = [[f"{r['shards_per_split']:,} shards per split", f"{r['files']:,}", ms(r["load_ms"]),
             f"**{ms(r['size_check_ms'])}**"] for r in f["rows"]]
    d = f["demo_root"]
    rows.append([f"a `make demo` root ({d['executions']} executions)", "", "", f"{d['size_check_ms']} ms (CRC-32C: "
                 f"{d['crc32c_check_s']} s)"])
    lines = table(["root", "files", "load `artifact.json`", "the size check"], rows)
    return lines + ["", f"Load average {f['load_average']}; CRC-32C ran at {span(f['checksum_gb_per_s_page_cache'], 0)}"
                        " GB/s over files in the page cache."], [rec]
