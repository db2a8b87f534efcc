"""One decoding step of a FastWeightAttention layer (incremental_state, T = 1, CUDA) captured in a CUDA
graph and replayed: the replay must give what the eager step gives for new inputs, for every rule,
ELU+1 and DPFP, on the causal path (after a short and a long prefix: the lazy cache or the state) and
the cross path (the cached source memory). A step that synchronises with the host, allocates outside
the graph's pool or keeps a Python-side decision that depends on tensor values fails here.
Then, per rule, torch.compile(fullgraph=True) of a causal layer training on the kernels (forward and
backward through the custom ops of the rules' chunked.py and fw_fairseq/ops/kernels/cuda_ops.py, first call compiled: the dispatch
imports the extension while dynamo traces) must equal eager.
Run by research/fw_research/gpu_node/gpu_check.sh (step cuda_graph); exits 1 if any case fails.

    python -m fw_research.benchmarks.gpu_cuda_graph            # on a CUDA machine
    python -m fw_research.benchmarks.gpu_cuda_graph --dry-run  # the same cases on the CPU, re-running the step
                                                   # where the graph would replay (checks the harness)
"""
import argparse
import sys

import torch

from fw_fairseq.modules import FastWeightAttention, FastWeightConfig

EMBED, HEADS, BATCH, SOURCE = 256, 4, 8, 20  # d_key 64, as transformer_fw's layers
RULES = ("sum", "delta", "gated_delta")
FEATURE_MAPS = ("elu", "dpfp")
CASES = [(path, rule, phi, prefix) for rule in RULES for phi in FEATURE_MAPS
         for path, prefix in (("causal", 3), ("causal", 40), ("cross", 3))]  # prefix: steps before capture


def layer(path, rule, feature_map, device):
    torch.manual_seed(0)
    config = FastWeightConfig(feature_map=feature_map, update_rule=rule, dpfp_nu=2, favor_features=64,
                              places=frozenset())
    cross = path == "cross"
    attn = FastWeightAttention(EMBED, HEADS, config, causal=not cross, encoder_decoder_attention=cross)
    return attn.to(device).eval()


def copy_of(incremental_state):
    """A decoding state to step from, leaving `incremental_state` as it is: a generation step writes
    into its buffer's tensors (the lazy cache's storage, the state in place), so the copy clones them.
    Called inside the captured step, the clones are part of the graph: every replay starts afresh."""
    return {key: {name: x.clone() if torch.is_tensor(x) else x for name, x in buffer.items()}
            for key, buffer in incremental_state.items()}


def check(path, rule, feature_map, prefix, device, capture):
    attn = layer(path, rule, feature_map, device)
    g = torch.Generator(device=device).manual_seed(1)
    source = torch.randn(SOURCE, BATCH, EMBED, generator=g, device=device)  # [S, B, C]

    def step(x, incremental_state):  # x [1, B, C] -> [1, B, C]
        key = source if path == "cross" else x
        return attn(x, key, key, incremental_state=incremental_state, static_kv=path == "cross")[0]

    state = {}
    with torch.no_grad():
        for _ in range(prefix):
            step(torch.randn(1, BATCH, EMBED, generator=g, device=device), state)
        queries = [torch.randn(1, BATCH, EMBED, generator=g, device=device) for _ in range(3)]
        static_x = queries[0].clone()
        replay, static_out = capture(lambda: step(static_x, copy_of(state)))
        for x in queries:
            static_x.copy_(x)
            replay()
            torch.testing.assert_close(static_out, step(x, copy_of(state)), rtol=1e-5, atol=1e-5)


def compiled_training(rule, device):
    """A causal layer's output and input gradient, compiled (before any eager call) and eager."""
    attn = layer("causal", rule, "dpfp", device).train()
    x = torch.randn(70, BATCH, EMBED, generator=torch.Generator(device=device).manual_seed(1), device=device,
                    requires_grad=True)  # [T, B, C]: three chunks off the kernels

    def forward(x):
        return attn(x, x, x)[0]

    results = []
    for run in (torch.compile(forward, backend="aot_eager", fullgraph=True), forward):
        torch.manual_seed(2)
        out = run(x)
        results.append((out.detach(), *torch.autograd.grad(out.square().sum(), x)))
    torch.testing.assert_close(*results, rtol=1e-4, atol=1e-4)


def cuda_graph(run):
    """(replay, output) of `run` captured in a CUDA graph, after warming it up on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    return graph.replay, out


def rerun(run):
    """--dry-run's stand-in for cuda_graph: 'replaying' re-runs the step into the same output tensor."""
    out = run()
    return (lambda: out.copy_(run())), out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="run the cases on the CPU without CUDA graphs")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu_cuda_graph: torch sees no CUDA device on this machine (--dry-run runs the cases "
                         "on the CPU without graphs)")
    device, capture = ("cpu", rerun) if args.dry_run else ("cuda", cuda_graph)
    checks = [("CUDA graph: {} {} {} after {} steps".format(*case), lambda case=case: check(*case, device, capture))
              for case in CASES]
    checks += [(f"torch.compile: causal {rule} dpfp, training", lambda rule=rule: compiled_training(rule, device))
               for rule in RULES]
    failed = 0
    for name, run in checks:
        try:
            run()
            print(f"gpu_cuda_graph: ok      {name}", flush=True)
        except Exception as err:  # every case runs and is reported, whatever breaks one
            failed += 1
            print(f"gpu_cuda_graph: FAILED  {name}: {type(err).__name__}: {str(err).splitlines()[0]}", flush=True)
    print(f"gpu_cuda_graph: {len(checks) - failed} of {len(checks)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
