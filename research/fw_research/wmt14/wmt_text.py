"""Text steps of the WMT14 En-De preparation, matching fairseq's prepare-wmt14en2de.sh.

That script runs Moses' normalize-punctuation.perl, remove-non-printing-char.perl and
tokenizer.perl -a on the training data, only tokenizer.perl -a (after mapping ’ to ') on
the test data, and clean-corpus-n.perl -ratio 1.5 ... 1 250 on the BPE'd training data.
Here sacremoses stands in for the Perl scripts.
"""
import itertools
import re
from functools import partial
from multiprocessing import Pool

import regex
from sacremoses import MosesPunctNormalizer, MosesTokenizer

# remove-non-printing-char.perl: s/\p{C}/ /g (Python's re has no Unicode categories)
_NON_PRINTING = regex.compile(r"\p{C}")
_SEG = re.compile(r"<seg[^>]*>(.*)</seg>")
_CHUNK_LINES = 2000
_moses = {}


def open_text(path, mode="r"):
    # newline="\n": only \n ends a line, as in Perl; stray \r inside web-crawled text must
    # not split a sentence and desynchronise the two sides of the corpus.
    return open(path, mode, encoding="utf-8", errors="replace" if "r" in mode else "strict", newline="\n")


def read_lines(path):
    with open_text(path) as f:
        for line in f:
            yield line.rstrip("\n")


def count_lines(path):
    with open(path, "rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))


def sgm_to_lines(raw_lines):
    """Segments of a WMT "fake SGML" file, whitespace-collapsed like sacrebleu's reader.

    Segment ids restart in every <doc>, so file order is the only valid order.
    """
    out = []
    for line in raw_lines:
        match = _SEG.search(line)
        if match:
            out.append(" ".join(match.group(1).split()))
    return out


def _tools(lang):
    if lang not in _moses:
        # perl_parity: reproduce normalize-punctuation.perl exactly, quirks included,
        # since that is what produced the data the published models were trained on.
        _moses[lang] = (MosesPunctNormalizer(lang, perl_parity=True), MosesTokenizer(lang))
    return _moses[lang]


def tokenise_lines(lines, lang, train):
    norm, tok = _tools(lang)
    out = []
    for line in lines:
        if train:
            line = _NON_PRINTING.sub(" ", norm.normalize(line))
        else:
            line = line.replace("\u2019", "'")
        out.append(tok.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True))
    return out


def tokenise_files(inputs, output, lang, train, workers):
    """Tokenise the concatenation of `inputs` into `output`, keeping line order."""
    lines = itertools.chain.from_iterable(read_lines(p) for p in inputs)
    chunks = iter(lambda: list(itertools.islice(lines, _CHUNK_LINES)), [])
    job = partial(tokenise_lines, lang=lang, train=train)
    with open_text(output, "w") as out, Pool(workers) as pool:
        for chunk in pool.imap(job, chunks):
            out.writelines(line + "\n" for line in chunk)


def clean_pair(src_line, tgt_line, ratio, min_len, max_len, max_word_len=1000):
    """clean-corpus-n.perl's filter for one sentence pair: the kept (src, tgt) or None.

    The script deletes "|" (a Moses factor separator; the escaping tokenizer never emits
    it) and collapses whitespace before counting space-separated tokens.
    """
    pair = [" ".join(s.replace("|", "").split()) for s in (src_line, tgt_line)]
    counts = [len(s.split(" ")) if s else 0 for s in pair]
    if min(counts) < max(min_len, 1) or max(counts) > max_len:
        return None
    if counts[0] / counts[1] > ratio or counts[1] / counts[0] > ratio:
        return None
    if any(len(word) > max_word_len for s in pair for word in s.split(" ")):
        return None
    return pair


def clean_corpus(src_in, tgt_in, src_out, tgt_out, ratio=1.5, min_len=1, max_len=250):
    """Filter a parallel corpus; returns (kept, total)."""
    kept = total = 0
    with open_text(src_out, "w") as fs, open_text(tgt_out, "w") as ft:
        for src_line, tgt_line in itertools.zip_longest(read_lines(src_in), read_lines(tgt_in)):
            if src_line is None or tgt_line is None:
                raise ValueError(f"{src_in} and {tgt_in} differ in length")
            total += 1
            pair = clean_pair(src_line, tgt_line, ratio, min_len, max_len)
            if pair:
                kept += 1
                fs.write(pair[0] + "\n")
                ft.write(pair[1] + "\n")
    return kept, total
