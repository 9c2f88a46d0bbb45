#!/usr/bin/python3
"""Cases for build/test_nfc FILE: every Unicode scalar value alone, then random sequences of the characters
NFC works on (some of them long runs of marks), each with Python's unicodedata.normalize('NFC', ...) of it. One case per line: the input's
code points, a tab, the output's, each as hex separated by spaces.

  nfc_cases.py SEED SEQUENCES > FILE"""
import random
import sys
import unicodedata

HANGUL = [0xAC00, 0xAC01, 0xAC1C, 0xD7A3, 0xB098] + list(range(0x1100, 0x1113)) + list(range(0x1161, 0x1176)) + \
    list(range(0x11A7, 0x11C3))


def pool():
    """Characters with a combining class, a decomposition, or a part in a composite; Hangul jamo and
    syllables; and a few stable characters to stand between them."""
    marks, decomposable, parts = [], [], set()
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        if unicodedata.combining(c):
            marks.append(cp)
        m = unicodedata.decomposition(c).split()
        if m and not m[0].startswith('<'):
            decomposable.append(cp)
            parts.update(int(x, 16) for x in m)
    return marks, decomposable, sorted(parts), [ord(c) for c in 'aeiouAEOSZnc <>=-x '] + [0x4E2D, 0x3042]


def sequence(rng, kinds, length):
    return ''.join(chr(rng.choice(rng.choice(kinds))) for _ in range(length))


def line(s):
    hexes = lambda t: ' '.join('%X' % ord(c) for c in t)
    return '%s\t%s\n' % (hexes(s), hexes(unicodedata.normalize('NFC', s)))


def main():
    seed, count = int(sys.argv[1]), int(sys.argv[2])
    out = sys.stdout
    for cp in range(0x110000):
        if not 0xD800 <= cp <= 0xDFFF:
            out.write(line(chr(cp)))
    marks, decomposable, parts, stable = pool()
    kinds = [marks, marks, decomposable, parts, HANGUL, stable]
    rng = random.Random(seed)
    for i in range(count):
        if i % 50:
            out.write(line(sequence(rng, kinds, rng.randint(2, 8))))
        else:   # a long run of marks, which nfc.c sorts otherwise than a short one
            out.write(line(sequence(rng, [parts, stable], 1) + sequence(rng, [marks], rng.randint(17, 300))))


if __name__ == '__main__':
    main()
