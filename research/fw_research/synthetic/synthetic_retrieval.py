#!/usr/bin/env python
"""Synthetic associative retrieval, settings 1 and 2 of the paper (§6.1, Figures 2 and 3).

    python -m fw_research.synthetic.synthetic_retrieval --setting 1 2 --quick        # ~15 min on 2 CPU cores
    python -m fw_research.synthetic.synthetic_retrieval --setting 1 --full --device cuda

Writes <out>/setting{N}_{mode}.{json,csv} after every finished (model, S) cell and skips the cells
already there, so an interrupted run resumes where it stopped. Then draws
<figures>/synthetic_capacity_{mode}.png (setting 1, Figure 2 style) and
<figures>/synthetic_update_rules_{mode}.png (setting 2, Figure 3 style). See docs/synthetic_retrieval.md.
"""
import argparse
import csv
import json
import os
import sys
import time
from dataclasses import replace

import torch

from fw_research.synthetic import RetrievalMemory, TrainConfig, train
from fw_research.synthetic.plots import plot_capacity, plot_learning_curves

# name: (feature map, update rule, nu or m, TrainConfig overrides)
SETTING1_MODELS = {
    "softmax": ("softmax", "sum", None, {}),
    "linear": ("elu", "sum", None, {}),
    "favor-64": ("favor", "sum", 64, {}),
    "favor-128": ("favor", "sum", 128, {}),
    "favor-512": ("favor", "sum", 512, {}),
    "dpfp-1": ("dpfp", "sum", 1, {}),
    "dpfp-2": ("dpfp", "sum", 2, {}),
    "dpfp-3": ("dpfp", "sum", 3, {}),
}
SETTING2_MODELS = {
    "sum": ("dpfp", "sum", 1, {}),
    "ours (delta)": ("dpfp", "delta", 1, {}),
    # beyond the paper: Gated DeltaNet's decay (Yang et al. 2024), alpha = sigmoid(w x + 5) ~ 1 at start
    "gated delta": ("dpfp", "gated_delta", 1, {}),
    # the authors' code trains the tanh FWM with lr 1e-4 and batch 128 ("necessary for FWM")
    "schlag2021": ("tanh", "schlag", None, {"lr": 1e-4, "batch_size": 128}),
    "schlag2021+dpfp": ("dpfp", "schlag", 1, {}),
}
MODELS = {1: SETTING1_MODELS, 2: SETTING2_MODELS}

# Full: the paper's grid and stopping rule. Quick: a CPU-sized subset with step caps (the doc says
# what that changes): S <= 200, no FAVOR+ m = 128/512 (E = 256/1024 dominate the CPU time) and no
# DPFP-3 (for S <= 200 < 256 it cannot differ from DPFP-2), and the Schlag (2021) writes capped
# hardest (one op call per position: L = 40 calls per forward).
GRIDS = {
    ("full", 1): (list(range(20, 601, 20)), list(SETTING1_MODELS), TrainConfig(), {}),
    ("full", 2): (list(range(20, 201, 20)), list(SETTING2_MODELS), TrainConfig(), {}),
    ("quick", 1): (
        [20, 40, 60, 80, 120, 160, 200],
        ["softmax", "linear", "favor-64", "dpfp-1", "dpfp-2"],
        TrainConfig(max_steps=600, eval_every=50, patience=200),
        {},
    ),
    ("quick", 2): (
        [20],
        list(SETTING2_MODELS),
        TrainConfig(max_steps=1500, eval_every=50, patience=500),
        {"schlag2021": {"max_steps": 300}, "schlag2021+dpfp": {"max_steps": 600}},
    ),
}
CSV_FIELDS = ["setting", "model", "S", "L", "d_dot", "best_eval_loss", "final_eval_loss", "steps", "stop",
              "seconds", "lr", "batch_size", "seed", "device"]


def load_cells(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)["cells"]


def save_cells(cells, setting, mode, out):
    """JSON (with learning curves) and CSV (one row per cell), each written to a temp file then renamed
    so an interrupted run never leaves a truncated results file."""
    cells = sorted(cells, key=lambda c: (c["model"], c["S"]))
    stem = os.path.join(out, f"setting{setting}_{mode}")
    with open(stem + ".json.tmp", "w") as f:
        json.dump({"setting": setting, "mode": mode, "cells": cells}, f, indent=1)
    os.replace(stem + ".json.tmp", stem + ".json")
    with open(stem + ".csv.tmp", "w", newline="") as f:
        writer = csv.DictWriter(f, CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(cells)
    os.replace(stem + ".csv.tmp", stem + ".csv")


def run_cell(setting, name, S, config, device, verbose):
    feature_map, rule, arg, _ = MODELS[setting][name]
    length, replace_ = (S, False) if setting == 1 else (2 * S, True)
    torch.manual_seed(config.seed)
    model = RetrievalMemory(S, feature_map, rule, arg).to(device)
    log = (lambda msg: print(f"    {name} S={S} {msg}", flush=True)) if verbose else None
    result = train(model, S, length, replace_, config, device=device, log=log)
    return {"setting": setting, "model": name, "S": S, "L": length, "d_dot": model.d_dot, "lr": config.lr,
            "batch_size": config.batch_size, "seed": config.seed, "device": str(device), **result}


def run_setting(setting, mode, args):
    sizes, names, base, caps = GRIDS[(mode, setting)]
    sizes = args.sizes or sizes
    names = args.models or names
    path = os.path.join(args.out, f"setting{setting}_{mode}.json")
    cells = load_cells(path)
    done = {(c["model"], c["S"]) for c in cells}
    for S in sizes:
        for name in names:
            if (name, S) in done:
                continue
            overrides = {**MODELS[setting][name][3], **caps.get(name, {}), "seed": args.seed}
            if args.max_steps:
                overrides["max_steps"] = args.max_steps
            config = replace(base, **overrides)
            cell = run_cell(setting, name, S, config, args.device, args.verbose)
            cells.append(cell)
            save_cells(cells, setting, mode, args.out)
            print(f"setting {setting}  {name:16s} S={S:4d}  best {cell['best_eval_loss']:.5f}  "
                  f"steps {cell['steps']:6d} ({cell['stop']})  {cell['seconds']:.0f}s", flush=True)
    return cells


def plot(setting, mode, cells, figures):
    if not cells:
        return
    if setting == 1:
        capacities = {}
        for c in cells:
            if c["d_dot"]:
                capacities[c["model"]] = c["d_dot"]
        plot_capacity(cells, os.path.join(figures, f"synthetic_capacity_{mode}.png"),
                      f"Setting 1: capacity (d_key = 64, L = S, {mode})", order=list(SETTING1_MODELS),
                      capacities=capacities)
        return
    sizes = sorted({c["S"] for c in cells})
    first = [c for c in cells if c["S"] == sizes[0]]
    plot_learning_curves(first, os.path.join(figures, f"synthetic_update_rules_{mode}.png"),
                         f"Setting 2: update rules (DPFP-1, S = {sizes[0]}, L = {2 * sizes[0]}, {mode})",
                         order=list(SETTING2_MODELS))
    if len(sizes) > 1:  # the appendix's Figure 5: final loss against S for setting 2
        plot_capacity(cells, os.path.join(figures, f"synthetic_update_rules_capacity_{mode}.png"),
                      f"Setting 2: update rules against S (L = 2S, {mode})", order=list(SETTING2_MODELS))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", type=int, nargs="+", choices=[1, 2], default=[1, 2])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--quick", action="store_const", const="quick", dest="mode")
    mode.add_argument("--full", action="store_const", const="full", dest="mode")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", default="results/synthetic")
    parser.add_argument("--figures", default="docs/figures")
    # one thread by default: the models are small enough that a second thread gains little, and on a
    # shared machine torch's spinning worker threads slow everyone down (measured: 5-13x slower per step)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sizes", type=int, nargs="+", help="override the mode's list of S")
    parser.add_argument("--models", nargs="+", help="override the mode's list of models")
    parser.add_argument("--max-steps", type=int, help="override every cell's step cap")
    parser.add_argument("--plot-only", action="store_true", help="redraw the figures from the results files")
    parser.add_argument("--verbose", action="store_true", help="print every evaluation")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False")
    for setting in args.setting:
        unknown = set(args.models or ()) - set(MODELS[setting])
        if unknown:
            parser.error(f"--models {sorted(unknown)} not in setting {setting}: {list(MODELS[setting])}")
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.figures, exist_ok=True)
    start = time.time()
    for setting in args.setting:
        if args.plot_only:
            cells = load_cells(os.path.join(args.out, f"setting{setting}_{args.mode}.json"))
        else:
            cells = run_setting(setting, args.mode, args)
        plot(setting, args.mode, cells, args.figures)
    print(f"done in {time.time() - start:.0f}s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
