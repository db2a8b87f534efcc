"""Build small transformer_fw models through fairseq's real argument parser, without a data dir.

fairseq's build_model needs only the task's two dictionaries, so the tests hand it a tiny
namespace holding real fairseq Dictionaries.
"""
from types import SimpleNamespace

import torch
from fairseq import options
from fairseq.data import Dictionary

import fw_fairseq  # noqa: F401  (registers transformer_fw)
from fw_fairseq.models.transformer_fw import FastWeightTransformerModel

VOCAB = 24


def make_dictionary(size=VOCAB):
    d = Dictionary()
    for i in range(size):
        d.add_symbol(f"w{i}")
    return d


def parse_model_args(extra):
    parser = options.get_training_parser()
    argv = ["data-unused", "--task", "translation", "--arch", "transformer_fw_small",
            "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
            "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
            "--encoder-ffn-embed-dim", "48", "--decoder-ffn-embed-dim", "48",
            "--encoder-layers", "2", "--decoder-layers", "2",
            "--dropout", "0", "--attention-dropout", "0"] + list(extra)
    return options.parse_args_and_arch(parser, argv)


def build_model(extra=(), dtype=torch.float64, seed=0):
    """A 2+2 layer, 32-dim, 2-head (d_key 16) transformer_fw in eval mode."""
    torch.manual_seed(seed)
    args = parse_model_args(extra)
    dictionary = make_dictionary()
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    model = FastWeightTransformerModel.build_model(args, task)
    return model.to(dtype).eval(), dictionary


def random_tokens(dictionary, bsz, length, generator):
    """[B, T] tokens drawn from the real symbols (no pad/eos/unk)."""
    return torch.randint(dictionary.nspecial, len(dictionary), (bsz, length), generator=generator)
