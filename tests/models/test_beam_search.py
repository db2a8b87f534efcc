"""Beam search through fairseq's SequenceGenerator (what fairseq-generate runs): the model tells
its cross-attention the beam size, so the source memory is built once per sentence, and the
translations equal those of a per-hypothesis memory."""
import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from factories import build_model, random_tokens
from fw_fairseq.decoding import steps
from fw_fairseq.decoding.source_memory import write_positioned_source, write_source
from fw_fairseq.modules import cross_align

SENTENCES, BEAM = 3, 4


def fw_args(feature_map, rule):
    return ["--fw-feature-map", feature_map, "--fw-update-rule", rule, "--fw-decoder-rule", rule, "--fw-dpfp-nu", "2",
            "--fw-favor-features", "24"]


def sample(d):
    """Three left-padded sources of different lengths (fairseq pads sources on the left)."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([7, 5, 3])
    src = torch.full((SENTENCES, 7), d.pad())
    for i, n in enumerate(lengths.tolist()):
        src[i, 7 - n:] = random_tokens(d, 1, n, g)[0]
    return {"net_input": {"src_tokens": src, "src_lengths": lengths}}


def translate(generator, model, d):
    hypos = generator.generate([model], sample(d))
    return [[(h["tokens"].tolist(), h["score"].item()) for h in beams] for beams in hypos]


def assert_same_translations(got, expected):
    for beams, ref in zip(got, expected):
        assert [tokens for tokens, _ in beams] == [tokens for tokens, _ in ref]
        torch.testing.assert_close([s for _, s in beams], [s for _, s in ref], rtol=1e-9, atol=1e-9)


@pytest.fixture
def memory_batches(monkeypatch):
    """The batch size of every cached source written (one write per cross-attention layer), in
    either form (source_memory.py: the memory, or the keys and writes of a short source), read plainly
    or aligned (--fw-cross-align, the translation models' default)."""
    sizes = []

    def counting_write(rule, phi_k, v, *scalars):
        sizes.append(phi_k.shape[0])
        return write_source(rule, phi_k, v, *scalars)

    def counting_positioned_write(rule, phi_k, factors, weights, v, *scalars):
        sizes.append(phi_k.shape[0])
        return write_positioned_source(rule, phi_k, factors, weights, v, *scalars)

    monkeypatch.setattr(steps, "write_source", counting_write)
    monkeypatch.setattr(cross_align, "write_positioned_source", counting_positioned_write)
    return sizes


@pytest.mark.parametrize("align", ["0", "4"])
@pytest.mark.parametrize("feature_map,rule", [("dpfp", "sum"), ("favor", "delta"),
                                              ("dpfp", "gated_delta")])
def test_generator_builds_the_source_memory_once_per_sentence(feature_map, rule, align, memory_batches):
    model, d = build_model([*fw_args(feature_map, rule), "--fw-cross-align", align])
    generator = SequenceGenerator([model], d, beam_size=BEAM, max_len_b=12)
    shared = translate(generator, model, d)
    # 2 decoder layers: one memory each, per sentence and not per hypothesis
    assert memory_batches == [SENTENCES, SENTENCES]

    model.decoder.set_beam_size(1)  # every hypothesis writes its own copy of the source
    per_hypothesis = translate(generator, model, d)
    assert memory_batches[2:] == [SENTENCES * BEAM] * 2
    assert_same_translations(shared, per_hypothesis)


def test_a_later_generator_with_one_beam_is_not_misled(memory_batches):
    """fairseq tells the model the beam size only when it is above 1: a beam-1 generator after a
    beam-4 one (fairseq's hub interface does this) must not share memories across sentences."""
    model, d = build_model(fw_args("dpfp", "delta"))
    translate(SequenceGenerator([model], d, beam_size=BEAM, max_len_b=12), model, d)
    after_beam = translate(SequenceGenerator([model], d, beam_size=1, max_len_b=12), model, d)
    fresh, _ = build_model(fw_args("dpfp", "delta"))
    alone = translate(SequenceGenerator([fresh], d, beam_size=1, max_len_b=12), fresh, d)
    assert_same_translations(after_beam, alone)
