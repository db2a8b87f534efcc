"""The bytes floor of a decoding step, for bench_decoding_cpu.py: what a generated token must move
through memory, from the checkpoint's shapes, and the machine's copy bandwidth to turn it into time.

Per decoding step of a batch (`sentences` x `beam` hypotheses), values moved, 4 bytes each (fp32):
- the decoder's parameters, read once per step for the whole batch;
- decoder self-attention, per hypothesis, layer and head, at step t:
    softmax: the key/value cache read, t 2d, and this step's pair written, 2d;
    fast weights, as the decoder runs it (fw_fairseq/decoding/decoder_state.py): the lazy cache
    t (C + M) read and one row C + M written while t (C + M) <= E M, else the state E M read and
    written (C: the width of a cached key, decoding/key_cache.py's width: E, or d for DPFP's raw keys);
- cross-attention, per layer and head: softmax reads each hypothesis's source keys/values,
  S 2d; fast weights read the cached source once per sentence (its beams share it): its keys'
  features and effective writes S (E + M) while that is below E M, else the memory E M
  (fw_fairseq/decoding/source_memory.py).
Softmax and the embedding/output layer share the parameter term. Not counted: the encoder (once
per sentence), beam search's own work, activations, and fairseq's reordering copies of the caches
(a copy per step of everything above that is per hypothesis) -- a floor, not an estimate.
The floor's time is bytes / the measured copy bandwidth; a result's fraction of its floor is
(floor time) / (measured time): 1 would be a decoder that only moves the bytes it must.
"""
import time

import torch

from fw_fairseq.decoding.key_cache import key_cache
from fw_fairseq.modules.fast_weight_config import FastWeightConfig
from fw_fairseq.ops import RULES, feature_map

FLOAT = 4  # bytes: every model runs in fp32 on the CPU


def copy_bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """Bytes per second of a large tensor copy (read + write), the best of `repeats`."""
    src = torch.ones(mib * 2 ** 18)  # mib MiB of float32
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * FLOAT / best


def shapes(checkpoint) -> dict:
    """The shapes the floor needs, from a fairseq checkpoint (its model config and parameters)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    cfg = state["cfg"]["model"]
    heads, dim = cfg.decoder_attention_heads, cfg.decoder_embed_dim
    d = dim // heads
    params = sum(x.numel() for name, x in state["model"].items() if name.startswith("decoder."))
    config = FastWeightConfig.from_args(cfg)  # a transformer_fw* checkpoint's args, the architecture's defaults filled
    phi = feature_map(config.feature_map, d, nu=config.dpfp_nu, m=config.favor_features)
    M = d + RULES[config.rule("decoder")].z_column  # the sum rule's z column
    fw_cross = config.uses("cross")
    # the aligned read of the source: 2P + 1 positional factors (modules/cross_align.py)
    rank = 2 * config.cross_align + 1 if fw_cross else 1
    return {"layers": cfg.decoder_layers, "heads": heads, "d": d, "params": params, "E": phi.out_dim, "R": rank,
            "C": key_cache(phi).width, "M": M, "fw_decoder": config.uses("decoder"), "fw_cross": fw_cross}


def self_attention_values(s: dict, t: int) -> int:
    """Values one head of one hypothesis moves in decoder self-attention at step t."""
    if not s["fw_decoder"]:
        return (t + 1) * 2 * s["d"]
    E, C, M = s["E"], s["C"], s["M"]
    return (t + 1) * (C + M) if t * (C + M) <= E * M else 2 * E * M


def cross_values(s: dict, source_length: int) -> int:
    """Values one head of one sentence reads from its cached source at a step (decoding/source_memory.py): the keys'
    features and writes of a short source, else the memory; the aligned read's short form one weight a position
    beside them (I = S + 1 weight columns at --fw-align-ratio 1), its memory R times wider."""
    E, M, R, S = s["E"], s["M"], s.get("R", 1), source_length
    if R == 1:
        return min(S * (E + M), E * M)
    return S * (E + 1 + M) if S * (E + S + 1 + M) < E * R * M else E * R * M


def bytes_per_token(s: dict, length: int, sentences: int, beam: int, source_length: int) -> float:
    """Mean bytes moved per generated token (one step of one sentence) over `length` steps."""
    per_layer_head = 0
    for t in range(1, length + 1):
        cross = (sentences * cross_values(s, source_length) if s["fw_cross"]
                 else sentences * beam * source_length * 2 * s["d"])
        per_layer_head += sentences * beam * self_attention_values(s, t) + cross
    attention = per_layer_head * s["layers"] * s["heads"] / length
    return (s["params"] + attention) * FLOAT / sentences


def markdown(meta: dict, rows: list, configs: list) -> str:
    """The results as a markdown table: one row per (beam, output length), one column group per
    configuration (tokens/s, ratio to softmax, fraction of its floor, peak RSS), and the ceiling: softmax's
    fastest tokens/s at the beam (at a short N, where its cache costs little) over its tokens/s at this N. A decoder
    whose attention cost what softmax's costs at that short N, the rest of the decoder being the same, runs at about
    the ceiling times softmax (about: a short N also shares each batch's encoder and set-up among fewer tokens), so
    no attention takes a fast-weight decoder much past it."""
    lines = [f"# fairseq-generate on CPU: fast-weight decoders vs softmax ({meta['arch']})", "",
             f"{meta['machine_note']} CPU x{meta['cpu_count']}, {meta['threads']} torch thread(s), "
             f"torch {meta['torch']}, "
             f"{meta['sentences']} sentences of {meta['source_length']} tokens, copy bandwidth "
             f"{meta['copy_bandwidth_gb_s']:.1f} GB/s"
             + (f", cells up to 128 tokens the fastest of {meta['repeats_up_to_128_tokens']} runs"
                if "repeats_up_to_128_tokens" in meta else "")
             + (f" of {meta['batches_up_to_128_tokens']} batches each" if "batches_up_to_128_tokens" in meta else "")
             + ". Each cell: tokens/s (x softmax), "
             f"fraction of its own bytes floor, MB moved per token by the floor, peak RSS MiB. Ceiling: softmax's "
             "fastest tokens/s at the beam over its tokens/s at N, about what a decoder whose attention cost what "
             "softmax's costs at a short N would reach.", "",
             "| beam | N | " + " | ".join(configs) + " | ceiling |",
             "|---:|---:|" + "---:|" * len(configs) + "---:|"]
    fastest = {}  # beam -> softmax's fastest tokens/s at it
    for row in rows:
        fastest[row["beam"]] = max(fastest.get(row["beam"], 0), row["softmax"]["tokens_per_s"])
    for row in rows:
        sm = row["softmax"]["tokens_per_s"]
        cells = []
        for name in configs:
            r = row[name]
            cells.append(f"{r['tokens_per_s']:.0f} ({r['tokens_per_s'] / sm:.2f}x), "
                         f"{r['fraction_of_floor']:.2f} of floor, {r['floor_mb_per_token']:.1f} MB, "
                         f"{r['peak_rss_mib']:.0f} MiB")
        lines.append(f"| {row['beam']} | {row['length']} | " + " | ".join(cells) + f" | {fastest[row['beam']] / sm:.2f}x |")
    return "\n".join(lines) + "\n"
