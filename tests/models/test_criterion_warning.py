"""A translation model with the aligned read says once, at its first training forward, when it trains with another
criterion than the one its defaults were measured with (fairseq reads the criterion from the command line only)."""
import logging
from types import SimpleNamespace

import pytest
import torch

from factories import make_dictionary, parse_model_args, random_tokens
from fw_fairseq.models.transformer_fw import FastWeightTransformerModel

LOGGER = "fw_fairseq.models.transformer_fw"


def _model(criterion, extra=()):
    args = parse_model_args(list(extra))
    args.criterion = criterion
    dictionary = make_dictionary()
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    return FastWeightTransformerModel.build_model(args, task), dictionary


def _forwards(model, dictionary, train, count=2):
    generator = torch.Generator().manual_seed(0)
    src = random_tokens(dictionary, 2, 5, generator)
    prev = random_tokens(dictionary, 2, 4, generator)
    model.train(train)
    for _ in range(count):
        model(src, torch.full((2,), 5), prev)


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


@pytest.mark.parametrize("criterion", ["cross_entropy", "label_smoothed_cross_entropy"])
def test_other_criterion_warns_once_naming_fw_unlikelihood(caplog, criterion):
    model, dictionary = _model(criterion)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _forwards(model, dictionary, train=True)
    lines = _warnings(caplog)
    assert len(lines) == 1 and "--criterion fw_unlikelihood" in lines[0] and criterion in lines[0]
    assert "\n" not in lines[0]


@pytest.mark.parametrize("criterion, extra", [("fw_unlikelihood", ()), ("cross_entropy", ("--fw-cross-align", "0")),
                                              ("cross_entropy", ("--fw-preset", "paper"))])
def test_no_warning_with_its_criterion_or_without_the_aligned_read(caplog, criterion, extra):
    model, dictionary = _model(criterion, extra)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _forwards(model, dictionary, train=True)
    assert _warnings(caplog) == []


def test_no_warning_outside_training(caplog):
    model, dictionary = _model("cross_entropy")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _forwards(model, dictionary, train=False)
    assert _warnings(caplog) == []
