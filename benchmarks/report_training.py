"""The tables of `benchmarks/report.py` on captions and training: the demo, attention types, the step.

Each `t_<name>` renders the table of that name from the newest records
(`benchmarks/report_records.py`).
"""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Sequence, Tuple

from benchmarks.report_records import (
    METRICS,
    Context,
    Record,
    Rendered,
    metric,
    num,
    pct,
    span,
    table,
    where,
)


def _demo_runs(ctx: Context) -> List[Tuple[str, Record]]:
    return [("bfloat16 (`auto`)", ctx.latest("demo")), ("float32 forced", ctx.latest("demo-float32")),
            ("float32 forced, oneDNN held to AVX2", ctx.latest("demo-float32-avx2"))]


def t_demo_quality(ctx: Context) -> Rendered:
    runs = _demo_runs(ctx)
    hard = ctx.latest("demo_attention")
    keys = ["Bleu_4", "METEOR", "CIDEr", "attribute_accuracy", "relation_accuracy", "grounding", "grounding_noun"]
    rows = []
    for label, record in runs:
        m = record.figures["test_metrics_soft_as_served"]
        rows.append([f"soft, `make demo`, {label}, as served", record.date, *[metric(m, k) for k in keys]])
    rows.append(["hard (`--set model.attention=hard`), seed 0, the config of its date (24 epochs), "
                 "scored on the stored grids", hard.date, *[metric(hard.figures["hard"], k) for k in keys]])
    rows.append(["target", "", "soft >= 0.75; hard >= 0.9 x soft", "", "soft >= 5.0", "soft >= 0.85",
                 "soft >= 0.85", "soft >= 0.80; hard >= soft", ""])
    lines = table(["model", "date", *[METRICS[k] for k in keys]], rows)
    return lines + ["", "Blank: not recorded for that run."], [r for _, r in runs] + [hard]


def t_demo_stages(ctx: Context) -> Rendered:
    runs = _demo_runs(ctx)
    stages = ["ExampleGen", "EncoderTrainer", "Preprocess", "Trainer", "Exporter", "Evaluator", "Pusher"]
    rows = []
    for label, record in runs:
        f = record.figures
        s = f["stages_s"]
        wall = int(f["wall_s"])
        rows.append([label, *[num(s.get(k), 1) for k in stages[:3]],
                     f"{num(s['Trainer'], 1)} ({f['trainer_steps']:,} steps)",
                     *[num(s.get(k), 1) for k in stages[4:]], f"**{wall // 60} min {wall % 60} s**",
                     f"{num(f.get('peak_rss_gb'), 2)} GB"])
    lines = table(["run", *stages, "total", "peak RSS"], rows)
    return lines, [r for _, r in runs]


def t_demo_encoder_stop(ctx: Context) -> Rendered:
    """`make demo` with the encoder's epochs fixed at 4 and with its stop on val mAP, one host and day."""
    rec = ctx.latest("demo_encoder_stop")
    rows = []
    for run in rec.figures["runs"]:
        s, m = run["stages_s"], run["metrics"]
        wall = int(run["wall_s"])
        rows.append([run["label"], f"{run['encoder_epochs']} ({run['encoder_best_epoch']})",
                     num(run["encoder_val_map"], 4), run["encoder_stopped"],
                     num(s["EncoderTrainer"], 1), num(s["Trainer"], 1),
                     f"**{wall // 60} min {wall % 60} s**",
                     *[metric(m, k) for k in ("Bleu_4", "METEOR", "CIDEr", "relation_accuracy")],
                     run["load"]])
    lines = table(["encoder stop", "epochs (best)", "val mAP", "ended by", "EncoderTrainer s",
                   "Trainer s", "total", "Bleu_4", "METEOR", "CIDEr", "relation", "load average"],
                  rows)
    return lines + ["", rec.figures["note"]], [rec]


def t_demo_seeds(ctx: Context) -> Rendered:
    lr = ctx.latest("demo_learning_rate")
    f32 = ctx.latest("attention_types-demo-float32-epochs30")
    rows = []
    for row in lr.figures["rows"]:
        rows.append(["bfloat16", lr.date, f"{row['learning_rate']:.0e}".replace("e-0", "e-") + f", {row['epochs']}",
                     num(row["relation_accuracy"]), num(row["attribute_accuracy"]), "",
                     num(row["Bleu_4"]), num(row.get("trainer_s"), 0)])
    runs = sorted(f32.figures["runs"], key=lambda r: r["seed"])
    ms = [r["metrics"] for r in runs]
    epochs = next((o.split("=")[1] for o in f32.figures["overrides"] if o.startswith("train.epochs=")), "?")
    rows.append(["**float32**", f32.date, f"**4e-3, {epochs} (the demo's)**",
                 *[num([m[k] for m in ms]) for k in ("relation_accuracy", "attribute_accuracy", "grounding",
                                                     "Bleu_4")], ""])
    lines = table(["precision", "date", "learning rate, epochs", "relation (seeds 0, 1, 2)", "attribute",
                   "grounding", "Bleu_4", "Trainer s"], rows)
    return lines, [lr, f32]


def t_demo_settings(ctx: Context) -> Rendered:
    rec = ctx.latest("demo_ablations")
    f = rec.figures
    keys = ["Bleu_4", "CIDEr", "attribute_accuracy", "relation_accuracy", "grounding", "grounding_noun"]
    rows = []
    for row in f["soft_doubly_stochastic_lambda"]:
        demo = " (the demo's)" if row["lambda"] == 0.01 else ""
        rows.append([f"soft, `model.doubly_stochastic_lambda={row['lambda']:g}`{demo}, {row['epochs']} epochs",
                     f["dates"]["soft_doubly_stochastic_lambda"], *[metric(row, k) for k in keys]])
    for row in f["hard_reinforce_baseline_24_epochs"]:
        demo = " (the demo's)" if row["reinforce_baseline"] == "expected" else ""
        rows.append([f"hard, `model.reinforce_baseline={row['reinforce_baseline']}`{demo}, 24 epochs",
                     f["dates"]["hard_reinforce_baseline_24_epochs"], *[metric(row, k) for k in keys]])
    lines = table(["setting", "date", *[METRICS[k] for k in keys]], rows)
    return lines + ["", f"Every run: {f['note']}."], [rec]


def t_demo_bucketing(ctx: Context) -> Rendered:
    rec = ctx.latest("demo_bucket_by_length")
    keys = ["Bleu_4", "CIDEr", "attribute_accuracy", "relation_accuracy", "grounding", "grounding_noun"]
    rows = []
    for row in rec.figures["rows"]:
        precision = "float32" if row["precision"] == "float32" else "bfloat16"
        batches = "bucketed" if row["bucketing"] else "shuffled"
        rows.append([f"{row['attention']}, {precision}, {batches}", row["seed"], *[metric(row, k) for k in keys],
                     num(row.get("trainer_s"), 0)])
    lines = table(["attention, precision, batches", "seed", *[METRICS[k] for k in keys], "Trainer s"], rows)
    f = rec.figures
    return lines + ["", f"{f['epochs']} epochs ({f['steps']:,} steps), {f['root']}; {f['load']}."], [rec]


def t_train_profile(ctx: Context) -> Rendered:
    rec = ctx.latest("train_profile-float32")
    f = rec.figures
    ops = sorted(f["op_types"].items(), key=lambda kv: -kv[1]["share"])
    rows = [[f"`{name}`", f"{v['share'] * 100:.0f}%", num(v["ms_per_step"], 1), num(v["count_per_step"], 0)]
            for name, v in ops]
    lines = table(["op type", "share of the summed op time", "ms per step", "ops per step"], rows)
    sizes = ", ".join(f"{k} {v}" for k, v in f["sizes"].items())
    return lines + ["", f"{f['precision']}, {f['attention']} attention, `{f['attention_score']}` score, sizes "
                        f"{sizes}: step {num(f['step_ms'], 1)} ms (median of {len(f['step_ms_all'])}), "
                        f"{num(f['examples_per_s'], 0)} examples/s."], [rec]


def _latency(record: Record) -> Dict[str, Dict[str, float]]:
    return record.figures.get("latency", {})


def _types_rows(runs: List[Dict[str, Any]], latency: Dict[str, Dict[str, float]], keys: Sequence[str],
                trainer: str) -> List[List[str]]:
    names = {"soft:additive": "soft, additive (the paper's)", "soft:general": "soft, general",
             "soft:dot": "soft, dot", "hard:additive": "hard, additive", "glimpse": "glimpse",
             "spatial_transformer": "spatial_transformer",
             "spatial_transformer:with_penalty": "spatial_transformer with the doubly stochastic penalty"}
    order = list(names)
    rows = []
    for run in sorted(runs, key=lambda r: (order.index(r["model"]), r["seed"])):
        late = latency.get(f"{run['model']} seed {run['seed']}")
        decode = f"{num(late['ms'], 2)} ({num(late['ratio'], 2)})" if late else ""
        guard = run.get("guard_rate")
        rows.append([names[run["model"]], run["seed"], *[metric(run["metrics"], k) for k in keys],
                     num(run.get(trainer), 0), decode, num(guard, 3) if guard is not None else ""])
    return rows


def t_attention_types_scenes(ctx: Context) -> Rendered:
    rec = ctx.latest("attention_types-scenes")
    latency = ctx.latest("attention_types-scenes-recorded")
    keys = ["Bleu_1", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "grounding", "grounding_noun"]
    rows = _types_rows(rec.figures["runs"], _latency(latency), keys, "ms_per_step")
    lines = table(["attention, score", "seed", *[METRICS[k] for k in keys], "Trainer ms/step",
                   "decode ms/image (x soft)", "guard rate"], rows)
    return lines + ["", "spatial_transformer: trained with `model.doubly_stochastic_lambda=0`, what the decoder "
                        "uses for it; with the penalty: the config's 0.01."], [rec, latency]


def t_attention_scores_5seeds(ctx: Context) -> Rendered:
    rec = ctx.latest("attention_types-scenes-general-additive-5seeds")
    keys = ["Bleu_4", "METEOR", "ROUGE_L", "grounding", "grounding_noun"]
    rows = []
    for model in ("soft:additive", "soft:general"):
        runs = sorted((r for r in rec.figures["runs"] if r["model"] == model), key=lambda r: r["seed"])
        cider = [r["metrics"]["CIDEr"] for r in runs]
        means = {k: statistics.mean(r["metrics"][k] for r in runs) for k in keys}
        train = [r["train_seconds_total"] for r in runs if r.get("train_seconds_total") is not None]
        rows.append([model.split(":")[1], ", ".join(num(c) for c in cider), f"**{num(statistics.mean(cider))}**",
                     num(statistics.median(cider)), *[metric(means, k) for k in keys],
                     span(train, 0) if train else ""])
    lines = table(["score", f"CIDEr, seeds {', '.join(str(r['seed']) for r in runs)}", "mean CIDEr",
                   "median", *[f"mean {METRICS[k]}" for k in keys], "training s"], rows)
    return lines, [rec]


def scenes_general_vs_additive(ctx: Context) -> Tuple[float, float]:
    """Mean `scenes` CIDEr of `general` and of additive over the five seeds."""
    rec = ctx.latest("attention_types-scenes-general-additive-5seeds")
    mean = {m: statistics.mean(r["metrics"]["CIDEr"] for r in rec.figures["runs"] if r["model"] == m)
            for m in ("soft:general", "soft:additive")}
    return mean["soft:general"], mean["soft:additive"]


def t_attention_types_demo(ctx: Context) -> Rendered:
    recs = [ctx.latest("attention_types-demo-float32-seed0"), ctx.latest("attention_types-demo-float32-seed1"),
            ctx.latest("attention_types-demo-float32-stn-no-penalty")]
    latency = ctx.latest("attention_types-demo-recorded")
    runs = []
    for rec in recs:
        lambda0 = "model.doubly_stochastic_lambda=0" in rec.figures.get("overrides", [])
        for run in rec.figures["runs"]:
            if run["model"] == "spatial_transformer" and not lambda0:
                run = {**run, "model": "spatial_transformer:with_penalty"}
            runs.append(run)
    keys = ["Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "attribute_accuracy", "relation_accuracy", "grounding",
            "grounding_noun"]
    rows = _types_rows(runs, _latency(latency), keys, "trainer_s")
    lines = table(["attention, score", "seed", *[METRICS[k] for k in keys], "Trainer s (2,688 steps)",
                   "decode ms/image (x soft)", "guard rate"], rows)
    return lines, recs + [latency]


TRAIN_STEP = [("soft", "additive", "mixed_bfloat16"), ("soft", "general", "mixed_bfloat16"),
               ("soft", "dot", "mixed_bfloat16"), ("glimpse", "additive", "mixed_bfloat16"),
               ("spatial_transformer", "additive", "mixed_bfloat16"), ("soft", "additive", "float32"),
               ("soft", "general", "float32")]


def t_train_step(ctx: Context) -> Rendered:
    recs, rows = [], []
    for attention, score, precision in TRAIN_STEP:
        rec = ctx.latest(f"train_step-{attention}-{score}-{precision}")
        f = rec.figures
        recs.append(rec)
        ours, base = f["ours"], f["baseline"]
        if "step_s_all" in ours:  # one run: the median of its repeats
            step, ratio = f"{num(ours['step_s'], 3)} (of {len(ours['step_s_all'])})", f"**{num(f['ratio'], 3)}**"
        else:  # several runs: their median and range
            step = f"{num(ours['step_s'], 3)} (median of {f['runs']} runs, {span(ours['step_s_range'], 3)})"
            ratio = f"**{num(f['ratio'], 2)}** ({span(f['ratio_range'])})"
        rows.append([f"{attention}, {score}", "bfloat16" if precision == "mixed_bfloat16" else "float32", step,
                     num(base["step_s"], 3) if "step_s" in base else span(base["step_s_range"], 3), ratio,
                     num(f["ratio_cpu_time"], 3) if "ratio_cpu_time" in f else span(f["ratio_cpu_time_range"]),
                     num(ours.get("fraction_of_peak"), 2), rec.date])
    old = ctx.file("train_step-2026-11-26-amd-epyc-2c-bf16.json")
    recs.append(old)
    for run in old.figures["runs"]:
        if "--baseline-precision float32" in run["command"]:
            rows.append(["soft, additive", "ours bfloat16, baseline float32 (the tutorial as published)",
                         num(run["ours_s_per_step"], 3), num(run["baseline_s_per_step"], 3),
                         f"**{num(run['ratio'], 2)}**", num(run["ratio_cpu_time"], 2),
                         run["fraction_of_peak"].split(" ")[0], old.date])
    lines = table(["attention, score", "precision", "ours s/step", "baseline s/step", "ratio",
                   "ratio per CPU second", "ours / peak", "date"], rows)
    return lines, recs


def t_optimizer_update(ctx: Context) -> Rendered:
    recs = [ctx.latest("optimizer_update-mixed_bfloat16"), ctx.latest("optimizer_update-float32")]
    rows = [[f"`{r.figures['precision']}`", num(r.figures["keras_ms"], 1), num(r.figures["fused_ms"], 1),
             f"**{num(r.figures['ratio'], 2)}**"] for r in recs]
    f = recs[0].figures
    lines = table(["precision", "Keras Adam ms", "`FusedAdam` ms", "ratio"], rows)
    return lines + ["", f"`{f['attention_score']}` scores: {f['variables']} tensors, "
                        f"{f['parameters'] / 1e6:.1f} M parameters."], recs


def t_precision(ctx: Context) -> Rendered:
    rec = ctx.latest("precision")
    rows = [[r["case"], f"{r['float32']:g} {r['unit']}", f"{r['mixed_bfloat16']:g} {r['unit']}",
             f"{r['speedup']:.2f}x"] for r in rec.figures["rows"]]
    decode = ctx.latest("decode-mixed_bfloat16")
    for key, label in (("native_bf16", "native bfloat16"),
                       ("bf16_off_ONEDNN_MAX_CPU_ISA_AVX512_CORE_VNNI", "oneDNN held to AVX512_CORE_VNNI")):
        d = decode.figures[key]
        rows.append([f"single-image greedy decoding, a model trained in bfloat16 against its float32 twin "
                     f"({label})", f"{d['twin_greedy_ms']:g} ms", f"{d['ours_greedy_ms']:g} ms",
                     f"{d['twin_greedy_ms'] / d['ours_greedy_ms']:.2f}x"])
    lines = table(["case", "float32", "mixed_bfloat16", "speed-up"], rows)
    return lines, [rec, decode]


def t_train_throughput(ctx: Context) -> Rendered:
    rec = ctx.latest("train_throughput")
    rows = [[r["run"], num(r["examples_per_second_default"], 1), f"{r['input_wait_fraction_default'] * 100:.1f}%",
             num(r["examples_per_second_mirrored"], 1), f"{r['input_wait_fraction_mirrored'] * 100:.1f}%",
             num(r["ratio"], 2), r["load_average"]] for r in rec.figures["runs"]]
    lines = table(["run", "default ex/s", "input wait", "mirrored ex/s", "input wait", "mirrored / default",
                   "load average"], rows)
    return lines, [rec]


def t_preprocess(ctx: Context) -> Rendered:
    rec = ctx.latest("preprocess")
    f = rec.figures
    names = {"paper": "paper: VGG19 `block5_conv4`, 224x224 -> 14x14x512",
             "demo": "demo: small CNN 64x64 -> 8x8x130"}
    rows = []
    for key in ("paper", "demo"):
        e = f[key]
        rows.append([names[key], f"{e['images']} ({e['source_image']} JPEG)", e["batch_size"],
                     f"{e['stage_images_per_s']:g}", f"{e['bare_images_per_s']:g}",
                     f"**{num(e['ratio'], 2)}**" if key == "paper" else num(e["ratio"], 2), num(e["cpu_ratio"], 2),
                     f"{num(e['steady_state_ratio'], 2)} / {num(e['steady_state_cpu_ratio'], 2)}"])
    lines = table(["encoder", "images (source)", "batch", "stage img/s", "bare img/s", "ratio", "CPU-time ratio",
                   "steady state (wall / CPU)"], rows)
    return lines + ["", f"Load average {f['load_average']}."], [rec]


def t_scst(ctx: Context) -> Rendered:
    rec = ctx.latest("scst")
    keys = ["Bleu_4", "METEOR", "CIDEr", "grounding", "dangling_ending_rate"]
    rows = []
    for data in ("scenes, soft", "scenes, hard", "demo, soft"):
        runs = rec.figures["rows"][data]
        base = runs[0]
        for run in runs:
            bleu, cider = metric(run, "Bleu_4"), metric(run, "CIDEr")
            if run is not base:
                bleu = f"**{bleu} ({pct(run['Bleu_4'], base['Bleu_4'])})**"
                cider = f"**{cider} ({pct(run['CIDEr'], base['CIDEr'])})**"
            rows.append([data, run["model"], bleu, metric(run, "METEOR"), cider, metric(run, "grounding"),
                         num(run["dangling_ending_rate"], 3)])
    lines = table(["data, attention", "model", *keys], rows)
    trainer = ", ".join(f"{k} {v} s" for k, v in rec.figures["trainer_s"].items())
    return lines + ["", f"SCST {rec.figures['settings']}; Trainer: {trainer}."], [rec]


def t_blessing_noise(ctx: Context) -> Rendered:
    rec = ctx.latest("blessing_noise")
    f = rec.figures
    rows = []
    for name, m in f["metrics"].items():
        pairs = [p for p in f["pairs"] if name == p["candidate"] or name.startswith(p["candidate"] + ",")]
        verdicts: Dict[str, List[str]] = {}
        for p in pairs:
            verdicts.setdefault(p["verdict"], []).append(p["baseline"])
        against = "; ".join(f"{v} against {', '.join(b)}" for v, b in verdicts.items())
        rows.append([name, metric(m, "Bleu_4"), num(m["CIDEr"], 3), metric(m, "relation_accuracy"), against])
    lines = table(["model", "Bleu_4", "CIDEr", "relation", "candidate against the others"], rows)
    return lines, [rec]


def t_readme_quality(ctx: Context) -> Rendered:
    soft = ctx.latest("demo")
    hard = ctx.latest("demo_attention")
    keys = ["Bleu_4", "METEOR", "CIDEr", "attribute_accuracy", "relation_accuracy", "grounding", "grounding_noun"]
    rows = [[f"soft attention, `make demo` as served ({where(soft)})", *[metric(soft.figures[
                "test_metrics_soft_as_served"], k) for k in keys]],
            [f"hard attention, seed 0, the config of its date (24 epochs; scored on the stored grids; "
             f"{where(hard)})",
             *[metric(hard.figures["hard"], k) for k in keys]],
            ["target (soft attention)", ">= 0.75", "", ">= 5.0", ">= 0.85", ">= 0.85", ">= 0.80", ""]]
    lines = table(["model", "Bleu_4", "METEOR", "CIDEr", "attribute_accuracy", "relation_accuracy", "grounding",
                   "grounding_noun"], rows)
    return lines + ["", "Blank: not recorded for that run."], [soft, hard]
