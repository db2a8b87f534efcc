"""`fw_lm_stream`: language modelling on B unbroken text streams (Transformer-XL's ordered batches).

The split's tokens (lines joined with their end-of-line symbol) form one stream, cut into B =
`--batch-size` contiguous parallel streams; batch i holds segment i of every stream, L =
`--tokens-per-sample` tokens each, so row b of batch i+1 continues row b of batch i. Batches are
never shuffled. With `--fw-carry-state` the task keeps one `CarriedState` per split and hands it
to the model: each segment starts from the fast weights the previous one left (detached:
backpropagation stays within the segment), the paper's "without truncating context" (Table 4).
The state starts empty at segment 0 of every pass and whenever a segment is not the expected
next one (resuming mid-epoch); it is not stored in checkpoints.
"""
from dataclasses import dataclass, field

import numpy as np
import torch

from fairseq import utils
from fairseq.data import (AppendTokenDataset, FairseqDataset, IdDataset, ListDataset,
                          NestedDictionaryDataset, NumelDataset, PadDataset, PrependTokenDataset,
                          StripTokenDataset, data_utils, iterators)
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.tasks import register_task
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

from fw_fairseq.models.transformer_lm_fw import CarriedState
from fw_fairseq.modules.fast_weight_config import FastWeightConfig
from fw_fairseq.modules.fast_weight_flags import cli_error


class TokenStream(FairseqDataset):
    """All tokens of one split in order, [N]; `StreamSegments` cuts it into batches."""

    def __init__(self, name: str, lines):
        self.name = name
        # int32 halves the memory of int64 ids (WikiText-103's 103M tokens: ~0.4 GB).
        self.tokens = np.concatenate([lines[i].numpy().astype(np.int32)
                                      for i in range(len(lines))])

    def __len__(self):
        return len(self.tokens)


class StreamSegments(FairseqDataset):
    """Item i is batch i: rows are B parallel streams, columns the i-th segment of each."""

    def __init__(self, stream: TokenStream, bsz: int, seg_len: int):
        per_row = len(stream.tokens) // bsz
        if per_row < 2:
            raise ValueError(f"{stream.name}: {len(stream.tokens)} tokens cannot make {bsz} "
                             f"streams (lower --batch-size)")
        self.name, self.bsz, self.seg_len = stream.name, bsz, seg_len
        # The tail that does not fill a row is dropped (fewer than B tokens).
        self.rows = torch.from_numpy(stream.tokens[: bsz * per_row].astype(np.int64)).view(bsz, -1)
        # Inputs need a next token as target, so the last token of a row is only a target.
        self.num_segments = -(-(per_row - 1) // seg_len)

    def __len__(self):
        return self.num_segments

    def __getitem__(self, index):
        start = index * self.seg_len
        end = min(start + self.seg_len, self.rows.size(1) - 1)
        # [B, L] each; contiguous because criteria flatten targets with .view
        return (index, self.rows[:, start:end].contiguous(),
                self.rows[:, start + 1: end + 1].contiguous())

    def num_tokens(self, index):
        return self.bsz * self.seg_len

    def size(self, index):
        return self.seg_len

    def collater(self, items):
        (index, source, target), = items  # one segment of every stream per batch
        bsz, length = source.shape
        return {
            "id": torch.arange(bsz) + index * bsz,
            "nsentences": bsz,
            "ntokens": bsz * length,
            "net_input": {"src_tokens": source, "src_lengths": torch.full((bsz,), length)},
            "target": target,
            "stream": self.name,
            "segment": index,
        }


@dataclass
class StreamLanguageModelingConfig(LanguageModelingConfig):
    fw_carry_state: bool = field(default=False, metadata={
        "help": "carry every layer's fast-weight state from one segment of a stream to the "
                "next (truncated backprop); needs a model that accepts fw_state "
                "(transformer_lm_fw with --no-token-positional-embeddings)"})


class _AttachState:
    """eval-lm's batches with the carried state attached (fairseq-eval-lm skips valid_step)."""

    def __init__(self, iterator, attach):
        self.iterator, self.attach = iterator, attach
        self.n = getattr(iterator, "n", 0)

    def __len__(self):
        return len(self.iterator)

    def __iter__(self):
        for sample in self.iterator:
            self.attach(sample)
            yield sample


@register_task("fw_lm_stream", dataclass=StreamLanguageModelingConfig)
class StreamLanguageModelingTask(LanguageModelingTask):
    def __init__(self, args, dictionary, output_dictionary=None, targets=None):
        super().__init__(args, dictionary, output_dictionary, targets)
        self.carried = {}  # stream name -> [CarriedState, next expected segment]

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        paths = utils.split_paths(self.args.data)
        path = paths[(epoch - 1) % len(paths)]
        lines = data_utils.load_indexed_dataset(f"{path}/{split}", self.dictionary,
                                                self.args.dataset_impl, combine=combine)
        if lines is None:
            raise FileNotFoundError(f"Dataset not found: {split} ({path}/{split})")
        self.datasets[split] = TokenStream(split, lines)

    def build_model(self, args, from_checkpoint=False):
        """Refuses, as argument errors and before anything is built, what cannot carry a state."""
        if self.args.fw_carry_state:
            arch = getattr(args, "arch", None) or getattr(args, "_name", None)
            if not getattr(ARCH_MODEL_REGISTRY.get(arch), "carries_fw_state", False):
                raise cli_error(f"argument --fw-carry-state: --arch {arch} has no "
                                f"fast-weight state to carry; allowed: --arch transformer_lm_fw*")
            # fairseq-train builds from the arguments; evaluation from a checkpoint, where
            # FAVOR+'s features are fixed and a carried state stays in one feature space
            if not from_checkpoint and FastWeightConfig.from_args(args).redraws_features:
                raise cli_error("argument --fw-carry-state: FAVOR+ redraws its random features at "
                                "every training step, so a carried state would mix feature "
                                "spaces; allowed in training: --fw-favor-redraw never, or "
                                "another --fw-feature-map")
        return super().build_model(args, from_checkpoint)

    def get_batch_iterator(self, dataset, max_tokens=None, max_sentences=None, max_positions=None,
                           ignore_invalid_inputs=False, required_batch_size_multiple=1, seed=1,
                           num_shards=1, shard_id=0, num_workers=0, epoch=1, data_buffer_size=0,
                           disable_iterator_cache=False, skip_remainder_batch=False,
                           grouped_shuffling=False, update_epoch_batch_itr=False):
        if not isinstance(dataset, TokenStream):  # fairseq-interactive's prompts
            return super().get_batch_iterator(
                dataset, max_tokens, max_sentences, max_positions, ignore_invalid_inputs,
                required_batch_size_multiple, seed, num_shards, shard_id, num_workers, epoch,
                data_buffer_size, disable_iterator_cache, skip_remainder_batch,
                grouped_shuffling, update_epoch_batch_itr)
        if not max_sentences:
            raise ValueError("fw_lm_stream needs --batch-size (and --batch-size-valid): the "
                             "number of parallel streams")
        if num_shards > 1:
            raise ValueError("fw_lm_stream keeps streams in order on one worker; distributed "
                             "training would need the streams split across workers")
        segments = StreamSegments(dataset, max_sentences, self.args.tokens_per_sample)
        return iterators.EpochBatchIterator(
            dataset=segments, collate_fn=segments.collater,
            batch_sampler=[[i] for i in range(len(segments))], seed=seed,
            num_workers=num_workers, epoch=epoch, buffer_size=data_buffer_size,
            disable_shuffling=True)

    def attach_state(self, sample):
        """Put the stream's CarriedState into the model input (after fairseq moved the sample)."""
        if not self.args.fw_carry_state or not sample:
            return
        state, expected = self.carried.setdefault(sample["stream"], [CarriedState(), 0])
        if sample["segment"] != expected:
            state.reset()
        self.carried[sample["stream"]][1] = sample["segment"] + 1
        sample["net_input"]["fw_state"] = state

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        self.attach_state(sample)
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def valid_step(self, sample, model, criterion):
        self.attach_state(sample)
        return super().valid_step(sample, model, criterion)

    def eval_lm_dataloader(self, dataset, max_tokens=36000, batch_size=None, max_positions=None,
                           num_shards=1, shard_id=0, num_workers=1, data_buffer_size=10,
                           context_window=0):
        if context_window > 0:
            raise ValueError("fw_lm_stream: --context-window does not apply to streams; the "
                             "context is the carried state (--fw-carry-state)")
        iterator = self.get_batch_iterator(
            dataset, max_sentences=batch_size, num_shards=num_shards, shard_id=shard_id,
            num_workers=num_workers, data_buffer_size=data_buffer_size).next_epoch_itr(
            shuffle=False)
        return _AttachState(iterator, self.attach_state)

    def build_dataset_for_inference(self, src_tokens, src_lengths, **kwargs):
        """fairseq-interactive's prompts, as LanguageModelingTask builds them (eos + prompt as
        source, prompt + pad as target) but without TokenBlockDataset: its "eos" mode, an
        identity on one-line prompts, calls np.compat, which numpy 2 removed."""
        eos, pad = self.source_dictionary.eos(), self.source_dictionary.pad()
        prompts = StripTokenDataset(ListDataset(src_tokens, np.array(src_lengths)), eos)
        source = PrependTokenDataset(prompts, token=self.source_dictionary.bos()
                                     if getattr(self.args, "add_bos_token", False) else eos)
        return NestedDictionaryDataset({
            "id": IdDataset(),
            "net_input": {"src_tokens": PadDataset(source, pad_idx=pad, left_pad=False),
                          "src_lengths": NumelDataset(source, reduce=False)},
            "target": PadDataset(AppendTokenDataset(prompts, token=pad), pad_idx=pad,
                                 left_pad=False),
        }, sizes=[np.array(src_lengths)])
