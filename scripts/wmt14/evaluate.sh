#!/usr/bin/env bash
# Translate newstest2014 (or newstest2013) with a checkpoint and score it.
#
#   scripts/wmt14/evaluate.sh CHECKPOINT [--subset test|valid] [--name CONFIG] [--data DIR]
#                       [--out-dir DIR] [-- extra fairseq-generate args]
#
# Beam 4, length penalty 0.6, BPE removed; hypotheses are put back in corpus order,
# detokenised with sacremoses and scored with sacrebleu against the original reference;
# the compound-split tokenised BLEU of the literature is computed too (fw_research.wmt14.wmt_score).
# Writes OUT_DIR/<ckpt>.<subset>.{gen.txt,hyp.txt,json}; OUT_DIR defaults to
# $RESULTS_DIR/<config>, the config name defaulting to the checkpoint's directory name
# (what scripts/wmt14/train.sh uses). Environment: DATA_BIN, RESULTS_DIR (see common.sh).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
die() { echo "evaluate.sh: $*" >&2; exit 1; }
source "$REPO/configs/wmt14_en_de/common.sh"

[[ $# -ge 1 && $1 != -* ]] || die "usage: scripts/wmt14/evaluate.sh CHECKPOINT [--subset test|valid] [--name CONFIG] [--data DIR] [--out-dir DIR] [-- generate args]"
checkpoint=$(realpath -m "$1")
shift
subset=test
name=$(basename "$(dirname "$checkpoint")")
out_dir=
extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --subset) subset=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --data) DATA_BIN=$2; shift 2 ;;
    --out-dir) out_dir=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown option $1" ;;
  esac
done
[[ $subset == test || $subset == valid ]] || die "--subset must be test or valid, not $subset"
[[ -f $checkpoint ]] || die "no checkpoint $checkpoint"
[[ -f $DATA_BIN/wmt_prep.json ]] ||
  die "no prepared data in $DATA_BIN: run python -m fw_research.wmt14.prepare_wmt14_en_de (or pass --data DIR)"
out_dir=${out_dir:-$RESULTS_DIR/$name}
mkdir -p "$out_dir"
stem=$out_dir/$(basename "$checkpoint" .pt).$subset

[[ -x $REPO/.venv/bin/fairseq-generate ]] && PATH=$REPO/.venv/bin:$PATH
command -v fairseq-generate >/dev/null || die "fairseq-generate not found: run make setup"
remove_bpe=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["remove_bpe"])' \
  "$DATA_BIN/wmt_prep.json")
device_args=()
[[ $(python -c 'import torch; print(torch.cuda.is_available())') == True ]] && device_args=(--fp16)

# --user-dir even for a standard Transformer: the plugin is what lets torch >= 2.6 load
# fairseq checkpoints (README.md, "Checkpoints").
fairseq-generate "$DATA_BIN" --user-dir "$REPO/fw_fairseq" --path "$checkpoint" \
  --gen-subset "$subset" "${GENERATE_ARGS[@]}" --remove-bpe "$remove_bpe" \
  "${device_args[@]}" "${extra[@]}" >"$stem.gen.txt"

python -m fw_research.wmt14.wmt_score --gen "$stem.gen.txt" \
  --ref "$DATA_BIN/ref.$subset.de" --tok-ref "$DATA_BIN/tok.$subset.de" \
  --hyp-out "$stem.hyp.txt" --out "$stem.json" \
  --config "$name" --subset "$subset" --checkpoint "$checkpoint"
