"""Run one fairseq CLI in this process and record its peak CUDA memory (bench_fairseq_gpu.py's runner).

    python -m fw_research.benchmarks.fairseq_run RECORD_JSON {preprocess,train,generate} [fairseq arguments ...]

The fairseq entry points are called as their console scripts would call them, so the node needs no
installed scripts (the kit installs fairseq with `pip --target`). RECORD_JSON receives
{"peak_MiB": ...}: the CUDA caching allocator's high-water mark over the whole run (null on a CPU).

With FW_PROFILE_UPDATE=N in the environment, `train` runs its N-th update (1-based) under torch.profiler
and RECORD_JSON also gets "profile": the top FW_PROFILE_TOP (default 15) operators of that update by self
time on the device (CUDA kernels on a GPU, CPU operators on a CPU), each with its calls, milliseconds and
share of the update's self time. One update only: the profiler's overhead stays out of the other updates.

With FW_PROFILE_WINDOW=K, `train` profiles two windows of K updates: one in the first epoch and one in the second
(each after the epoch's first update, which spans the epoch's start), and RECORD_JSON gets "windows", one summary
each (window_summary): per update the wall and device-busy milliseconds, the kernels launched, the host's median
gap between launches, the device-to-host synchronisations (torch.cuda.set_sync_debug_mode), the allocator's
cudaMalloc and cudaFree calls; and the window's top operators. The two windows side by side say where an update's
time goes in the steady state and what differs from the first epoch.

With FW_NO_FUSED_READ=1, no block takes the fused read (fw_fairseq/ops/fused_read): every one takes the path it
replaces, so that a benchmark can time the two paths of one configuration end to end.
"""
import importlib
import json
import os
import statistics
import sys
import time
import warnings

import torch

ENTRY = {"preprocess": "fairseq_cli.preprocess", "train": "fairseq_cli.train", "generate": "fairseq_cli.generate"}


def top_ops(prof, top, on_gpu):
    """The profile's `top` operators by self time on the device: [{name, calls, self_ms, percent}]."""
    def self_us(event):
        if not on_gpu:
            return event.self_cpu_time_total
        # torch >= 2.4 names it self_device_time_total; older versions self_cuda_time_total
        return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)

    events = [e for e in prof.key_averages() if self_us(e) > 0]
    total = sum(self_us(e) for e in events) or 1.0
    events.sort(key=self_us, reverse=True)
    return {"clock": "self CUDA time" if on_gpu else "self CPU time", "total_ms": round(total / 1e3, 3),
            "ops": [{"name": e.key[:120], "calls": e.count, "self_ms": round(self_us(e) / 1e3, 3),
                     "percent": round(100 * self_us(e) / total, 1)} for e in events[:top]]}


def profiler_activities(on_gpu):
    """What torch.profiler records: the host, and the device where there is one."""
    return [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_gpu else [])


def profile_one_update(update, top, record):
    """Wrap fairseq's Trainer.train_step so that its `update`-th call runs under torch.profiler."""
    from fairseq.trainer import Trainer

    step, calls = Trainer.train_step, [0]
    on_gpu = torch.cuda.is_available()
    activities = profiler_activities(on_gpu)

    def train_step(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] != update:
            return step(self, *args, **kwargs)
        # a profiler that cannot start or finish here (no CUPTI) costs the table, not the training run
        prof = torch.profiler.profile(activities=activities)
        try:
            prof.__enter__()
        except Exception as err:
            record["profile"] = {"error": f"{type(err).__name__}: {err}", "update": update}
            return step(self, *args, **kwargs)
        out = step(self, *args, **kwargs)
        if on_gpu:
            torch.cuda.synchronize()
        try:
            prof.__exit__(None, None, None)
            record["profile"] = dict(top_ops(prof, top, on_gpu), update=update)
        except Exception as err:
            record["profile"] = {"error": f"{type(err).__name__}: {err}", "update": update}
        return out

    Trainer.train_step = train_step


LAUNCHES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"}


def window_summary(prof, updates, wall_s, syncs, on_gpu, top):
    """Per-update means of a window of `updates` profiled updates (wall_s seconds, `syncs` synchronisation warnings;
    None on a CPU, which has none of these), and its top operators by self device time."""
    events = list(prof.events())
    launches = sorted(e.time_range.start for e in events if e.name in LAUNCHES)  # microseconds
    gaps = [b - a for a, b in zip(launches, launches[1:])]
    ops = top_ops(prof, top, on_gpu)

    def per_update(count):
        return round(count / updates, 1) if on_gpu else None

    return {"updates": updates, "wall_ms": round(1e3 * wall_s / updates, 2),
            "device_busy_ms": round(ops["total_ms"] / updates, 2) if on_gpu else None,
            "kernels": per_update(len(launches)),
            "host_gap_us_median": round(statistics.median(gaps), 1) if on_gpu and gaps else None,
            "syncs": per_update(syncs) if syncs is not None else None,
            "cuda_malloc": per_update(sum(e.name == "cudaMalloc" for e in events)),
            "cuda_free": per_update(sum(e.name == "cudaFree" for e in events)), "top": ops["ops"]}


def profile_windows(size, top, record):
    """Wrap fairseq's Trainer (begin_epoch, train_step) so that `size` consecutive updates of the first epoch and
    `size` of the second, from each epoch's second update, run under one torch.profiler window each
    (window_summary)."""
    from fairseq.trainer import Trainer

    begin, step = Trainer.begin_epoch, Trainer.train_step
    on_gpu = torch.cuda.is_available()
    activities = profiler_activities(on_gpu)
    state = {"epoch": 0, "in_epoch": 0, "open": None}
    record["windows"] = []

    def begin_epoch(self, epoch):
        if state["open"] is not None:  # an epoch shorter than the window: the window ends with it
            close_window()
        state["epoch"], state["in_epoch"] = int(epoch), 0
        return begin(self, epoch)

    def open_window():
        prof, caught = torch.profiler.profile(activities=activities), warnings.catch_warnings(record=True)
        prof.__enter__()
        state["open"], state["count"] = (prof, caught, caught.__enter__()), 0
        warnings.simplefilter("always")
        if on_gpu:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
        state["start"] = time.perf_counter()

    def close_window():
        if on_gpu:
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()
        wall = time.perf_counter() - state["start"]
        prof, caught, warned = state["open"]
        caught.__exit__(None, None, None)
        prof.__exit__(None, None, None)
        syncs = sum("synchroniz" in str(w.message) for w in warned) if on_gpu else None
        record["windows"].append(dict(window_summary(prof, state["count"], wall, syncs, on_gpu, top),
                                      epoch=state["epoch"]))
        state["open"] = None

    def train_step(self, *args, **kwargs):
        state["in_epoch"] += 1
        if state["epoch"] in (1, 2) and state["in_epoch"] == 2:
            open_window()
        out = step(self, *args, **kwargs)
        if state["open"] is not None:
            state["count"] += 1
            if state["count"] == size:
                close_window()
        return out

    Trainer.begin_epoch, Trainer.train_step = begin_epoch, train_step


def no_fused_read():
    """No length is within the fused read's CROSSOVER, so its dispatch hands every block to the other path."""
    from fw_fairseq.ops.fused_read import dispatch

    dispatch.CROSSOVER = {mode: (0, 0) for mode in dispatch.MODES}


def main():
    if len(sys.argv) < 3 or sys.argv[2] not in ENTRY:
        raise SystemExit(f"usage: fairseq_run.py RECORD_JSON {{{','.join(ENTRY)}}} [fairseq arguments ...]")
    record_file, command = sys.argv[1], sys.argv[2]
    sys.argv = [f"fairseq-{command}", *sys.argv[3:]]
    record = {}
    if os.environ.get("FW_NO_FUSED_READ") == "1":
        no_fused_read()
    if command == "train" and os.environ.get("FW_PROFILE_WINDOW"):
        profile_windows(int(os.environ["FW_PROFILE_WINDOW"]), int(os.environ.get("FW_PROFILE_TOP", "15")), record)
    if command == "train" and os.environ.get("FW_PROFILE_UPDATE"):
        profile_one_update(int(os.environ["FW_PROFILE_UPDATE"]), int(os.environ.get("FW_PROFILE_TOP", "15")), record)
    try:
        importlib.import_module(ENTRY[command]).cli_main()
    finally:
        record["peak_MiB"] = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
        with open(record_file, "w") as f:
            json.dump(record, f)


if __name__ == "__main__":
    main()
