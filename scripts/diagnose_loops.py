"""Why a translation model's hypotheses loop ("puis puis puis ..."): model error or search error, float32 or
float64, and what the decoder's fast-weight self-attention reads over the repeated tokens.

For each checkpoint (a compare_attention run, e.g. the sum and the delta configuration), in one process:

  generate   beam search as scripts/attention_runs.translate (beam 4, --lenpen 0.6, max length 1.2 x source + 10)
             on a split (default test_long), in float32 and with the model cast to float64; the looping hypotheses
             (attention_runs.repeats on the detokenised text) of each
  score      (a) the model's log-probability of the reference and of the looping hypothesis under teacher forcing,
             summed and as the beam's length-normalised score (sum / length^0.6): the model preferring its loop
             over the reference is a model error, the reverse a search error
  reads      (c, d) on the looping hypotheses, teacher-forced, each decoder self-attention layer's read recomputed in
             float64 from its projections (checked against the layer's own output): per step the write strength
             beta, the cosine of this step's key feature with the previous step's, of the query's with the key's,
             of the read with the previous step's read and with this step's value, the sum rule's normaliser
             z . phi(q), and the share of the read that the positions before the loop still carry; loop steps
             (inside the repeated stretch) against the steps before it

    python scripts/diagnose_loops.py --work-dir /tmp/loops/demo --runs dpfp2-sum-vconv3.s1.u600 \\
        dpfp2-delta-dec-l2-vconv3.s1.u600 [--subset test_long] [--limit N] [--json out.json]

Prints a summary per run and writes every number to --json. `--patch NAME` runs the delta models with a
prototype change of the rule applied by monkeypatching (PATCHES), to measure a fix without changing fw_fairseq.
"""
import argparse
import json
import math
import statistics
import sys
import time
from argparse import Namespace
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import attention_runs  # noqa: E402

LENPEN, BEAM, MAX_LEN_A, MAX_LEN_B = attention_runs.LENPEN, 4, 1.2, 10


def load(checkpoint, data, subset):
    from fairseq import checkpoint_utils, utils
    utils.import_user_module(Namespace(user_dir=str(REPO / "fw_fairseq")))
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)],
                                                                    arg_overrides={"data": str(data)})
    task.load_dataset(subset)
    return models[0].eval(), task


def detokenize(task, tokens, detok):
    return detok.detokenize(task.target_dictionary.string(tokens, bpe_symbol="@@ ").split())


def generate(model, task, subset, ids, batch=25):
    """{sentence id: best hypothesis (fairseq's dict: tokens, score, positional_scores)} of beam search."""
    from fairseq.sequence_generator import SequenceGenerator
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=BEAM, max_len_a=MAX_LEN_A,
                                  max_len_b=MAX_LEN_B, len_penalty=LENPEN)
    dataset, out = task.dataset(subset), {}
    dtype = next(model.parameters()).dtype
    for start in range(0, len(ids), batch):
        sample = dataset.collater([dataset[i] for i in ids[start:start + batch]])
        with torch.no_grad():
            hypos = generator.generate([model], sample)
        for row, sentence in enumerate(sample["id"].tolist()):
            best = hypos[row][0]
            out[sentence] = {"tokens": best["tokens"], "score": float(best["score"]),
                             "positional_scores": best["positional_scores"].to(torch.float64)}
    assert dtype == next(model.parameters()).dtype
    return out


def teacher_forced(model, source, target):
    """Per-token log-probabilities [T] of `target` (ending in eos) given `source` (ending in eos)."""
    eos = model.decoder.dictionary.eos()
    prev = torch.cat([target.new_tensor([eos]), target[:-1]])
    with torch.no_grad():
        net = model(source[None], torch.tensor([source.numel()]), prev[None])
        lprobs = model.get_normalized_probs(net, log_probs=True)[0]
    return lprobs.gather(-1, target[:, None])[:, 0].to(torch.float64)


def beam_score(lprobs):
    return float(lprobs.sum()) / lprobs.numel() ** LENPEN


def loop_span(pieces):
    """(start, end) of the first stretch of `pieces` (BPE tokens) in which an n-gram (n <= 4) repeats 4 times in a
    row, from its second occurrence on (the steps that repeat), or None."""
    for n in range(1, attention_runs.LOOP_MAX_N + 1):
        run = 0
        for j in range(len(pieces) - n):
            run = run + 1 if pieces[j] == pieces[j + n] else 0
            if run >= (attention_runs.LOOP_TIMES - 1) * n:
                start = j - run + 1 + n  # the first repeating position
                end = start
                while end < len(pieces) and pieces[end] == pieces[end - n]:
                    end += 1
                return start, end
    return None


# ---------------------------------------------------------------- the decoder self-attention's reads


def capture_inputs(model):
    """Hooks that keep each decoder layer's self-attention input x [T, 1, C] and its read before out_proj."""
    store, handles = [], []
    for layer in model.decoder.layers:
        attn, entry = layer.self_attn, {}
        store.append(entry)
        handles.append(attn.register_forward_pre_hook(
            lambda module, args, kwargs, entry=entry: entry.__setitem__("x", kwargs.get("query", args[0] if args
                                                                                          else None)),
            with_kwargs=True))
        handles.append(attn.out_proj.register_forward_pre_hook(
            lambda module, args, entry=entry: entry.__setitem__("read", args[0])))
    return store, handles


def heads(attn, x):
    """[T, 1, C] -> [H, T, D] in float64."""
    length = x.size(0)
    return x.reshape(length, attn.num_heads, attn.head_dim).permute(1, 0, 2).to(torch.float64)


def recompute(attn, x):
    """The layer's read recomputed in float64 from its projections, with its parts: dict of [H, T(, ...)] tensors."""
    with torch.no_grad():
        q, k, v = (heads(attn, proj(x)) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        phi_q = attn.block.features(q[None], is_query=True)[0]
        phi_k = attn.block.features(k[None], is_query=False)[0]
        length = q.size(1)
        out = {"phi_q": phi_q, "phi_k": phi_k, "v": v}
        if "beta" in attn.rule.scalars:
            beta = torch.sigmoid(attn.beta_proj(x).to(torch.float64))[:, 0].T * attn.beta_max  # [H, T]
            out["beta"] = beta
            state = torch.zeros(q.size(0), phi_k.size(-1), v.size(-1), dtype=torch.float64)
            reads, retrieved = [], []
            for t in range(length):
                old = torch.einsum("he,hem->hm", phi_k[:, t], state)  # what the key reads before its write
                retrieved.append(old)
                state = state + beta[:, t, None, None] * phi_k[:, t, :, None] * (v[:, t] - old)[:, None, :]
                reads.append(torch.einsum("he,hem->hm", phi_q[:, t], state))
            out["read"] = torch.stack(reads, 1)
            out["retrieved"] = torch.stack(retrieved, 1)
            out["state_norm"] = None
        else:  # the sum rule: y_t = sum_s (phi_q_t . phi_k_s) v_s / sum_s phi_q_t . phi_k_s
            scores = torch.einsum("hte,hse->hts", phi_q, phi_k).tril()
            z = scores.sum(-1)
            out["z"] = z
            out["scores"] = scores
            out["read"] = torch.einsum("hts,hsm->htm", scores, v) / (z[..., None] + 1e-6)
        return out


def _cos(a, b):
    return F.cosine_similarity(a, b, dim=-1)


def read_stats(parts, start, end):
    """Means over heads of per-step measures, on the loop steps [start, end) and on the steps before the loop."""
    read, v, phi_q, phi_k = parts["read"], parts["v"], parts["phi_q"], parts["phi_k"]
    steps = {"loop": list(range(max(start, 1), end)), "before": list(range(1, start))}
    per_step = {
        "read_vs_previous_read": _cos(read[:, 1:], read[:, :-1]),  # index t-1 for step t
        "read_vs_own_value": _cos(read, v),
        "key_vs_previous_key": _cos(phi_k[:, 1:], phi_k[:, :-1]),
        "query_vs_key": _cos(phi_q, phi_k),
        "read_norm": read.norm(dim=-1),
    }
    if "beta" in parts:
        per_step["beta"] = parts["beta"]
        # how much of what the key held before this write stays after it: 1 - beta ||phi_k||^2
        per_step["kept_at_key"] = 1 - parts["beta"] * (phi_k * phi_k).sum(-1)
    else:
        per_step["normaliser"] = parts["z"]
        # the share of the read's weight on the positions before the loop
        scores = parts["scores"]
        before = scores[..., :start].sum(-1) / scores.sum(-1).clamp_min(1e-12)
        per_step["weight_before_loop"] = before
    stats = {}
    for name, values in per_step.items():
        shift = 1 if name in ("read_vs_previous_read", "key_vs_previous_key") else 0
        stats[name] = {kind: (float(values[:, [t - shift for t in ts]].mean()) if ts else None)
                       for kind, ts in steps.items()}
    return stats


def analyse_reads(model, source, target, start, end):
    """Per decoder layer: read_stats of the teacher-forced `target`, and the largest difference of the recomputed
    read from the layer's own (a check of the recomputation)."""
    store, handles = capture_inputs(model)
    try:
        teacher_forced(model, source, target)
    finally:
        for handle in handles:
            handle.remove()
    layers = []
    for layer, entry in zip(model.decoder.layers, store):
        attn = layer.self_attn
        parts = recompute(attn, entry["x"])
        own = heads(attn, entry["read"])
        stats = read_stats(parts, start, end)
        stats["check_max_abs_diff"] = float((own - parts["read"]).abs().max())
        layers.append(stats)
    return layers


# ---------------------------------------------------------------- prototype changes of the rule (monkeypatched)


def _patch_beta_scale(scale):
    """beta = scale * sigmoid(.) instead of sigmoid(.) at generation and in the reads: a write keeps (1 - beta) of
    what its key held, never replacing it whole (applied to a trained model: the parameters are unchanged)."""
    def apply(model):
        for layer in model.decoder.layers:
            if "beta" in layer.self_attn.rule.scalars:
                layer.self_attn.beta_max = scale
    return apply


PATCHES = {"beta-half": _patch_beta_scale(0.5), "beta-0.8": _patch_beta_scale(0.8)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", type=Path, required=True, help="a compare_attention work dir (its preset's)")
    parser.add_argument("--runs", nargs="+", required=True, help="run names: checkpoints/NAME/checkpoint_last.pt")
    parser.add_argument("--subset", default="test_long")
    parser.add_argument("--limit", type=int, help="the first N sentences of the split only")
    parser.add_argument("--no-float64", action="store_true", help="skip generating in float64")
    parser.add_argument("--reads", type=int, default=20, help="looping hypotheses whose reads are analysed")
    parser.add_argument("--patch", choices=list(PATCHES), help="apply a prototype change to the models first")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from sacremoses import MosesDetokenizer
    detok = MosesDetokenizer(lang="de")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    report = {"subset": args.subset, "limit": args.limit, "patch": args.patch, "runs": {}}
    for name in args.runs:
        start_time = time.time()
        model, task = load(args.work_dir / "checkpoints" / name / "checkpoint_last.pt", args.work_dir / "data-bin",
                           args.subset)
        if args.patch:
            PATCHES[args.patch](model)
        dataset = task.dataset(args.subset)
        ids = list(range(len(dataset)))[:args.limit]
        sources = [dataset[i]["source"] for i in ids]
        refs = [dataset[i]["target"] for i in ids]
        raw_src = (args.work_dir / f"raw/{args.subset}.en").read_text().splitlines()
        raw_ref = (args.work_dir / f"raw/{args.subset}.de").read_text().splitlines()
        run = {}
        hyps32 = generate(model, task, args.subset, ids)
        texts32 = [detokenize(task, hyps32[i]["tokens"], detok) for i in ids]
        profile = attention_runs.length_profile(texts32, [raw_ref[i] for i in ids], [raw_src[i] for i in ids])
        bleu = attention_runs.score(texts32, [raw_ref[i] for i in ids])
        run["float32"] = {"bleu": bleu["bleu"], "length_ratio": bleu["length_ratio"], "profile": profile}
        looping = [i for i, text in zip(ids, texts32) if attention_runs.repeats(text.split())]
        run["looping_ids"] = looping
        if not args.no_float64:
            model64 = model.double()
            hyps64 = generate(model64, task, args.subset, ids)
            texts64 = [detokenize(task, hyps64[i]["tokens"], detok) for i in ids]
            same = sum(a == b for a, b in zip(texts32, texts64))
            loops64 = [i for i, text in zip(ids, texts64) if attention_runs.repeats(text.split())]
            run["float64"] = {"identical_hypotheses": same, "of": len(ids), "looping": len(loops64),
                              "looping_in_both": len(set(loops64) & set(looping)),
                              "bleu": attention_runs.score(texts64, [raw_ref[i] for i in ids])["bleu"]}
        else:
            model64 = model.double()
        # (a) model error or search error, in float64 (the float32 beam's hypotheses)
        cases = []
        for i in looping:
            src, ref, hyp = sources[i], refs[i], hyps32[i]["tokens"]
            lp_ref, lp_hyp = teacher_forced(model64, src, ref), teacher_forced(model64, src, hyp)
            pieces = [task.target_dictionary[t] for t in hyp.tolist()]
            span = loop_span(pieces)
            case = {"id": i, "source_words": len(raw_src[i].split()), "ref_tokens": ref.numel(),
                    "hyp_tokens": hyp.numel(), "ref_logprob": float(lp_ref.sum()), "hyp_logprob": float(lp_hyp.sum()),
                    "ref_beam_score": beam_score(lp_ref), "hyp_beam_score": beam_score(lp_hyp),
                    "beam_reported_score": hyps32[i]["score"], "loop_span": span,
                    "hypothesis": texts32[ids.index(i)], "reference": raw_ref[i]}
            if span:
                s, e = span
                case["loop_token_prob"] = float(lp_hyp[s:e].exp().mean())
                case["loop_start_of_ref_tokens"] = s / ref.numel()
            cases.append(case)
        run["cases"] = cases
        if cases:
            run["summary"] = {
                "looping": len(cases),
                "reference_beats_hypothesis_beam_score": sum(c["ref_beam_score"] > c["hyp_beam_score"] for c in cases),
                "reference_beats_hypothesis_logprob": sum(c["ref_logprob"] > c["hyp_logprob"] for c in cases),
                "mean_ref_beam_score": statistics.fmean(c["ref_beam_score"] for c in cases),
                "mean_hyp_beam_score": statistics.fmean(c["hyp_beam_score"] for c in cases),
                "mean_loop_token_prob": statistics.fmean(c["loop_token_prob"] for c in cases if "loop_token_prob" in c),
                "mean_loop_start_over_ref_tokens": statistics.fmean(
                    c["loop_start_of_ref_tokens"] for c in cases if "loop_start_of_ref_tokens" in c),
            }
        # (c, d) the reads over the loops, in float64
        layers = []
        for case in [c for c in cases if c["loop_span"] and c["loop_span"][0] > 2][:args.reads]:
            s, e = case["loop_span"]
            layers.append(analyse_reads(model64, sources[case["id"]], hyps32[case["id"]]["tokens"], s, e))
        if layers:
            run["reads"] = _mean_layers(layers)
        run["seconds"] = round(time.time() - start_time, 1)
        report["runs"][name] = run
        print(summary_text(name, run), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, ensure_ascii=False, indent=1))
    return report


def _mean_layers(cases):
    """Per layer, per measure, per kind of step: the mean over the analysed cases."""
    out = []
    for layer in range(len(cases[0])):
        stats = {}
        for measure, value in cases[0][layer].items():
            if measure == "check_max_abs_diff":
                stats[measure] = max(c[layer][measure] for c in cases)
                continue
            stats[measure] = {kind: _nanmean([c[layer][measure][kind] for c in cases]) for kind in value}
        out.append(stats)
    return {"cases": len(cases), "layers": out}


def _nanmean(values):
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(values) if values else None


def summary_text(name, run):
    f32 = run["float32"]
    lines = [f"{name}: BLEU {f32['bleu']:.2f}, length ratio {f32['length_ratio']:.3f}, "
             f"{len(run['looping_ids'])} looping of {f32['profile']['n']}, {f32['profile']['over_twice']} over 2x"]
    if "float64" in run:
        f64 = run["float64"]
        lines.append(f"  float64: {f64['identical_hypotheses']}/{f64['of']} identical hypotheses, {f64['looping']} "
                     f"looping ({f64['looping_in_both']} in both), BLEU {f64['bleu']:.2f}")
    if "summary" in run:
        s = run["summary"]
        lines.append(f"  looping cases: reference's beam score higher than the loop's in "
                     f"{s['reference_beats_hypothesis_beam_score']}/{s['looping']} (log-prob: "
                     f"{s['reference_beats_hypothesis_logprob']}); mean beam score ref {s['mean_ref_beam_score']:.3f}, "
                     f"loop {s['mean_hyp_beam_score']:.3f}; p(next repeat) {s['mean_loop_token_prob']:.3f}; loop "
                     f"starts at {s['mean_loop_start_over_ref_tokens']:.2f} of the reference's length")
    if "reads" in run:
        for index, layer in enumerate(run["reads"]["layers"]):
            parts = ", ".join(f"{m} {_fmt(v['before'])} -> {_fmt(v['loop'])}" for m, v in layer.items()
                              if m != "check_max_abs_diff")
            lines.append(f"  layer {index} ({run['reads']['cases']} cases; check {layer['check_max_abs_diff']:.1e}): "
                         f"{parts}")
    return "\n".join(lines)


def _fmt(value):
    return "–" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
