"""The GPU check on an offline node (run through research/fw_research/gpu_node/gpu_check.sh): install the kit, build,
check, time.

    research/fw_research/gpu_node/gpu_check.sh --kit ../gpu_kit --out gpu_check_out  # everything (about 12 min, H100)
    research/fw_research/gpu_node/gpu_check.sh --part kernels --out $OUT    # kit, extension, fused read, sanitizers,
                                                                            # tests/cuda, ops
    research/fw_research/gpu_node/gpu_check.sh --part fairseq --out $OUT    # kit, fairseq build, CUDA-graph step,
                                                                            # end-to-end timing
    research/fw_research/gpu_node/gpu_check.sh --dry-run                    # print the plan, run nothing

Each step runs in its own process under a time limit taken from what is left of --budget-s; a failing or
timed-out step is recorded and the next one runs. The output folder gets check.json (machine, versions,
every step's status, time and log tail), logs.txt (every step's full output), the benchmarks' JSON files
and summary.md (fw_research.gpu_node.gpu_summary), at most 8 files so that a remote run can return all of them.
Builds go to ignored folders of the checkout (.gpu_site/ for the kit and fairseq, fw_fairseq/_cuda*.so),
stamped with what they were built from, so a second part on the same machine skips them; where the kit holds
the same build made beforehand (fw_research.gpu_node.gpu_prebuilt: same files, torch, Python and GPU), it is unpacked
and imported instead ("prebuilt"), and the device's time goes to the checks.
Triton compiles into .gpu_site/triton_cache (TRITON_CACHE_DIR): warm_triton fills it before the fused read's tests
and benchmark, from the kit's cache of the benchmark's kernels compiled beforehand
(fw_research.gpu_node.gpu_triton_cache) where it fits the node's Triton, else by compiling them here, so that the
timed steps start warm.
"""
import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fw_research.gpu_node.gpu_prebuilt import ITEMS as PREBUILT, digest, sdist, sources, unpack

REPO = Path(__file__).resolve().parents[3]
RESEARCH = REPO / "research"  # fw_research, on the steps' PYTHONPATH beside the checkout (nothing is installed)
PARTS = ("all", "kernels", "fairseq")
SUMMARY_RESERVE_S = 15  # kept back from the budget so check.json and summary.md are always written


@dataclass(frozen=True)
class Step:
    name: str
    parts: tuple  # which --part runs it ("all" runs every step)
    max_s: int  # its own limit; the budget left may cut it shorter
    min_s: int  # below this much budget left it is skipped, not started
    what: str


STEPS = [
    Step("environment", ("kernels", "fairseq"), 60, 5, "GPU, driver, torch, CUDA, nvcc, compute-sanitizer versions"),
    Step("install_kit", ("kernels", "fairseq"), 120, 20, "the kit's wheels into .gpu_site/ (pip --no-index --target)"),
    Step("build_fairseq", ("fairseq",), 300, 60, "fairseq-fixed from its sdist against the node's torch"),
    Step("build_extension", ("kernels", "fairseq"), 300, 60, "fw_fairseq._cuda for this GPU (setup.py build_ext)"),
    # the fused read first: the newest kernels get the device's time before the older, slower steps
    # in both parts: the kit's cache holds the benchmark's reads and those of transformer_fw_big --fp16 training
    Step("warm_triton", ("kernels", "fairseq"), 120, 10, "Triton's cache of the fused read's kernels: the kit's, or "
         "compiled here (fw_research.gpu_node.gpu_triton_cache --device cuda)"),
    Step("pytest_fused", ("kernels",), 150, 20, "python -m pytest tests/ops/test_fused_read*.py, compiled on CUDA"),
    # fla's kernels autotune on their first call of each shape: 20-30 s each on an H100
    Step("bench_fused", ("kernels",), 240, 30, "fw_research.benchmarks.bench_fused_read_gpu --quick"),
    Step("pytest_cuda", ("kernels",), 240, 30, "python -m pytest tests/cuda"),
    Step("memcheck", ("kernels",), 150, 30, "compute-sanitizer --tool memcheck over every kernel, small shapes"),
    Step("racecheck", ("kernels",), 150, 30, "compute-sanitizer --tool racecheck over every kernel, small shapes"),
    Step("build_fast_transformers", ("kernels",), 180, 40, "fast-transformers' causal_product from its sdist"),
    Step("bench_ops", ("kernels",), 300, 60, "fw_research.benchmarks.bench_gpu --quick"),
    Step("cuda_graph", ("fairseq",), 120, 20, "fw_research.benchmarks.gpu_cuda_graph: a FastWeightAttention decoding "
         "step captured in a CUDA graph replays as it runs eagerly; a compiled training layer on the kernels equals "
         "eager (needs fairseq: after build_fairseq)"),
    Step("bench_fairseq", ("fairseq",), 420, 90, "fw_research.benchmarks.bench_fairseq_gpu: train and generate timing"),
    Step("compare", ("fairseq",), 540, 120, "fw_research.demo.compare_attention --compare-args on this GPU, from a "
         "carried work directory (the catalogs' corpus is built where they are, docs/gpu_node.md)"),
]

# why a step has no command here (Check.commands gives None)
NO_COMMAND = {"pytest_fused": "no tests/ops/test_fused_read*.py here", "compare": "no --compare-args given"}


class Check:
    """Runs the steps of one part, records them, writes check.json and logs.txt as it goes."""

    def __init__(self, args):
        self.args, self.out, self.kit = args, args.out, args.kit
        self.site = REPO / ".gpu_site"
        self.deadline = time.monotonic() + args.budget_s - SUMMARY_RESERVE_S
        self.record = {"part": args.part, "commit": os.environ.get("FW_COMMIT") or git_commit(),
                       "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "environment": {}, "steps": []}
        # fairseq runs from its built source tree (build_fairseq); a missing folder on the path is harmless,
        # and a step run alone (--only bench_fairseq on a warm machine) still finds it
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(self.site / "fairseq-src"), str(self.site),
                                                                str(REPO), str(RESEARCH)]),
                        PATH=os.pathsep.join([str(self.site / "bin"), os.environ.get("PATH", "")]),
                        PYTHONUNBUFFERED="1", TRITON_CACHE_DIR=str(self.site / "triton_cache"))
        self.env.pop("TRITON_INTERPRET", None)  # the Triton kernels run compiled here
        cuda_home = find_cuda_home()
        if cuda_home:
            self.env["CUDA_HOME"] = cuda_home

    def commands(self):
        """{step name: argv} for this machine; also what --dry-run prints."""
        py, kit, out, site = sys.executable, self.kit, self.out, self.site
        jobs = str(os.cpu_count() or 4)
        wheels = sorted(str(p) for p in kit.glob("*.whl"))
        fairseq, peer = sdist(kit, "build_fairseq"), sdist(kit, "build_fast_transformers")
        sanitize = [py, "-m", "fw_research.benchmarks.gpu_sanitize_cases"]
        cuda_bin = Path(self.env.get("CUDA_HOME", "/usr/local/cuda"), "bin", "compute-sanitizer")
        sanitizer = shutil.which("compute-sanitizer") or (str(cuda_bin) if cuda_bin.exists() else "compute-sanitizer")
        fused_tests = [str(p.relative_to(REPO)) for p in sorted((REPO / "tests" / "ops").glob("test_fused_read*.py"))]
        # each parity case compiles its own kernels (one per map, mode and size class): spread over the cores
        # where pytest-xdist is there, else Triton's compiles alone take most of the step's limit
        spread = ["-n", str(min(8, os.cpu_count() or 1))] if importlib.util.find_spec("xdist") else []
        return {
            "environment": [py, "-m", "fw_research.gpu_node.gpu_check", "--environment-only", "--out", str(out)],
            "install_kit": [py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--upgrade", "--target", str(site), *wheels],
            # built in place in its unpacked source (fairseq runs from a source tree), against the node's
            # torch, numpy and cython; its extensions one after the other, each compiled by ninja with MAX_JOBS
            # at once (`build_ext -j` built them side by side, and torch's ninja builds of several extensions in
            # one build folder overwrote each other's files: on an H100 node the links found no .o); CUDA_HOME
            # unset so fairseq skips its CUDA extensions
            "build_fairseq": ["bash", "-c", 'rm -rf "$1" && mkdir -p "$1" && tar xzf "$2" -C "$1" --strip-components 1 '
                              '&& cd "$1" && env -u CUDA_HOME MAX_JOBS="$4" "$3" setup.py -q build_ext --inplace',
                              "build_fairseq", str(site / "fairseq-src"), str(fairseq), py, jobs],
            "build_extension": ["env", f"MAX_JOBS={jobs}", py, "setup.py", "-q", "build_ext", "--inplace"],
            "build_fast_transformers": [py, "-m", "fw_research.gpu_node.gpu_build_peer", str(peer), str(site)],
            "memcheck": [sanitizer, "--tool", "memcheck", "--error-exitcode", "3", *sanitize],
            "racecheck": [sanitizer, "--tool", "racecheck", "--error-exitcode", "3", *sanitize],
            "warm_triton": [py, "-m", "fw_research.gpu_node.gpu_triton_cache", "--cache", str(site / "triton_cache"),
                            "--device", "cuda"],
            # None where the checkout has none yet: pytest given no file would run every test
            "pytest_fused": ([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *spread, *fused_tests]
                             if fused_tests else None),
            "bench_fused": [py, "-m", "fw_research.benchmarks.bench_fused_read_gpu", "--quick", "--out",
                            str(out / "bench_fused_read.json")],
            "pytest_cuda": [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/cuda"],
            "bench_ops": [py, "-m", "fw_research.benchmarks.bench_gpu", "--quick", "--out",
                          str(out / "bench_gpu.json")],
            "cuda_graph": [py, "-m", "fw_research.benchmarks.gpu_cuda_graph"],
            "bench_fairseq": [py, "-m", "fw_research.benchmarks.bench_fairseq_gpu", "--out",
                              str(out / "bench_fairseq.json"), "--work", "/tmp/fw_bench_fairseq",
                              *shlex.split(self.args.bench_fairseq_args)],
            "compare": ([py, "-m", "fw_research.demo.compare_attention", "--out-dir", str(out / "compare"),
                         *shlex.split(self.args.compare_args)] if self.args.compare_args else None),
        }

    def stamps(self):
        """{step: (stamp file, what it was built from)} for the steps a warm machine may skip: the
        digest of the sources and the Python that built them (another interpreter needs its own build)."""
        python = f"{sys.executable} {platform.python_version()}"
        built = {"build_fairseq": self.site / ".fairseq", "build_extension": REPO / "fw_fairseq" / ".cuda_build",
                 "build_fast_transformers": self.site / ".fast_transformers",
                 "warm_triton": self.site / ".triton_cache"}
        stamps = {"install_kit": (self.site / ".kit", sorted(self.kit.glob("*.whl"))),
                  **{step: (stamp, sources(step, REPO, self.kit)) for step, stamp in built.items()}}
        return {step: (stamp, f"{python} {digest(*files)}") for step, (stamp, files) in stamps.items()}

    def run(self, steps):
        commands, stamps = self.commands(), self.stamps()
        self.out.mkdir(parents=True, exist_ok=True)
        for step in steps:
            left = self.deadline - time.monotonic()
            entry = {"name": step.name, "what": step.what, "command": shlex.join(commands[step.name] or [])}
            stamp, want = stamps.get(step.name, (None, None))
            if commands[step.name] is None:
                entry.update(command="", status="skipped", seconds=0.0, tail=NO_COMMAND[step.name])
            elif stamp is not None and stamp.exists() and stamp.read_text() == want:
                entry.update(status="cached", seconds=0.0, tail="already built from the same files on this machine")
            elif left < step.min_s:
                entry.update(status="skipped", seconds=0.0, tail=f"out of budget: {left:.0f} s left, needs {step.min_s}")
            else:
                if not self.prebuilt(step, entry):
                    entry.update(self.execute(step, commands[step.name], min(step.max_s, left)))
                if entry["status"] in ("ok", "prebuilt") and stamp is not None:  # the next part skips it
                    stamp.parent.mkdir(parents=True, exist_ok=True)
                    stamp.write_text(want)
            self.record["steps"].append(entry)
            print(f"gpu_check: {step.name:<24} {entry['status']:<8} {entry['seconds']:7.1f} s", flush=True)
            self.save()

    def prebuilt(self, step, entry):
        """Whether the kit's build of this step (fw_research.gpu_node.gpu_prebuilt) was unpacked in its place; entry
        gets its status, or the reason it was not used (the step then builds)."""
        if step.name not in PREBUILT:
            return False
        start, node = time.monotonic(), self.record["environment"]
        try:
            used, why = unpack(step.name, self.kit, REPO, self.site, node, self.env)
        except (OSError, ValueError, subprocess.SubprocessError) as err:  # a kit it cannot read: build instead
            used, why = False, f"unpacking failed: {err}"
        entry["prebuilt"] = why
        if used:
            entry.update(status="prebuilt", rc=0, seconds=round(time.monotonic() - start, 1), tail=why)
        return used

    def execute(self, step, argv, limit):
        start = time.monotonic()
        with open(self.out / "logs.txt", "a") as log:
            log.write(f"\n===== {step.name}: {shlex.join(argv)} (limit {limit:.0f} s)\n")
            log.flush()
            try:
                proc = subprocess.run(argv, cwd=REPO, env=self.env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, errors="replace", timeout=limit)
                output, rc = proc.stdout, proc.returncode
                status = "ok" if rc == 0 else "failed"
            except subprocess.TimeoutExpired as err:
                output = err.stdout if isinstance(err.stdout, str) else (err.stdout or b"").decode(errors="replace")
                rc, status = None, "timeout"
            except FileNotFoundError as err:  # e.g. no compute-sanitizer on this machine
                output, rc, status = f"{err}\n", None, "failed"
            log.write(output)
        return {"status": status, "rc": rc, "seconds": round(time.monotonic() - start, 1),
                "tail": "\n".join(output.strip().splitlines()[-25:])}

    def save(self):
        env_file = self.out / "environment.json"
        if env_file.exists():  # written by the environment step's own process
            self.record["environment"] = json.loads(env_file.read_text())
        (self.out / "check.json").write_text(json.dumps(self.record, indent=1) + "\n")


def find_cuda_home():
    """CUDA_HOME as given, else the toolkit that holds cuda_runtime.h: torch's build takes the folder above
    `which nvcc`, which is wrong where nvcc on the PATH is a wrapper script (/usr/local/bin/nvcc)."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    nvcc = shutil.which("nvcc")
    candidates = [Path(os.path.realpath(nvcc)).parents[1]] if nvcc else []
    for home in [*candidates, Path("/usr/local/cuda")]:
        if (home / "include" / "cuda_runtime.h").exists():
            return str(home)
    return None


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None  # a copy of the tree without .git: pass FW_COMMIT


def environment(out):
    """The machine and its stack, as environment.json in out (its own step, so a broken CUDA is recorded)."""
    import torch

    def tool(*argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            return None

    smi = tool("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")
    try:  # the kit's Triton cache fits one Triton build (gpu_prebuilt.unpack compares it); not imported: slow
        triton_version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton_version = None
    info = {"python": platform.python_version(), "host": platform.node(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton_version, "nvidia_smi": smi,
            "nvcc": (tool("nvcc", "--version") or "").splitlines()[-1:] or None,
            "compute_sanitizer": (tool("compute-sanitizer", "--version") or "").splitlines()[-1:] or None,
            # the C++ compiler the extensions are built with, and the C++ runtime that torch runs on: the
            # first H100 run built with a g++ under /opt/gcc and its number-formatting error paths segfaulted
            "cxx": {"compiler": shutil.which(os.environ.get("CXX", "c++")),
                    "version": (tool(os.environ.get("CXX", "c++"), "--version") or "").splitlines()[:1] or None,
                    "torch_abi": torch._C._GLIBCXX_USE_CXX11_ABI,
                    "libstdcxx": sorted({line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                                         if "libstdc++" in line})}}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=props.name, capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                    memory_GiB=round(props.total_memory / 2**30, 1))
    (out / "environment.json").write_text(json.dumps(info, indent=1) + "\n")
    print(json.dumps(info, indent=1))
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch sees no CUDA device on this machine")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="research/fw_research/gpu_node/gpu_check.sh",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=PARTS, default="all",
                        help="all steps, or one of the two halves that each fit a 10-minute slot")
    parser.add_argument("--kit", type=Path, default=REPO / "gpu_kit", help="the folder `make gpu-kit` filled")
    parser.add_argument("--out", type=Path, default=REPO / "gpu_check_out", help="where the results go")
    parser.add_argument("--budget-s", type=float, help="seconds for the whole run (default: 540 per part, "
                        "1200 for all)")
    parser.add_argument("--only", nargs="+", choices=[s.name for s in STEPS], metavar="STEP",
                        help="run only these steps of the part, and the environment step (stamped builds are still "
                        "reused)")
    parser.add_argument("--bench-fairseq-args", default="", metavar="ARGS",
                        help="more arguments for the bench_fairseq step (fw_research.benchmarks.bench_fairseq_gpu), "
                        "one quoted string, e.g. '--configs softmax dpfp2_sum dpfp2_sum_unfused --updates 150'")
    parser.add_argument("--compare-args", default="", metavar="ARGS",
                        help="arguments of the compare step (fw_research.demo.compare_attention; none: no compare), "
                        "one quoted string, e.g. '--preset base --updates 2000 --seeds 1 2 3 --configs softmax "
                        "dpfp2-sum-vconv3 --jobs 6'")
    parser.add_argument("--dry-run", action="store_true", help="print the steps and their commands, run nothing")
    parser.add_argument("--environment-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.budget_s is None:
        args.budget_s = 1200.0 if args.part == "all" else 540.0
    if args.budget_s <= SUMMARY_RESERVE_S:
        parser.error(f"argument --budget-s: must be more than {SUMMARY_RESERVE_S} seconds")
    args.kit, args.out = args.kit.resolve(), args.out.resolve()
    if not args.dry_run and not args.environment_only and not (args.kit / "MANIFEST.json").exists():
        parser.error(f"argument --kit: {args.kit} has no MANIFEST.json; run `make gpu-kit` on a machine with "
                     "network and copy the folder here")
    return args


def plan(part, only=None):
    """The part's steps, or those of them --only names, and the environment step always: the kit's prebuilt builds
    are matched against the node it records (gpu_prebuilt.unpack), so without it every build would run from source."""
    return [s for s in STEPS if (part == "all" or part in s.parts) and (not only or s.name in (*only, "environment"))]


def main(argv=None):
    args = parse_args(argv)
    if args.environment_only:
        return environment(args.out)
    check = Check(args)
    steps = plan(args.part, args.only)
    if args.dry_run:
        commands = check.commands()
        for s in steps:
            command = shlex.join(commands[s.name]) if commands[s.name] else "(nothing to run in this checkout)"
            print(f"{s.name:<24} ≤{s.max_s:>4} s  {s.what}\n    {command}")
        return
    check.run(steps)
    subprocess.run([sys.executable, "-m", "fw_research.gpu_node.gpu_summary", str(args.out)], check=False)


if __name__ == "__main__":
    main()
