"""Build small language models through fairseq's real argument parser, without a data dir.

fairseq's build_model needs only the task's dictionaries, so the tests hand it a tiny namespace
holding a real fairseq Dictionary.
"""
from types import SimpleNamespace

import torch
from fairseq import options
from fairseq.data import Dictionary

import fw_fairseq  # noqa: F401  (registers the models)
from fairseq.models import ARCH_MODEL_REGISTRY

VOCAB = 20


def make_dictionary(size=VOCAB):
    d = Dictionary()
    for i in range(size):
        d.add_symbol(f"w{i}")
    return d


def build_lm(arch, extra=(), dtype=torch.float64, seed=0):
    """A model of `arch` built by the language_modeling task's parser, in eval mode."""
    torch.manual_seed(seed)
    parser = options.get_training_parser()
    argv = ["data-unused", "--task", "language_modeling", "--arch", arch,
            "--dropout", "0", "--attention-dropout", "0", *extra]
    args = options.parse_args_and_arch(parser, argv)
    dictionary = make_dictionary()
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    return model.to(dtype).eval(), dictionary


def random_tokens(dictionary, bsz, length, generator):
    """[B, T] tokens drawn from the real symbols (no pad/eos/unk)."""
    return torch.randint(dictionary.nspecial, len(dictionary), (bsz, length), generator=generator)


def decode_step_by_step(model, tokens):
    """Logits [B, T, V] with one incremental decoder call per position."""
    state, steps = {}, []
    for t in range(tokens.size(1)):
        logits, _ = model.decoder(tokens[:, : t + 1], incremental_state=state)
        steps.append(logits)
    return torch.cat(steps, dim=1)
