"""Why a translation model's hypotheses loop ("puis puis puis ..."): model error or search error, float32 or
float64, and what the decoder's fast-weight self-attention reads over the repeated tokens.

For each checkpoint (a compare_attention run, e.g. the sum and the delta configuration), in one process:

  generate   beam search as fw_research.experiments.attention_runs.translate (beam 4, --lenpen 0.6, max length 1.2 x
             source + 10) on a split (default test_long), in float32 and with the model cast to float64; the looping
             hypotheses (translation_lengths.repeats on the detokenised text) of each
  score      (a) the model's log-probability of the reference and of the looping hypothesis under teacher forcing,
             summed and as the beam's length-normalised score (sum / length^0.6): the model preferring its loop
             over the reference is a model error, the reverse a search error
  reads      (c, d) on the looping hypotheses, teacher-forced, each decoder self-attention layer's read recomputed in
             float64 from its projections (checked against the layer's own output): per step the write strength
             beta, the cosine of this step's key feature with the previous step's, of the query's with the key's,
             of the read with the previous step's read and with this step's value, the sum rule's normaliser
             z . phi(q), and the share of the read that the positions before the loop still carry; loop steps
             (inside the repeated stretch) against the steps before it

    python -m fw_research.demo.diagnose_loops --work-dir /tmp/loops/demo --runs dpfp2-sum-vconv3.s1.u600 \\
        dpfp2-delta-dec-l2-vconv3.s1.u600 [--subset test_long] [--limit N] [--json out.json]

Prints a summary per run and writes every number to --json.
"""
import argparse
import json
import statistics
import time
from argparse import Namespace
from pathlib import Path

import torch

from fw_research.demo.loop_reads import analyse_reads, mean_layers, teacher_forced
from fw_research.experiments import attention_runs, translation_lengths

REPO = Path(__file__).resolve().parents[3]

LENPEN, BEAM, MAX_LEN_A, MAX_LEN_B = attention_runs.LENPEN, 4, attention_runs.MAX_LEN_A, attention_runs.MAX_LEN_B


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


def beam_score(lprobs):
    return float(lprobs.sum()) / lprobs.numel() ** LENPEN


def float64_check(model64, task, args, ids, looping, hyps32, texts32, detok):
    """(b) the looping sentences and the first --float64-sample others generated again in float64."""
    chosen = sorted(set(looping) | set([i for i in ids if i not in looping][:args.float64_sample]))
    hyps64 = generate(model64, task, args.subset, chosen)
    text32 = {i: text for i, text in zip(ids, texts32)}
    texts64 = {i: detokenize(task, hyps64[i]["tokens"], detok) for i in chosen}
    loops64 = [i for i in chosen if translation_lengths.repeats(texts64[i].split())]
    return {"sentences": len(chosen), "identical_hypotheses": sum(texts64[i] == text32[i] for i in chosen),
            "looping_in_float32": len(looping), "looping_in_float64": len(loops64),
            "looping_in_both": len(set(loops64) & set(looping)),
            "max_abs_score_difference": max(abs(hyps64[i]["score"] - hyps32[i]["score"]) for i in chosen)}


def error_case(model64, task, i, sources, refs, hyps32, text, raw_src, raw_ref):
    """(a) model error or search error, in float64: the model's own scores of the float32 beam's looping hypothesis
    of sentence i and of its reference, and where the loop runs."""
    src, ref, hyp = sources[i], refs[i], hyps32[i]["tokens"]
    lp_ref, lp_hyp = teacher_forced(model64, src, ref), teacher_forced(model64, src, hyp)
    pieces = [task.target_dictionary[t] for t in hyp.tolist()]
    span = translation_lengths.loop_span(pieces)
    case = {"id": i, "source_words": len(raw_src[i].split()), "ref_tokens": ref.numel(),
            "hyp_tokens": hyp.numel(), "ref_logprob": float(lp_ref.sum()), "hyp_logprob": float(lp_hyp.sum()),
            "ref_beam_score": beam_score(lp_ref), "hyp_beam_score": beam_score(lp_hyp),
            "beam_reported_score": hyps32[i]["score"], "loop_span": span,
            "hypothesis": text, "reference": raw_ref[i]}
    if span:
        s, e = span
        case["loop_token_prob"] = float(lp_hyp[s:e].exp().mean())
        case["loop_length"] = e - s
        case["ends_at_max_length"] = hyp.numel() >= attention_runs.length_limit(src.numel())
        case["loop_start_of_ref_tokens"] = s / ref.numel()
    return case


def summarise(cases):
    """(a) over the looping cases: how often the reference beats the loop, mean scores and the loops' spans."""
    return {
        "looping": len(cases),
        "reference_beats_hypothesis_beam_score": sum(c["ref_beam_score"] > c["hyp_beam_score"] for c in cases),
        "reference_beats_hypothesis_logprob": sum(c["ref_logprob"] > c["hyp_logprob"] for c in cases),
        "mean_ref_logprob_per_token": statistics.fmean(c["ref_logprob"] / c["ref_tokens"] for c in cases),
        "mean_hyp_logprob_per_token": statistics.fmean(c["hyp_logprob"] / c["hyp_tokens"] for c in cases),
        "mean_ref_beam_score": statistics.fmean(c["ref_beam_score"] for c in cases),
        "mean_hyp_beam_score": statistics.fmean(c["hyp_beam_score"] for c in cases),
        "mean_loop_token_prob": statistics.fmean(c["loop_token_prob"] for c in cases if "loop_token_prob" in c),
        "mean_loop_length": statistics.fmean(c["loop_length"] for c in cases if "loop_length" in c),
        "loops_to_max_length": sum(c.get("ends_at_max_length", False) for c in cases),
        "mean_loop_start_over_ref_tokens": statistics.fmean(
            c["loop_start_of_ref_tokens"] for c in cases if "loop_start_of_ref_tokens" in c),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", type=Path, required=True, help="a compare_attention work dir (its preset's)")
    parser.add_argument("--runs", nargs="+", required=True, help="run names: checkpoints/NAME/checkpoint_last.pt")
    parser.add_argument("--subset", default="test_long")
    parser.add_argument("--limit", type=int, help="the first N sentences of the split only")
    parser.add_argument("--no-float64", action="store_true", help="skip generating in float64")
    parser.add_argument("--float64-sample", type=int, default=50,
                        help="sentences beside the looping ones generated again in float64")
    parser.add_argument("--reads", type=int, default=20, help="looping hypotheses whose reads are analysed")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from sacremoses import MosesDetokenizer
    detok = MosesDetokenizer(lang="de")
    report = {"subset": args.subset, "limit": args.limit, "runs": {}}
    for name in args.runs:
        start_time = time.time()
        model, task = load(args.work_dir / "checkpoints" / name / "checkpoint_last.pt", args.work_dir / "data-bin",
                           args.subset)
        dataset = task.dataset(args.subset)
        ids = list(range(len(dataset)))[:args.limit]
        sources = [dataset[i]["source"] for i in ids]
        refs = [dataset[i]["target"] for i in ids]
        raw_src = (args.work_dir / f"raw/{args.subset}.en").read_text().splitlines()
        raw_ref = (args.work_dir / f"raw/{args.subset}.de").read_text().splitlines()
        run = {}
        hyps32 = generate(model, task, args.subset, ids)
        texts32 = [detokenize(task, hyps32[i]["tokens"], detok) for i in ids]
        profile = translation_lengths.length_profile(texts32, [raw_ref[i] for i in ids], [raw_src[i] for i in ids])
        bleu = attention_runs.score(texts32, [raw_ref[i] for i in ids])
        run["float32"] = {"bleu": bleu["bleu"], "length_ratio": bleu["length_ratio"], "profile": profile}
        looping = [i for i, text in zip(ids, texts32) if translation_lengths.repeats(text.split())]
        run["looping_ids"] = looping
        model64 = model.double()  # in place: model is float64 from here on
        if not args.no_float64:
            run["float64"] = float64_check(model64, task, args, ids, looping, hyps32, texts32, detok)
        # (a) model error or search error, in float64 (the float32 beam's hypotheses)
        cases = [error_case(model64, task, i, sources, refs, hyps32, texts32[ids.index(i)], raw_src, raw_ref)
                 for i in looping]
        run["cases"] = cases
        if cases:
            run["summary"] = summarise(cases)
        # (c, d) the reads over the loops, in float64
        layers, control = [], []
        for case in [c for c in cases if c["loop_span"] and c["loop_span"][0] > 2][:args.reads]:
            s, e = case["loop_span"]
            layers.append(analyse_reads(model64, sources[case["id"]], hyps32[case["id"]]["tokens"], s, e))
            # the control: the reference teacher-forced, the same positions (where it is that long)
            ref = refs[case["id"]]
            if ref.numel() > s + 1:
                control.append(analyse_reads(model64, sources[case["id"]], ref, s, min(e, ref.numel())))
        if layers:
            run["reads"] = mean_layers(layers)
        if control:
            run["reads_on_reference"] = mean_layers(control)
        run["seconds"] = round(time.time() - start_time, 1)
        report["runs"][name] = run
        print(summary_text(name, run), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, ensure_ascii=False, indent=1))
    return report


def summary_text(name, run):
    f32 = run["float32"]
    lines = [f"{name}: BLEU {f32['bleu']:.2f}, length ratio {f32['length_ratio']:.3f}, "
             f"{len(run['looping_ids'])} looping of {f32['profile']['n']}, {f32['profile']['over_twice']} over 2x"]
    if "float64" in run:
        f64 = run["float64"]
        lines.append(f"  float64 ({f64['sentences']} sentences: the looping ones and others): "
                     f"{f64['identical_hypotheses']} identical hypotheses, looping {f64['looping_in_float32']} in "
                     f"float32, {f64['looping_in_float64']} in float64, {f64['looping_in_both']} in both; largest "
                     f"beam score difference {f64['max_abs_score_difference']:.2e}")
    if "summary" in run:
        s = run["summary"]
        lines.append(f"  looping cases: reference's beam score higher than the loop's in "
                     f"{s['reference_beats_hypothesis_beam_score']}/{s['looping']} (log-prob: "
                     f"{s['reference_beats_hypothesis_logprob']}); mean beam score ref {s['mean_ref_beam_score']:.3f}, "
                     f"loop {s['mean_hyp_beam_score']:.3f}; log-prob per token ref "
                     f"{s['mean_ref_logprob_per_token']:.3f}, loop {s['mean_hyp_logprob_per_token']:.3f}; "
                     f"p(repeated token) {s['mean_loop_token_prob']:.3f}; loop "
                     f"starts at {s['mean_loop_start_over_ref_tokens']:.2f} of the reference's length, repeats "
                     f"{s['mean_loop_length']:.1f} tokens on average, {s['loops_to_max_length']} run to the length "
                     "limit")
    for key, title in (("reads", "the looping hypothesis"), ("reads_on_reference", "the reference, same positions")):
        if key not in run:
            continue
        lines.append(f"  reads over {title}: before the loop -> the loop's positions")
        for index, layer in enumerate(run[key]["layers"]):
            parts = ", ".join(f"{m} {_fmt(v['before'])} -> {_fmt(v['loop'])}" for m, v in layer.items()
                              if m != "check_max_abs_diff")
            lines.append(f"  layer {index} ({run[key]['cases']} cases; check {layer['check_max_abs_diff']:.1e}): "
                         f"{parts}")
    return "\n".join(lines)


def _fmt(value):
    return "–" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
