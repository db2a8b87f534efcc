"""fairseq checkpoints load under torch >= 2.6 (weights_only=True) once the plugin is imported,
and carry the record of the attention settings they were trained with."""
import argparse
import logging

import numpy as np
import pytest
import torch
from fairseq import checkpoint_utils

import fw_fairseq  # noqa: F401
from fw_fairseq.models.checkpoints import RECORD, decode, encode


def recorded_before(model, flag):
    """The model's state dict as a checkpoint written before `flag` existed saved it: a record without it."""
    state = model.state_dict()
    settings = decode(state[RECORD])
    del settings[flag]
    state[RECORD] = encode(settings)
    return state


def test_fairseq_loader_reads_namespace_and_numpy_metrics(tmp_path):
    path = tmp_path / "checkpoint_last.pt"
    # what fairseq-train writes with --eval-bleu: args as a Namespace, BLEU counts as numpy
    torch.save({"args": None, "cfg": {"model": argparse.Namespace(arch="transformer_fw")},
                "model": {"w": torch.ones(2)},
                "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                                       "optimizer_name": "Adam", "lr_scheduler_state": {},
                                       "num_updates": 3}],
                "extra_state": {"metrics": {"valid": [("_bleu_counts", np.array([3, 2, 1, 0])),
                                                      ("_bleu_sys_len", np.int64(7)),
                                                      ("loss", np.float64(1.5))]}}}, path)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert state["cfg"]["model"].arch == "transformer_fw"
    metrics = dict(state["extra_state"]["metrics"]["valid"])
    assert metrics["_bleu_counts"].tolist() == [3, 2, 1, 0] and metrics["loss"] == 1.5


def test_state_dict_records_what_the_attention_computes():
    from factories import build_model

    model, _ = build_model(["--fw-feature-map", "favor", "--fw-update-rule", "delta",
                            "--fw-favor-features", "8", "--fw-dpfp-nu", "3"])
    assert decode(model.state_dict()[RECORD]) == {
        "--fw-attention": "encoder,decoder,cross", "--fw-feature-map": "favor",
        "--fw-update-rule": "delta", "--fw-favor-features": "8",  # nu does not apply to favor
        "--fw-favor-redraw": "never",  # never: the translation models' default
        "--fw-delta-beta-max": "0.25", "--fw-delta-norm": "l2",  # the translation models' defaults with FAVOR+
        "--fw-output-gate": "none", "--fw-encoder-conv": "3",  # 3: the translation models' default
        "--fw-decoder-conv": "3", "--fw-cross-align": "4",  # the translation models' defaults with FAVOR+
        "--fw-decoder-positions": "absolute", "--fw-align-ratio": "1",
        "--fw-align-free-heads": "0"}
    summed, _ = build_model(["--fw-feature-map", "elu", "--fw-update-rule", "sum", "--fw-decoder-rule", "sum",
                             "--fw-delta-beta-max", "2"])
    # the sum rule has no beta: its record leaves the flag out
    assert decode(summed.state_dict()[RECORD]) == {
        "--fw-attention": "encoder,decoder,cross", "--fw-feature-map": "elu",
        "--fw-update-rule": "sum", "--fw-output-gate": "none", "--fw-encoder-conv": "3", "--fw-decoder-conv": "0",
        "--fw-cross-align": "4", "--fw-decoder-positions": "absolute", "--fw-align-ratio": "1",
        "--fw-align-free-heads": "0"}
    # softmax: no map or rule; the prior, which softmax cross-attention takes too (off: the preset's for softmax)
    softmax, _ = build_model(["--fw-attention", "none", "--fw-feature-map", "elu"])
    assert decode(softmax.state_dict()[RECORD]) == {"--fw-attention": "none", "--fw-cross-align": "0",
                                                    "--fw-align-ratio": "1", "--fw-align-free-heads": "0"}


def test_record_names_each_blocks_rule_whichever_way_it_was_spelled():
    from factories import build_model

    mixed = {"--fw-attention": "encoder,decoder,cross", "--fw-feature-map": "dpfp",
             "--fw-encoder-rule": "sum", "--fw-decoder-rule": "delta", "--fw-cross-rule": "sum",
             "--fw-dpfp-nu": "1", "--fw-delta-beta-max": "1", "--fw-delta-norm": "l2",
             "--fw-output-gate": "none", "--fw-encoder-conv": "3", "--fw-decoder-conv": "0", "--fw-cross-align": "4",
             "--fw-decoder-positions": "absolute", "--fw-align-ratio": "1",
             "--fw-align-free-heads": "0"}
    for flags in (["--fw-update-rule", "sum", "--fw-decoder-rule", "delta"],
                  ["--fw-update-rule", "delta", "--fw-encoder-rule", "sum", "--fw-cross-rule", "sum"]):
        model, _ = build_model(["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "1", "--fw-delta-norm", "l2",
                                *flags])
        assert decode(model.state_dict()[RECORD]) == mixed
        layer = model.decoder.layers[0]
        assert (layer.self_attn.update_rule, layer.encoder_attn.update_rule) == ("delta", "sum")
        assert model.encoder.layers[0].self_attn.update_rule == "sum"
    # a per-block flag equal to the others is the uniform rule; a block that is softmax has no rule
    same, _ = build_model(["--fw-update-rule", "delta", "--fw-decoder-rule", "delta",
                           "--fw-attention", "decoder", "--fw-encoder-rule", "sum"])
    record = decode(same.state_dict()[RECORD])
    assert record["--fw-update-rule"] == "delta" and "--fw-encoder-rule" not in record


def test_checkpoint_from_before_the_record_loads_with_one_warning(caplog):
    from factories import build_model

    old, _ = build_model(["--fw-feature-map", "elu"], seed=1)
    state = old.state_dict()
    del state[RECORD]
    model, _ = build_model(["--fw-feature-map", "elu"], seed=2)
    with caplog.at_level(logging.WARNING):
        model.load_state_dict(state)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "the checkpoint predates the record of its --fw-* settings; they cannot be checked: "
        "load it with the flags it was trained with"]
    assert torch.equal(model.encoder.layers[0].self_attn.q_proj.weight,
                       old.encoder.layers[0].self_attn.q_proj.weight)



@pytest.mark.parametrize("rule", ["delta", "gated_delta"])
def test_a_state_dict_of_another_beta_max_is_refused(rule):
    from factories import build_model

    fw = ["--fw-feature-map", "elu", "--fw-update-rule", rule, "--fw-decoder-rule", rule]
    trained, _ = build_model(fw + ["--fw-delta-beta-max", "2"])
    model, _ = build_model(fw)
    with pytest.raises(SystemExit, match=r"error: the checkpoint was trained with "
                                         r"--fw-delta-beta-max 2, not 1 \(its weights"):
        model.load_state_dict(trained.state_dict())


def test_a_fractional_beta_max_is_recorded_and_an_integral_one_stays_an_integer():
    """--fw-delta-beta-max 0.1 is kept and refused against 1; "2.0" is recorded as 2, as older checkpoints have it."""
    from factories import build_model

    fw = ["--fw-feature-map", "elu", "--fw-update-rule", "delta"]
    tenth, _ = build_model(fw + ["--fw-delta-beta-max", "0.1"])
    with pytest.raises(SystemExit, match=r"--fw-delta-beta-max 0.1, not 1 \(its weights"):
        build_model(fw)[0].load_state_dict(tenth.state_dict())
    two, _ = build_model(fw + ["--fw-delta-beta-max", "2"])
    build_model(fw + ["--fw-delta-beta-max", "2.0"], seed=1)[0].load_state_dict(two.state_dict())


def test_a_delta_record_from_before_beta_max_means_beta_max_1():
    """Records written before --fw-delta-beta-max existed lack it: they were trained with 1."""
    from factories import build_model

    fw = ["--fw-feature-map", "elu", "--fw-update-rule", "delta"]
    state = recorded_before(build_model(fw)[0], "--fw-delta-beta-max")
    build_model(fw, seed=1)[0].load_state_dict(state)  # beta max 1: the same attention
    two, _ = build_model(fw + ["--fw-delta-beta-max", "2"])
    with pytest.raises(SystemExit, match=r"--fw-delta-beta-max 1, not 2"):
        two.load_state_dict(state)


def test_another_norm_or_block_rule_is_refused_and_old_delta_records_mean_sum_norm():
    from factories import build_model

    fw = ["--fw-feature-map", "elu", "--fw-update-rule", "delta"]
    trained, _ = build_model(fw + ["--fw-delta-norm", "l2"])
    with pytest.raises(SystemExit, match=r"--fw-delta-norm l2, not sum"):
        build_model(fw + ["--fw-delta-norm", "sum"])[0].load_state_dict(trained.state_dict())
    with pytest.raises(SystemExit, match=r"trained with --fw-encoder-rule delta, not sum"):
        build_model(fw + ["--fw-delta-norm", "l2", "--fw-encoder-rule", "sum"])[0].load_state_dict(
            trained.state_dict())
    fw_sum = fw + ["--fw-delta-norm", "sum"]
    state = recorded_before(build_model(fw_sum)[0], "--fw-delta-norm")
    build_model(fw_sum, seed=1)[0].load_state_dict(state)  # sum normalisation: the same attention


def test_args_saved_before_delta_norm_existed_build_the_sum_normalised_model():
    """fairseq-generate builds a model from the args in its checkpoint: args from before the flag
    have no fw_delta_norm at all and get sum, where a fresh command line gets the default l2."""
    from factories import parse_model_args

    from fw_fairseq.models.transformer_fw import transformer_fw

    fresh = parse_model_args(["--fw-update-rule", "delta"])
    assert fresh.fw_delta_norm == "l2"
    saved = argparse.Namespace(**{k: v for k, v in vars(fresh).items() if k != "fw_delta_norm"})
    transformer_fw(saved)
    assert saved.fw_delta_norm == "sum"


def test_another_output_gate_is_refused_and_records_from_before_it_mean_none():
    from factories import build_model

    fw = ["--fw-feature-map", "elu", "--fw-update-rule", "sum", "--fw-decoder-rule", "sum"]
    gated, _ = build_model(fw + ["--fw-output-gate", "channel"])
    assert decode(gated.state_dict()[RECORD])["--fw-output-gate"] == "channel"
    with pytest.raises(SystemExit, match=r"trained with --fw-output-gate channel, not none"):
        build_model(fw)[0].load_state_dict(gated.state_dict())
    state = recorded_before(build_model(fw)[0], "--fw-output-gate")
    build_model(fw, seed=1)[0].load_state_dict(state)  # no gate: the same attention
    with pytest.raises(SystemExit, match=r"--fw-output-gate none, not channel"):
        build_model(fw + ["--fw-output-gate", "channel"])[0].load_state_dict(state)


def test_another_encoder_conv_is_refused_and_records_from_before_it_mean_none():
    from factories import build_model

    fw = ["--fw-feature-map", "elu", "--fw-update-rule", "sum", "--fw-decoder-rule", "sum"]
    plain, _ = build_model(fw + ["--fw-encoder-conv", "0"])
    with pytest.raises(SystemExit, match=r"trained with --fw-encoder-conv 0, not 3"):
        build_model(fw)[0].load_state_dict(plain.state_dict())
    state = recorded_before(plain, "--fw-encoder-conv")
    build_model(fw + ["--fw-encoder-conv", "0"], seed=1)[0].load_state_dict(state)  # the same attention
    with pytest.raises(SystemExit, match=r"--fw-encoder-conv 0, not 5"):
        build_model(fw + ["--fw-encoder-conv", "5"])[0].load_state_dict(state)
    # no fast-weight encoder: nothing to record
    softmax_encoder, _ = build_model(fw + ["--fw-attention", "decoder,cross"])
    assert "--fw-encoder-conv" not in decode(softmax_encoder.state_dict()[RECORD])


def test_another_decoder_conv_is_refused_and_records_from_before_it_mean_none():
    from factories import build_model

    fw = ["--fw-feature-map", "elu", "--fw-update-rule", "sum", "--fw-decoder-rule", "sum"]
    convolved, _ = build_model(fw + ["--fw-decoder-conv", "3"])
    with pytest.raises(SystemExit, match=r"trained with --fw-decoder-conv 3, not 0"):
        build_model(fw)[0].load_state_dict(convolved.state_dict())
    state = recorded_before(build_model(fw)[0], "--fw-decoder-conv")
    build_model(fw, seed=1)[0].load_state_dict(state)  # from before the flag: no convolution
    with pytest.raises(SystemExit, match=r"--fw-decoder-conv 0, not 2"):
        build_model(fw + ["--fw-decoder-conv", "2"])[0].load_state_dict(state)
    softmax_decoder, _ = build_model(fw + ["--fw-attention", "encoder,cross"])
    assert "--fw-decoder-conv" not in decode(softmax_decoder.state_dict()[RECORD])


def test_another_cross_align_is_refused_and_records_from_before_it_mean_none():
    from factories import build_model

    fw = ["--fw-feature-map", "elu", "--fw-update-rule", "sum", "--fw-decoder-rule", "sum", "--fw-cross-align", "0"]
    plain, _ = build_model(fw)
    with pytest.raises(SystemExit, match=r"trained with --fw-cross-align 0, not 2"):
        build_model(fw + ["--fw-cross-align", "2"])[0].load_state_dict(plain.state_dict())
    build_model(fw, seed=1)[0].load_state_dict(recorded_before(plain, "--fw-cross-align"))  # the same attention
    with pytest.raises(SystemExit, match=r"trained with --fw-cross-align 0, not 4"):  # not the default's
        build_model(fw[:-2], seed=1)[0].load_state_dict(recorded_before(plain, "--fw-cross-align"))
    # softmax cross-attention takes the prior too: recorded, and a plain one's record from before it means none
    hybrid = fw[:-1] + ["2", "--fw-attention", "encoder,decoder"]
    assert decode(build_model(hybrid)[0].state_dict()[RECORD])["--fw-cross-align"] == "2"
    plain_hybrid, _ = build_model(fw + ["--fw-attention", "encoder,decoder"])
    with pytest.raises(SystemExit, match=r"trained with --fw-cross-align 0, not 2"):
        build_model(hybrid, seed=1)[0].load_state_dict(recorded_before(plain_hybrid, "--fw-cross-align"))


def test_another_favor_redraw_is_refused_and_records_from_before_it_are_not_checked(caplog):
    from factories import build_model

    fw = ["--fw-feature-map", "favor", "--fw-favor-features", "8", "--fw-update-rule", "sum", "--fw-decoder-rule",
          "sum"]
    kept, _ = build_model(fw + ["--fw-favor-redraw", "never"])
    assert decode(kept.state_dict()[RECORD])["--fw-favor-redraw"] == "never"
    with pytest.raises(SystemExit, match=r"trained with --fw-favor-redraw never, not batch") as err:
        build_model(fw + ["--fw-favor-redraw", "batch"])[0].load_state_dict(kept.state_dict())
    assert "\n" not in str(err.value)
    # a record written before the flag was recorded: the args it came with knew its value, the record does not
    state = recorded_before(kept, "--fw-favor-redraw")
    with caplog.at_level(logging.WARNING):
        build_model(fw + ["--fw-favor-redraw", "batch"], seed=1)[0].load_state_dict(state)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["the checkpoint's record predates --fw-favor-redraw: not checked; load it with the values it "
                        "was trained with"]
    # no FAVOR+: nothing to record
    assert "--fw-favor-redraw" not in decode(build_model(["--fw-feature-map", "dpfp"])[0].state_dict()[RECORD])
