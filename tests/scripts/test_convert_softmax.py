"""fw_research.convert.convert_softmax: a transformer_vaswani_wmt_en_de_big-shaped softmax checkpoint trained by
fairseq's own code (fairseq-train, shrunk dims, a tiny corpus: conftest.py's `teacher`) converts to transformer_fw_big; every teacher tensor is
copied, the new parameters start as the teacher (convolution 0, gate open); the result trains a few updates through
fairseq-train --restore-file, distils through --criterion fw_attention_distillation and generates through
fairseq-generate, with a learned map and with the translation defaults (whose map distils through the projections); its record names the teacher and survives training; a resume with other --fw-* flags is still
refused; what cannot be mapped is refused in one line."""
import subprocess
import sys

import pytest
import torch

from conftest import BIN, REPO, SHRUNK, TRAIN, run

import fw_fairseq  # noqa: F401  (the safe globals for torch.load)
from fw_fairseq.models.checkpoints import CONVERTED, decode
from fw_research.convert import convert_softmax

CONVERT = [sys.executable, "-m", "fw_research.convert.convert_softmax"]
RESET = ["--reset-optimizer", "--reset-dataloader", "--reset-meters", "--reset-lr-scheduler"]
T2R = ["--fw-feature-map", "t2r", "--fw-t2r-features", "8"]


def _convert(source, target, *extra):
    return subprocess.run([*CONVERT, "--from", str(source), "--to", str(target), *extra], capture_output=True,
                          text=True)


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def test_shared_parameters_are_copied_and_new_ones_start_as_the_teacher(teacher):
    work, data, source = teacher
    done = _convert(source, work / "conv_gate.pt", "--data", str(data), *T2R, "--fw-output-gate", "channel",
                    "--fw-decoder-conv", "2")
    assert done.returncode == 0, done.stderr
    before, after = _load(source), _load(work / "conv_gate.pt")
    assert after["cfg"]["model"].arch == "transformer_fw_big" and after["cfg"]["model"].fw_feature_map == "t2r"
    for name, tensor in before["model"].items():
        assert torch.equal(after["model"][name], tensor.to(after["model"][name].dtype)), name
    new = set(after["model"]) - set(before["model"])
    assert all(any(f".{part}." in n for n in new) for part in ("encoder_conv", "decoder_conv", "output_gate"))
    for name in new:
        if ".encoder_conv." in name or ".decoder_conv." in name or name.endswith("output_gate.proj.weight"):
            assert (after["model"][name] == 0).all(), name
        elif name.endswith("output_gate.proj.bias"):
            assert (torch.sigmoid(after["model"][name]) > 0.99).all(), name
    record = decode(after["model"]["fw_settings"])
    assert record[CONVERTED] == f"transformer_vaswani_wmt_en_de_big ({source})"
    assert record["--fw-feature-map"] == "t2r" and record["--fw-t2r-features"] == "8"


def test_converts_distils_trains_and_generates_through_the_clis(teacher):
    work, data, source = teacher
    assert _convert(source, work / "conv.pt", *T2R).returncode == 0
    student = ["--user-dir", str(REPO / "fw_fairseq"), "--arch", "transformer_fw_big", *SHRUNK, *T2R, *TRAIN, *RESET]
    run([str(BIN / "fairseq-train"), str(data), *student, "--max-update", "2", "--criterion",
         "fw_attention_distillation", "--restore-file", str(work / "conv.pt"), "--save-dir", str(work / "distil")])
    distilled = _load(work / "distil" / "checkpoint_last.pt")["model"]
    converted = _load(work / "conv.pt")["model"]
    changed = {name for name, tensor in converted.items() if not torch.equal(tensor, distilled[name].to(tensor.dtype))}
    assert changed and all(".t2r." in name for name in changed)  # only the maps trained
    run([str(BIN / "fairseq-train"), str(data), *student, "--max-update", "2", "--restore-file",
         str(work / "distil" / "checkpoint_last.pt"), "--save-dir", str(work / "tuned")])
    tuned = work / "tuned" / "checkpoint_last.pt"
    assert decode(_load(tuned)["model"]["fw_settings"])[CONVERTED].startswith("transformer_vaswani_wmt_en_de_big")
    out = run([str(BIN / "fairseq-generate"), str(data), "--user-dir", str(REPO / "fw_fairseq"), "--path", str(tuned),
               "--beam", "2", "--cpu", "--max-tokens", "400"])
    assert "Generate test with beam=2" in out.stdout + out.stderr
    refused = subprocess.run([str(BIN / "fairseq-train"), str(data), *student[:-len(RESET)], "--fw-t2r-features", "4",
                              "--max-update", "3", "--save-dir", str(work / "tuned")], capture_output=True, text=True)
    assert refused.returncode != 0 and "was trained with --fw-t2r-features 8, not 4" in refused.stderr


def test_converts_to_the_translation_defaults_distils_through_the_projections_and_generates(teacher):
    work, data, source = teacher
    converted = work / "conv_default.pt"
    assert _convert(source, converted).returncode == 0  # no --fw-* flag: the translation defaults
    record = decode(_load(converted)["model"]["fw_settings"])
    assert record["--fw-feature-map"] == "dpfp" and record["--fw-decoder-rule"] == "delta"
    assert record["--fw-cross-align"] == "4"
    student = ["--user-dir", str(REPO / "fw_fairseq"), "--arch", "transformer_fw_big", *SHRUNK, *TRAIN, *RESET]
    run([str(BIN / "fairseq-train"), str(data), *student, "--max-update", "2", "--criterion",
         "fw_attention_distillation", "--distil-trains", "projections", "--distil-teacher", str(converted),
         "--restore-file", str(converted), "--save-dir", str(work / "distil_default")])
    distilled = work / "distil_default" / "checkpoint_last.pt"
    before, after = _load(converted)["model"], _load(distilled)["model"]
    changed = {name for name, tensor in before.items() if not torch.equal(tensor, after[name].to(tensor.dtype))}
    assert any(".beta_proj." in name for name in changed) and any(".encoder_attn.q_proj." in name for name in changed)
    assert all(any(f".{part}." in name for part in ("q_proj", "k_proj", "beta_proj")) for name in changed)
    out = run([str(BIN / "fairseq-generate"), str(data), "--user-dir", str(REPO / "fw_fairseq"), "--path",
               str(distilled), "--beam", "2", "--cpu", "--max-tokens", "400"])
    assert "Generate test with beam=2" in out.stdout + out.stderr


def _mutated(work, source, name, change):
    state = _load(source)
    change(state)
    path = work / f"{name}.pt"
    torch.save(state, path)
    return path


def _set_arch(arch):
    return lambda state: setattr(state["cfg"]["model"], "arch", arch)


@pytest.mark.parametrize("name,change,extra,message", [
    ("lstm", _set_arch("lstm"), [], "architecture 'lstm' cannot be converted; allowed: "),
    ("shape", lambda s: s["model"].__setitem__("encoder.layers.0.fc1.weight", torch.zeros(40, 32)), [],
     "encoder.layers.0.fc1.weight is (40, 32) in the teacher, (48, 32) in the fast-weight model"),
    ("extra", lambda s: s["model"].__setitem__("encoder.layernorm_embedding.weight", torch.ones(32)), [],
     "the fast-weight model has no encoder.layernorm_embedding.weight"),
    ("fast", lambda s: (_set_arch("transformer_fw_big")(s), setattr(s["cfg"]["model"], "fw_attention", "cross")), [],
     "has fast weights already (--fw-attention cross)"),
    ("dict", lambda s: None, ["--data", "OTHER"], "dict.en.txt has 12 entries, the teacher's source embeddings"),
    ("nu", lambda s: None, ["--fw-dpfp-nu", "40"], "argument --fw-dpfp-nu: 40 is too large for encoder attention"),
])
def test_what_cannot_be_mapped_is_refused_in_one_line(teacher, name, change, extra, message, capsys):
    """In process (each refusal comes before any model is built; the CLI itself runs in the tests above)."""
    work, _, source = teacher
    if "OTHER" in extra:
        other = work / "other"
        other.mkdir(exist_ok=True)
        (other / "train.en-de.en.idx").write_bytes(b"")
        for lang in ("en", "de"):
            (other / f"dict.{lang}.txt").write_text("".join(f"x{i} 1\n" for i in range(8)))
        extra = ["--data", str(other)]
    with pytest.raises(SystemExit) as err:
        convert_softmax.convert(["--from", str(_mutated(work, source, name, change)), "--to",
                                 str(work / "refused.pt"), *extra])
    said = [line for line in (capsys.readouterr().err + str(err.value)).splitlines()
            if line.strip() and line.strip() != "2" and "usage:" not in line]
    assert len(said) == 1 and message in said[0], said
    assert not (work / "refused.pt").exists()
