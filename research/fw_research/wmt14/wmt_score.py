#!/usr/bin/env python3
"""Score fairseq-generate output on WMT14 En-De; write one JSON result.

Two numbers, since the literature reports both:
- sacreBLEU (Post 2018) on detokenised hypotheses against the untouched reference text,
  with its signature (the paper's Table 1 cites sacrebleu);
- "tokenised BLEU" on Moses-tokenised text with compound splitting, as fairseq's
  scripts/compound_split_bleu.sh and tensor2tensor's get_ende_bleu.sh compute it
  (the metric of Vaswani et al. 2017's 28.4 and Ott et al. 2018's 29.3; their data differs from ours:
  Ott et al. train on WMT16's preparation, so the numbers compare only roughly). fairseq-score --sacrebleu does not work
  with sacrebleu 2.x, so sacrebleu is called directly with tokenize="none".
"""
import argparse
import json
import re
import sys
from pathlib import Path

import sacrebleu
from sacremoses import MosesDetokenizer

# The compound_split_bleu.sh substitution, perl's s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g.
# On text tokenised with Moses -a it also rewrites "@-@" to "@ ##AT##-##AT## @"; that is
# what the published scripts do, so it is kept.
_COMPOUND = re.compile(r"(\S)-(\S)")


def compound_split(line):
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def read_hypotheses(gen_path):
    """H-lines of fairseq-generate output, in corpus order (generate emits them by length)."""
    hyps = {}
    with open(gen_path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("H-"):
                fields = line.rstrip("\n").split("\t")
                hyps[int(fields[0][2:])] = fields[2] if len(fields) > 2 else ""
    return [hyps[i] for i in sorted(hyps)], sorted(hyps)


def read_lines(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n") for line in f]


def score(hyps_tok, refs_detok, refs_tok, target_lang="de"):
    detok = MosesDetokenizer(target_lang)
    hyps_detok = [detok.detokenize(h.split()) for h in hyps_tok]
    bleu = sacrebleu.metrics.BLEU()
    sacre = bleu.corpus_score(hyps_detok, [refs_detok])
    # smooth none: like multi-bleu.perl / fairseq-score, a missing n-gram order gives 0
    tok_bleu = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
    tok = tok_bleu.corpus_score([compound_split(h) for h in hyps_tok], [[compound_split(r) for r in refs_tok]])
    return hyps_detok, {
        "sacrebleu": round(sacre.score, 2),
        "sacrebleu_signature": str(bleu.get_signature()),
        "sacrebleu_text": str(sacre),
        "tok_bleu": round(tok.score, 2),
        "tok_bleu_text": str(tok),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gen", required=True, help="fairseq-generate stdout (run with --remove-bpe)")
    p.add_argument("--ref", required=True, help="detokenised reference (sacrebleu)")
    p.add_argument("--tok-ref", required=True, help="Moses-tokenised reference (tokenised BLEU)")
    p.add_argument("--hyp-out", required=True, help="where to write the detokenised hypotheses")
    p.add_argument("--out", required=True, help="result JSON")
    p.add_argument("--config", required=True)
    p.add_argument("--subset", required=True)
    p.add_argument("--checkpoint", required=True)
    args = p.parse_args(argv)

    hyps, ids = read_hypotheses(args.gen)
    refs, refs_tok = read_lines(args.ref), read_lines(args.tok_ref)
    if ids != list(range(len(refs))) or len(refs_tok) != len(refs):
        sys.exit(f"wmt_score: {len(hyps)} hypotheses (ids {ids[:1]}..{ids[-1:]}) for {len(refs)} references "
                 f"and {len(refs_tok)} tokenised references: generation incomplete or wrong subset?")
    hyps_detok, result = score(hyps, refs, refs_tok)
    Path(args.hyp_out).write_text("".join(h + "\n" for h in hyps_detok), encoding="utf-8")
    result = {"config": args.config, "subset": args.subset, "checkpoint": str(Path(args.checkpoint).resolve()),
              "sentences": len(refs), **result}
    Path(args.out).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{args.config} {args.subset}: sacreBLEU {result['sacrebleu']} ({result['sacrebleu_signature']}), "
          f"tokenised BLEU {result['tok_bleu']}")


if __name__ == "__main__":
    main()
