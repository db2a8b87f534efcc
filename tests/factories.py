"""Build small plugin models through fairseq's real argument parser, without a data dir: the one
test model factory of tests/models, tests/modules and tests/lm (pytest.ini puts tests/ on the
import path).

fairseq's build_model needs only the task's dictionaries, so the tests hand it a tiny namespace
holding real fairseq Dictionaries.
"""
from types import SimpleNamespace

import torch
from fairseq import options
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY

import fw_fairseq  # noqa: F401  (registers the models)

VOCAB = 24
# transformer_fw_small cut down: 2+2 layers, 32 dim, 2 heads (d_key 16), FFN 48
SMALL_TRANSLATION = ["--arch", "transformer_fw_small",
                     "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
                     "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
                     "--encoder-ffn-embed-dim", "48", "--decoder-ffn-embed-dim", "48",
                     "--encoder-layers", "2", "--decoder-layers", "2"]


def make_dictionary(size=VOCAB):
    d = Dictionary()
    for i in range(size):
        d.add_symbol(f"w{i}")
    return d


def parse_args(task, model_args):
    """fairseq-train's parser on `--task task` and the model flags, dropout off."""
    parser = options.get_training_parser()
    argv = ["data-unused", "--task", task, "--dropout", "0", "--attention-dropout", "0",
            *model_args]
    return options.parse_args_and_arch(parser, argv)


def _build(args, dtype):
    dictionary = make_dictionary()
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    model = ARCH_MODEL_REGISTRY[args.arch].build_model(args, task)
    return model.to(dtype).eval(), dictionary


def parse_model_args(extra):
    """The small translation model's arguments, with `extra` flags."""
    return parse_args("translation", SMALL_TRANSLATION + list(extra))


def build_model(extra=(), dtype=torch.float64, seed=0):
    """A 2+2 layer, 32-dim, 2-head (d_key 16) transformer_fw in eval mode, and its dictionary."""
    torch.manual_seed(seed)
    return _build(parse_model_args(extra), dtype)


def build_lm(arch, extra=(), dtype=torch.float64, seed=0):
    """A language model of `arch` built by the language_modeling task's parser, in eval mode."""
    torch.manual_seed(seed)
    return _build(parse_args("language_modeling", ["--arch", arch, *extra]), dtype)


def randomize_scalar_projections(attn, generator):
    """Draw a FastWeightAttention's beta / alpha projections in float64, far from their init, so that
    beta max and the gate show in what the layer computes. Returns attn."""
    with torch.no_grad():
        for name in attn.rule.scalars:
            proj = getattr(attn, f"{name}_proj")
            proj.weight.copy_(torch.randn(proj.weight.shape, generator=generator, dtype=torch.float64))
            proj.bias.copy_(torch.randn(proj.bias.shape, generator=generator, dtype=torch.float64))
    return attn


def random_tokens(dictionary, bsz, length, generator):
    """[B, T] tokens drawn from the real symbols (no pad/eos/unk)."""
    return torch.randint(dictionary.nspecial, len(dictionary), (bsz, length), generator=generator)


def decode_step_by_step(model, tokens, encoder_out=None, incremental_state=None):
    """Logits [B, T, V] with one incremental decoder call per position (reading `encoder_out`
    for a translation model), carrying `incremental_state` (a fresh one if None)."""
    state = {} if incremental_state is None else incremental_state
    steps = []
    for t in range(tokens.size(1)):
        kwargs = {} if encoder_out is None else {"encoder_out": encoder_out}
        logits, _ = model.decoder(tokens[:, : t + 1], incremental_state=state, **kwargs)
        steps.append(logits)
    return torch.cat(steps, dim=1)


def check_steps_through_reorders(model, src, src_lengths, prev, encoder_out, state, steps):
    """Beam search's reorders and decoding steps on `state` (decoded up to the first step's position): for each
    (t, new_order) of `steps`, the reorder (None: none) then the step at position t, whose logits must equal the
    forward over the whole reordered prefix."""
    order = torch.arange(src.size(0))
    for t, new_order in steps:
        if new_order is not None:
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
            order = order[new_order]
        logits, _ = model.decoder(prev[order, : t + 1], encoder_out=encoder_out, incremental_state=state)
        full, _ = model(src[order], src_lengths[order], prev[order, : t + 1])
        torch.testing.assert_close(logits[:, -1], full[:, -1], rtol=1e-9, atol=1e-9)


def check_decodes_as_it_trains(model, dictionary, seed=5):
    """fairseq's beam layout and reorders on a batch of 4 sources of 6 tokens: the first 4 steps equal the forward
    over their prefix, then every step after a reorder (or none) equals the forward over the whole prefix."""
    g = torch.Generator().manual_seed(seed)
    src, prev = random_tokens(dictionary, 4, 6, g), random_tokens(dictionary, 4, 8, g)
    src_lengths = torch.full((4,), 6)
    encoder_out, state = model.encoder(src, src_lengths=src_lengths), {}
    torch.testing.assert_close(decode_step_by_step(model, prev[:, :4], encoder_out, state),
                               model(src, src_lengths, prev[:, :4])[0], rtol=1e-9, atol=1e-9)
    check_steps_through_reorders(model, src, src_lengths, prev, encoder_out, state,
                                 [(4, torch.tensor([1, 0, 3, 3])), (5, None), (6, torch.tensor([2, 0, 1, 3])),
                                  (7, None)])


def block_pair(embed_dim, num_heads, with_option, without, prefix, **block_kwargs):
    """The same FastWeightAttention block (float64, eval) built with an option (FastWeightConfig
    `with_option`) and without it (`without`), sharing every weight but the option's own (state dict
    keys starting with `prefix`), the output projections the identity, so that each returns what goes into
    it: (with, without)."""
    from fw_fairseq.modules import FastWeightAttention

    blocks = []
    for config in (with_option, without):
        torch.manual_seed(0)
        blocks.append(FastWeightAttention(embed_dim, num_heads, config, **block_kwargs).double().eval())
    optioned, plain = blocks
    plain.load_state_dict({k: v for k, v in optioned.state_dict().items() if not k.startswith(prefix)})
    with torch.no_grad():
        for block in blocks:
            block.out_proj.weight.copy_(torch.eye(embed_dim, dtype=torch.float64))
            block.out_proj.bias.zero_()
    return optioned, plain
