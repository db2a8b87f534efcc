"""fw_research.demo.diagnose_lengths: BLEU split into brevity penalty and precisions, and the end-of-text measures,
on hand-made translations and a decoder whose probabilities are known: seconds, no training."""
import json
import math
from types import SimpleNamespace

import pytest
import sacrebleu
import torch

from fw_research.demo import diagnose_lengths


def test_bleu_is_the_brevity_penalty_times_the_precisions():
    hypotheses = ["die Datei wurde gefunden", "das Verzeichnis ist leer"]  # shorter than the references
    references = ["die Datei wurde nicht gefunden", "das Verzeichnis ist jetzt leer"]
    bleu = sacrebleu.corpus_bleu(hypotheses, [references])
    scores = {"precisions": bleu.precisions}
    assert bleu.bp < 1
    assert diagnose_lengths.bleu_over_bp(scores) * bleu.bp == pytest.approx(bleu.score, rel=1e-9)


def test_the_long_split_is_scored_from_its_own_record():
    run = {"bleu": 28.0, "long": {"bleu": 6.0}}
    assert diagnose_lengths.scores_of(run, "test")["bleu"] == 28.0
    assert diagnose_lengths.scores_of(run, "test_long")["bleu"] == 6.0


class KnownDecoder(torch.nn.Module):
    """A decoder that gives eos probability P_EOS[t] at step t and spreads the rest evenly over the other tokens."""
    P_EOS = (0.1, 0.2, 0.5)  # steps 0, 1, 2
    VOCAB, EOS = 5, 2

    def forward(self, source, source_lengths, prev):
        steps = prev.size(1)
        probs = torch.empty(1, steps, self.VOCAB, dtype=torch.float64)
        for t in range(steps):
            probs[0, t] = (1 - self.P_EOS[t]) / (self.VOCAB - 1)
            probs[0, t, self.EOS] = self.P_EOS[t]
        return probs.log(), None

    def get_normalized_probs(self, net, log_probs):
        return net[0]


def test_the_end_of_text_measures_on_known_probabilities():
    target = torch.tensor([3, 4, KnownDecoder.EOS])  # two words, then eos at step 2
    dataset = [{"source": torch.tensor([3, KnownDecoder.EOS]), "target": target}]
    words, eos, early = diagnose_lengths.end_of_text(KnownDecoder(), dataset, KnownDecoder.EOS)
    word_probs = [(1 - 0.1) / 4, (1 - 0.2) / 4]
    assert words == pytest.approx(-sum(map(math.log, word_probs)) / 2, rel=1e-12)
    assert eos == pytest.approx(-math.log(0.5), rel=1e-12)
    assert early == pytest.approx(-math.log(0.9) - math.log(0.8), rel=1e-12)  # not stopping at steps 0 and 1


class EarlyEosDecoder(KnownDecoder):
    P_EOS = (0.3, 0.2, 0.5)
    decoder = SimpleNamespace(dictionary=SimpleNamespace(eos=lambda: KnownDecoder.EOS))


def test_short_translations_split_into_the_models_choice_and_search_errors():
    """Reference 3 4 eos: beam score (log(0.7/4) + log 0.2 + log 0.5) / 3^0.6 = -2.093. The translation "eos" scores
    log 0.3 = -1.204, above it (the model's choice); "3 eos" and "4 eos" (log(0.7/4) + log 0.2) / 2^0.6 = -2.211,
    below it (search errors); "3 4 eos" is not short."""
    eos = KnownDecoder.EOS
    message = {"source": torch.tensor([3, eos]), "target": torch.tensor([3, 4, eos])}
    hypotheses = {0: torch.tensor([eos]), 1: torch.tensor([3, eos]), 2: torch.tensor([4, eos]),
                  3: torch.tensor([3, 4, eos])}
    short, missed = diagnose_lengths.short_translations(EarlyEosDecoder(), [message] * 4, hypotheses)
    assert (short, missed) == (pytest.approx(3 / 4), pytest.approx(2 / 3))


def test_the_table_has_one_line_per_configuration_with_means_over_its_seeds():
    rows = [{"config": name, "seed": seed, "bleu": bleu, "length_ratio": 0.9, "bp": 0.89, "bleu_over_bp": 30.0,
             "words_nll": 1.8, "eos_nll": 0.4, "early_eos": 0.2}
            for name, seed, bleu in (("softmax", 1, 28.0), ("softmax", 2, 29.0), ("dpfp2-sum-vconv3", 1, 30.0))]
    lines = diagnose_lengths.table(rows, "test").splitlines()
    assert lines[4].startswith("| softmax | 1,2 | 28.50 | 0.900 | 0.890 | 30.00 |")
    assert lines[5].startswith("| dpfp2-sum-vconv3 | 1 | 30.00 |")
    assert len(lines) == 6
    ordered = diagnose_lengths.table(rows, "test", order=["dpfp2-sum-vconv3", "elu-sum"]).splitlines()
    assert [line.split(" | ")[0] for line in ordered[4:]] == ["| dpfp2-sum-vconv3", "| softmax"]
    searched = diagnose_lengths.table([{**row, "short": 0.25, "short_missed": 0.5} for row in rows], "test")
    assert searched.splitlines()[2].endswith("| shorter than the reference | of those, reference scored higher |")
    assert searched.splitlines()[4].endswith("| 0.250 | 0.500 |")


def test_a_missing_results_file_or_checkpoint_stops_with_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        diagnose_lengths.main(["--work-dir", str(tmp_path), "--results", str(tmp_path / "none.json")])
    assert "--results" in capsys.readouterr().err
    results = tmp_path / "demo_u10.json"
    results.write_text(json.dumps({"configs": {"softmax": {}}, "runs": [{"config": "softmax", "seed": 1,
                                                                          "updates": 10}]}))
    with pytest.raises(SystemExit):
        diagnose_lengths.main(["--work-dir", str(tmp_path), "--results", str(results)])
    assert "no checkpoint" in capsys.readouterr().err
