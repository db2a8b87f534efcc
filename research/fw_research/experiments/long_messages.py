"""Long messages from short ones: the text side of the corpus's long split and of the joined training split.

Pure text, no files (catalog_corpus writes and binarises what these choose):

  long_pairs    catalog messages of LONG_WORDS English words, and messages joined from consecutive entries of one
                catalog up to that length
  split_long    test_long and valid_long from those, natural messages first
  joined_pairs  consecutive pairs of a list joined into long messages (the joined training split: JOINED_WORDS)
"""
import random

LONG_WORDS = (16, 40)  # a long message's English words: from WMT's sentence lengths (about 25 on average)
# a joined training message's English words: sentences as long as the longer half of WMT14's, none as short as a
# catalog message
JOINED_WORDS = (20, 60)


def _long_enough_de(en, de):
    return len(de.split()) <= 2 * len(en.split())  # a German twice as long is a wrong or annotated entry


def join_messages(pieces):
    """Messages as one text: each piece ends a sentence (a full stop where it has no final punctuation)."""
    return " ".join(p if p[-1] in ".!?:;" else p + "." for p in pieces)


def long_pairs(catalogs, exclude):
    """(natural, joined): pairs of LONG_WORDS English words, each list deduplicated (the first German kept) and
    sorted. natural: catalog messages of that length. joined: consecutive messages of one catalog, each of 3 to 15
    words and none an English message of `exclude` (the ordinary splits) or a natural one, joined as joined_pairs
    joins them."""
    low, high = LONG_WORDS
    natural, joined, seen = {}, {}, set(exclude)
    for messages in catalogs.values():
        for en, de in messages:
            if low <= len(en.split()) <= high and _long_enough_de(en, de) and en not in seen:
                natural.setdefault(en, de)
    seen |= set(natural)
    for messages in catalogs.values():
        pieces = []
        for en, de in messages:
            if en in seen or not 3 <= len(en.split()) < low or not _long_enough_de(en, de):
                continue  # not a piece: it does not break a run (the catalog's order is alphabetical anyway)
            seen.add(en)
            pieces.append((en, de))
        for en, de in joined_pairs(pieces):
            joined.setdefault(en, de)
    return sorted(natural.items()), sorted(joined.items())


def split_long(natural, joined, size):
    """{"test_long": ..., "valid_long": ...} of `size` pairs each where there are enough (else half each): natural
    messages first, topped up with joined ones, shuffled with a fixed seed."""
    natural, joined = list(natural), list(joined)
    random.Random(0).shuffle(natural)
    random.Random(0).shuffle(joined)
    chosen = (natural + joined)[:2 * size]
    random.Random(1).shuffle(chosen)
    half = min(size, len(chosen) // 2)
    return {"test_long": chosen[:half], "valid_long": chosen[half:2 * half]}


def joined_pairs(pairs, words=LONG_WORDS):
    """Consecutive pairs of `pairs` joined (join_messages) into messages of `words` English words: a run is closed
    as soon as it reaches the fewest, and restarted at a pair that would take it past the most."""
    low, high = words
    joined, run, length = [], [], 0
    for en, de in pairs:
        size = len(en.split())
        if run and length + size > high:
            run, length = [], 0
        run.append((en, de))
        length += size
        if length >= low:
            joined.append((join_messages([e for e, _ in run]), join_messages([d for _, d in run])))
            run, length = [], 0
    return joined
