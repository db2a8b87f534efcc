"""Offline demo: English -> German translation with fast weight Transformers, on 2 CPU cores.

The corpus is real parallel text that every Debian machine carries: the German message catalogs
under /usr/share/locale/de/LC_MESSAGES (English msgid -> German msgstr, read with gettext).
The demo runs the same pipeline as the WMT14 scripts, end to end:

  1. corpus   pairs from the .mo files, deduplicated, split into train / valid / test
  2. subwords sacremoses tokenisation (format placeholders such as %s kept whole) + joint BPE
              (subword-nmt), fairseq-preprocess
  3. train    fairseq-train --user-dir fw_fairseq, the same fixed number of updates per model:
              softmax (standard Transformer); DPFP-2 with the paper's sum rule in every block;
              the translation models' defaults: DPFP-2, the delta rule in the decoder, the aligned
              cross-attention, trained with unlikelihood (--criterion fw_unlikelihood); both
              fast-weight models with the encoder's convolution (the default)
  4. score    fairseq-generate (beam 4), detokenise, sacrebleu on the held-out test split

A fixed number of updates, not a time budget: a slow or busy machine takes longer and prints the
same BLEU. Finished steps are skipped when re-run (delete --work-dir to start over).
The models are the attention comparison's rows of the same names (fw_research.experiments.attention_configs,
its `demo` preset).

    python -m fw_research.demo.demo [--updates 600] [--work-dir demo_work]
"""
import argparse
import time
from pathlib import Path

import torch

from fw_research.demo import compare_report
from fw_research.experiments import attention_runs, catalog_corpus
from fw_research.experiments.attention_configs import CONFIGS, PRESETS, config_flags, model_flags

REPO = Path(__file__).resolve().parents[3]
# softmax, the paper's sum rule, and the translation models' defaults with their criterion
MODELS = ("softmax", "dpfp2-sum-vconv3", "dpfp2-delta-dec-align4-ul2-vconv3")
STEPS = 4


def say(step, text):
    print(f"[{step}/{STEPS}] {text}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=600, help="training updates of every model")
    parser.add_argument("--work-dir", type=Path, default=REPO / "demo_work")
    parser.add_argument("--test-size", type=int, default=500)
    args = parser.parse_args()
    if args.updates < 10:
        parser.error(f"argument --updates: {args.updates} is too few; allowed: an integer >= 10")
    work, start = args.work_dir, time.time()
    merges = PRESETS["demo"][0]
    say(1, catalog_corpus.prepare(work, args.test_size, merges, what="demo"))
    say(2, f"subwords: sacremoses + {merges} joint BPE merges, fairseq-preprocess done")

    references = (work / "raw/test.de").read_text().splitlines()
    sources = (work / "raw/test.en").read_text().splitlines()
    records = {}
    for name in MODELS:
        say(3, f"training {name}, {args.updates} updates (log: {work / f'train.{name}.u{args.updates}.log'})")
        records[name] = attention_runs.train_and_score(
            work, f"{name}.u{args.updates}", model_flags("demo", name, seed=1),
            args.updates, max(1, args.updates // 10), label=name)
        say(4, f"{name}: test BLEU {records[name]['bleu']:.2f}")

    results = {"preset": "demo", "updates": args.updates, "seeds": [1], "jobs": 1, "cpu_count": torch.get_num_threads(),
               "torch": torch.__version__,
               "configs": {name: {"kind": CONFIGS[name][0],
                                  "flags": config_flags("demo", name)} for name in MODELS},
               "runs": [{"config": name, "seed": 1, **records[name]} for name in MODELS]}
    stem = work / f"demo_u{args.updates}"
    print(f"\nEnglish -> German, {len(references)} held-out catalog messages, beam 4, sacrebleu")
    print(compare_report.write(stem, results))
    print("Examples (source / reference / " + " / ".join(MODELS) + "):")
    for i in range(5):
        print(f"  EN  {sources[i]}\n  REF {references[i]}")
        for name in MODELS:
            print(f"  {name:18s} {records[name]['hypotheses'][i]}")
        print()
    print(f"learning curves: {stem}.png")
    print(f"total time {(time.time() - start) / 60:.1f} min; outputs in {work}")


if __name__ == "__main__":
    main()
