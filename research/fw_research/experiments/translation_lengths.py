"""How a model's translations go wrong in length, from the translations alone: BLEU and length by source-length
bucket, repetition loops (across words and inside one), and translations over twice their reference
(length_profile). Used by attention_runs.py (every run of fw_research.demo.compare_attention) and the loop
diagnostics of fw_research.demo."""
import sacrebleu
from sacremoses import MosesTokenizer

from fw_research.experiments.catalog_corpus import tokenize

# Source-length buckets (English words of the raw source): (name, fewest, most)
BUCKETS = (("≤5", 0, 5), ("6–15", 6, 15), (">15", 16, None))
LOOP_TIMES, LOOP_MAX_N = 4, 4  # a loop: an n-gram (n <= 4) LOOP_TIMES times in a row
# a loop inside a word: a piece of up to 8 characters LOOP_TIMES times in a row ("CLCKKKKKKK", "PLUPLUPLUPLU"), a
# subword looping where the words do not. No reference of the catalogs' test, valid or long splits has one, and 26
# of the 34 475 training references (format strings such as "%s%s%s%s", "XXXXXX")
WORD_LOOP_MAX_CHARS = 8


def bucket_of(words):
    """The name of the BUCKETS entry of a source of `words` words."""
    return next(name for name, low, high in BUCKETS if words >= low and (high is None or words <= high))


def loop_span(tokens, times=LOOP_TIMES, max_n=LOOP_MAX_N):
    """(start, end) of the first stretch of `tokens` in which an n-gram (n <= max_n, the smallest n first) occurs
    `times` times in a row ("puis puis puis puis", "a b a b a b a b"), from its second occurrence on: the positions
    that repeat. None without one. An n-gram repeated k times in a row is a stretch of (k - 1) n positions j where
    tokens[j] == tokens[j + n]."""
    for n in range(1, max_n + 1):
        run = 0
        for j in range(len(tokens) - n):
            run = run + 1 if tokens[j] == tokens[j + n] else 0
            if run >= (times - 1) * n:
                start = j - run + 1 + n
                end = start
                while end < len(tokens) and tokens[end] == tokens[end - n]:
                    end += 1
                return start, end
    return None


def repeats(tokens, times=LOOP_TIMES, max_n=LOOP_MAX_N):
    """Whether `tokens` has a loop (loop_span)."""
    return loop_span(tokens, times, max_n) is not None


def repeats_in_a_word(text):
    """Whether a whitespace token of `text` holds a loop of characters (loop_span over its characters, pieces of up
    to WORD_LOOP_MAX_CHARS): a model's subword written again and again inside one word."""
    return any(repeats(list(word), max_n=WORD_LOOP_MAX_CHARS) for word in text.split())


def loops(text):
    """Whether `text` loops across its words (repeats) or inside one (repeats_in_a_word)."""
    return repeats(text.split()) or repeats_in_a_word(text)


def loops_in_words_only(hypotheses):
    """The number of hypotheses with a loop inside a word (repeats_in_a_word) and none across words (repeats):
    the loops that the count over whitespace tokens misses."""
    return sum(repeats_in_a_word(h) and not repeats(h.split()) for h in hypotheses)


def over_twice_in_tokens(hypotheses, references):
    """The number of hypotheses with more than twice their reference's tokens, both tokenised as the corpus is
    (catalog_corpus.tokenize): counted in words, a detokenised `» %c «` (Moses does not join German quotes again)
    is three words where its reference's `»%c«` is one."""
    tokenizer = MosesTokenizer(lang="de")
    return sum(len(tokenize(tokenizer, h).split()) > 2 * len(tokenize(tokenizer, r).split())
               for h, r in zip(hypotheses, references))


def length_profile(hypotheses, references, sources):
    """How the translations' lengths go wrong: per source-length bucket (BUCKETS, the raw source's words) the
    number of sentences, sacreBLEU and the hypotheses' length over the references' (sacreBLEU's 13a tokens), and
    over the whole split the share of hypotheses with a loop (repeats(), whitespace tokens), the number with a loop
    inside a word only (loops_in_words_only), and the number of hypotheses with more than twice their reference's
    words, and tokens (over_twice_in_tokens)."""
    if not len(hypotheses) == len(references) == len(sources):
        raise ValueError(f"{len(hypotheses)} hypotheses, {len(references)} references, {len(sources)} sources")
    groups = {name: [] for name, _, _ in BUCKETS}
    for i, source in enumerate(sources):
        groups[bucket_of(len(source.split()))].append(i)
    buckets = {}
    for name, rows in groups.items():
        if not rows:
            buckets[name] = {"n": 0, "bleu": None, "length_ratio": None}
            continue
        result = sacrebleu.BLEU().corpus_score([hypotheses[i] for i in rows], [[references[i] for i in rows]])
        buckets[name] = {"n": len(rows), "bleu": round(result.score, 2),
                         "length_ratio": round(result.sys_len / result.ref_len, 4) if result.ref_len else None}
    across_words = sum(repeats(h.split()) for h in hypotheses)
    return {"buckets": buckets, "n": len(hypotheses), "loops": across_words,
            "repetition_rate": round(across_words / len(hypotheses), 4) if hypotheses else None,
            "loops_in_words": loops_in_words_only(hypotheses),
            "over_twice": sum(len(h.split()) > 2 * len(r.split()) for h, r in zip(hypotheses, references)),
            "over_twice_tokens": over_twice_in_tokens(hypotheses, references)}
