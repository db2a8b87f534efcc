#!/usr/bin/env bash
# Train one WMT14 En-De model of the paper's Table 1.
#
#   scripts/wmt14/train.sh CONFIG [extra fairseq-train args]
#
# CONFIG is a file of configs/wmt14_en_de/ (by path, or by name such as dpfp_nu2). The shared
# recipe (configs/wmt14_en_de/common.sh) comes first, then its CRITERION_ARGS (or the config's), then the
# config's FW_ARGS, then the extra args, so the extra args win (tests shrink the model and the run this way).
# Checkpoints go to $SAVE_ROOT/<config name>/; running the same command again resumes from
# its checkpoint_last.pt (fairseq's default with an unchanged --save-dir).
# Environment: DATA_BIN, SAVE_ROOT (see common.sh).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
die() { echo "train.sh: $*" >&2; exit 1; }

[[ $# -ge 1 ]] || die "usage: scripts/wmt14/train.sh CONFIG [extra fairseq-train args]"
config=$1
shift
[[ -f $config ]] || config=$REPO/configs/wmt14_en_de/$config.sh
[[ -f $config ]] || die "no config file $config"
name=$(basename "$config" .sh)

source "$REPO/configs/wmt14_en_de/common.sh"
FW_ARGS=()
source "$config"

# Prefer the project's environment; fall back to whatever fairseq-train is on PATH.
[[ -x $REPO/.venv/bin/fairseq-train ]] && PATH=$REPO/.venv/bin:$PATH
command -v fairseq-train >/dev/null || die "fairseq-train not found: run make setup"
[[ -f $DATA_BIN/wmt_prep.json ]] ||
  die "no prepared data in $DATA_BIN: run python -m fw_research.wmt14.prepare_wmt14_en_de (or set DATA_BIN)"

# --eval-bleu must undo the subword split the data was made with (BPE or sentencepiece).
remove_bpe=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["remove_bpe"])' \
  "$DATA_BIN/wmt_prep.json")

# fairseq trains on every visible GPU; keep the paper's 48 batches per update whatever their
# number, and use fp16 (not --bf16, which also switches fairseq into TPU mode) on GPUs.
ngpu=$(python -c 'import torch; print(torch.cuda.device_count())')
if ((ngpu > 0)); then
  freq=$(update_freq "$ngpu") || exit 1
  device_args=(--fp16 --update-freq "$freq")
else
  device_args=(--update-freq "$PAPER_BATCHES_PER_UPDATE")
fi

save_dir=$SAVE_ROOT/$name
mkdir -p "$save_dir"
echo "train.sh: $name on $ngpu GPU(s), checkpoints in $save_dir" >&2
fairseq-train "$DATA_BIN" --user-dir "$REPO/fw_fairseq" \
  "${TRAIN_ARGS[@]}" "${CRITERION_ARGS[@]}" "${FW_ARGS[@]}" --eval-bleu-remove-bpe "$remove_bpe" \
  "${device_args[@]}" --save-dir "$save_dir" "$@" 2>&1 | tee -a "$save_dir/train.log"
