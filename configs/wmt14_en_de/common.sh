# Shared recipe of every WMT14 En-De (paper Table 1) run, sourced by scripts/wmt14/train.sh and
# scripts/wmt14/evaluate.sh; each cell's file next to this one adds only its fast-weight flags.
# Recipe: fairseq's big-Transformer WMT14 setup (Ott et al. 2018) as the paper's Appendix E
# adapts it: 32K joint BPE, Adam, inverse-sqrt schedule, label smoothing 0.1, dropout 0.3,
# 3584 tokens per GPU x 3 GPUs x 16 accumulated batches, 45 epochs, best checkpoint by
# validation BLEU (no averaging, no per-model tuning).
# Paths can be overridden from the environment.
REPO=${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
DATA_BIN=${DATA_BIN:-$REPO/work/wmt14_en_de/data-bin/bpe32000}
SAVE_ROOT=${SAVE_ROOT:-$REPO/work/checkpoints/wmt14_en_de}
RESULTS_DIR=${RESULTS_DIR:-$REPO/work/results/wmt14_en_de}

# The paper's batch is 3 GPUs x 16 accumulated batches; train.sh divides these 48 batches
# among the GPUs it finds so that the effective batch stays the same.
PAPER_BATCHES_PER_UPDATE=48

# update_freq NGPU: the batches each of NGPU GPUs accumulates per update (48 / NGPU), or one line
# naming the GPU counts that keep 48 exactly and exit 1 (5 GPUs would give 50 batches an update).
update_freq() {
  local n=$1
  if ((n < 1 || PAPER_BATCHES_PER_UPDATE % n)); then
    echo "train.sh: $n GPUs cannot keep the paper's $PAPER_BATCHES_PER_UPDATE batches per update; allowed:" \
      "1, 2, 3, 4, 6, 8, 12, 16, 24 or 48 (set CUDA_VISIBLE_DEVICES)" >&2
    return 1
  fi
  echo $((PAPER_BATCHES_PER_UPDATE / n))
}

TRAIN_ARGS=(
  --task translation --source-lang en --target-lang de
  --arch transformer_fw_big --share-all-embeddings
  --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0
  --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-07
  --label-smoothing 0.1 --dropout 0.3 --weight-decay 0.0
  --max-tokens 3584 --max-epoch 45
  # validation BLEU (checkpoint selection) must see all of newstest2013: see GENERATE_ARGS
  --required-batch-size-multiple 1
  --eval-bleu --eval-bleu-args '{"beam": 4, "lenpen": 0.6}'
  --eval-bleu-detok moses --eval-bleu-detok-args '{"target_lang": "de"}'
  --best-checkpoint-metric bleu --maximize-best-checkpoint-metric
  # epoch checkpoints of the big model are ~2.5 GB with Adam state: keep enough to average
  --keep-last-epochs 10
  --log-format simple --log-interval 100
)

# The training loss, after TRAIN_ARGS (which hold its label smoothing); a config may set its own
# (dpfp_nu2_delta_align4 adds the unlikelihood term).
CRITERION_ARGS=(--criterion label_smoothed_cross_entropy)

# Decoding for every reported score (Vaswani et al. 2017; Ott et al. 2018).
# --required-batch-size-multiple 1: with fairseq's default of 8, batch_by_size silently drops
# a last batch whose size is not a multiple of 8, i.e. untranslated test sentences
# (facebookresearch/fairseq#5036); fw_research.wmt14.wmt_score refuses incomplete output.
GENERATE_ARGS=(--beam 4 --lenpen 0.6 --max-tokens 8000 --required-batch-size-multiple 1)
