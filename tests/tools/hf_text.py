#!/usr/bin/python3
"""Mixed text for the tokenizer.json tests, the same for the same seed (random.Random): what the byte-level
patterns treat case by case. Contractions in every case ("DON'T", "I'LL", "We'Re"), digit runs of every
length and several scripts' digits, letters of several scripts with their combining marks, emoji ZWJ
sequences, skin tones, flags and keycaps, runs of every kind of whitespace, CRLF and lone CR line ends,
punctuation runs, code, and special tokens (Llama 3's and GPT-2's, whole and cut short).

  hf_text.py SEED BYTES [--byte-level-js] [--nfc]   at least BYTES bytes of UTF-8 on stdout

--byte-level-js leaves out U+0085 and U+FEFF, the two characters where the reference's ByteLevel
pre-tokenizer differs from Hugging Face tokenizers: it matches GPT-2's pattern with JavaScript's \\s, which
holds U+FEFF and not U+0085 (its Split pre-tokenizer rewrites \\s to White_Space, as Hugging Face's has it).
Characters come from blocks that Unicode has not changed since before version 14, the version of
core/tokenizer/unicode_tables.h, so the reference's newer Unicode classes them alike.

--nfc adds, as a fifth of the pieces, what NFC works on: letters with marks in every order, precomposed
letters and their decompositions, singletons (U+212B ANGSTROM SIGN, CJK compatibility ideographs),
composition exclusions (U+0958), non-starter decompositions, pairs that compose into a starter of class 0
(U+09C7 U+09BE), Hangul jamo runs and syllables with trailing jamo. Only characters assigned in Python's
Unicode (14.0), where Unicode's normalization stability policy makes every later version normalize alike
(JavaScript's String.prototype.normalize in a newer Node included). No piece begins with U+0338, the one
mark NFC joins to the '>' that added tokens end with: NFC of the whole text is NFC of each stretch between
its added tokens."""
import random
import sys
import unicodedata

WORDS = ('the of and to in is that it was for on are with as his they be at one have this from or had by word '
         'but what some we can out other were all there when up use your how said an each she which do their '
         'time if will way about many then them write would like so these her long make thing see him two has '
         'look more day could go come did number sound no most people my over know water than call first who '
         'may down side been now find any new work part take get place made live where after back little only').split()
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D", "'lL", "'rE",
                "n't", "N'T", "'", "''", "'x", "’s"]
SCRIPT_RANGES = [(0x00C0, 0x024F), (0x0370, 0x03FF), (0x0400, 0x04FF), (0x05D0, 0x05EA), (0x0620, 0x064A),
                 (0x0900, 0x097F), (0x0E01, 0x0E5B), (0x3041, 0x30FF), (0x4E00, 0x9FA5), (0xAC00, 0xD7A3),
                 (0x10A0, 0x10FF), (0x0530, 0x058F), (0x1E00, 0x1EFF)]
COMBINING = [0x0300, 0x0301, 0x0308, 0x0327, 0x0338, 0x064B, 0x093F, 0x094D, 0x0E31, 0x20DD]
DIGITS = "0123456789" + "٠١٢٣٤٥٦٧٨٩" + "०१२३४५६७८९" + "０１２３４５６７８９" + "²³¹½¼Ⅻⅷ①"
EMOJI = ["👨‍👩‍👧‍👦", "🏳️‍🌈", "👍🏽", "🇫🇷🇯🇵", "1️⃣", "❤️", "🧑🏿‍🚀", "😀", "🎉🎉", "👩‍❤️‍💋‍👨", "🤷‍♀️", "⌚"]
SPACES = [" ", "  ", "   ", "\t", " \t ", "\u00a0", "\u3000", "\u2009", "\u2028", "\u0085", "\u200b", "\ufeff", "        "]
NEWLINES = ["\n", "\r\n", "\n\n", "\r\n\r\n", "\r", " \n", "\t\n", "  \r\n  ", "\n   \n", ".\n", "!\r\n\r\n"]
PUNCT = ["!", "?", "...", "!!!", "?!", ",", ";", ":", "—", "–", "«", "»", "“", "”", "(", ")", "[", "]", "{", "}",
         "#", "@", "$", "%", "^", "&", "*", "=", "==", "->", "=>", "/", "\\", "|", "~", "`", "_", "+", "<", ">"]
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|reserved_special_token_7|>",
           "<|reserved_special_token_247|>", "<|endoftext|>", "<|begin_of", "<|", "|>", "<<|eot_id|>>", "<|im_start|>"]
CODE = ["def f(x):\n    return x ** 2  # square\n", "if (a != b) { return -1; }\r\n", "for i in range(10):\n\tprint(i)\n",
        "SELECT * FROM t WHERE id = 42;\n", "<div class=\"x\">Hi</div>\n", "x = [1, 2, 3]\n", "   \n\n   indented\n"]


def word(rng):
    w = rng.choice(WORDS)
    r = rng.random()
    if r < 0.15:
        w = w.upper()
    elif r < 0.3:
        w = w.capitalize()
    if rng.random() < 0.2:
        w += rng.choice(CONTRACTIONS)
    return w


def number(rng):
    n = rng.choice([1, 1, 2, 3, 4, 5, 7, 12, 25])
    if rng.random() < 0.7:
        return ''.join(rng.choice('0123456789') for _ in range(n))
    return ''.join(rng.choice(DIGITS) for _ in range(n))


def script_word(rng):
    lo, hi = rng.choice(SCRIPT_RANGES)
    chars = (chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8)))
    s = ''.join(c for c in chars if unicodedata.category(c) != 'Cn')   # unassigned in 14.0: maybe not in later versions
    if rng.random() < 0.3:
        s += chr(rng.choice(COMBINING))
    return s


def nfc_pools():
    """Characters with a combining class (marks), with a canonical decomposition (decomposable), and the
    decompositions into two characters whose second one has class 0 (starter pairs)."""
    marks, decomposable, starter_pairs = [], [], []
    for cp in range(0x30000):
        c = chr(cp)
        if unicodedata.category(c) in ('Cn', 'Cs'):
            continue
        if unicodedata.combining(c):
            marks.append(c)
        m = unicodedata.decomposition(c).split()
        if m and not m[0].startswith('<') and not 0xAC00 <= cp <= 0xD7A3:
            decomposable.append(c)
            if len(m) == 2 and unicodedata.combining(chr(int(m[1], 16))) == 0:
                starter_pairs.append(''.join(chr(int(x, 16)) for x in m))
    return marks, decomposable, starter_pairs


def hangul(rng):
    jamo = lambda lo, n: chr(lo + rng.randrange(n))
    kind = rng.randrange(4)
    if kind == 0:   # leading + vowel (+ trailing): one syllable
        return jamo(0x1100, 19) + jamo(0x1161, 21) + (jamo(0x11A8, 27) if rng.random() < 0.5 else '')
    if kind == 1:   # a syllable without a trailing jamo, then one
        return chr(0xAC00 + 28 * rng.randrange(19 * 21)) + jamo(0x11A8, 27)
    if kind == 2:   # a syllable with one, then another: stays two
        return chr(0xAC01 + rng.randrange(19 * 21 * 28 - 1)) + jamo(0x11A8, 27)
    return ''.join(rng.choice([jamo(0x1100, 19), jamo(0x1161, 21), jamo(0x11A8, 27)]) for _ in range(rng.randint(2, 6)))


def nfc_piece(rng, pools):
    marks, decomposable, starter_pairs = pools
    kind = rng.randrange(7)
    if kind == 0:
        return rng.choice('aeiouyAEIOUcnszgkrlCNSZ') + ''.join(rng.choice(marks) for _ in range(rng.randint(1, 4)))
    if kind == 1:
        c = rng.choice(decomposable)
        return c + ''.join(rng.choice(marks) for _ in range(rng.randrange(3)))
    if kind == 2:
        return unicodedata.normalize('NFD', rng.choice(decomposable))
    if kind == 3:
        return rng.choice(starter_pairs)
    if kind == 4:
        return hangul(rng)
    if kind == 5:
        return rng.choice(['\u212b', '\u2126', '\u212a', '\u0958', '\u095f', '\u0344', '\u0f73', '\u0f81',
                           '\uf900', '\ufa10', '\U0002f800', '\u2adc', '\U0001d15e', '=\u0338', '<\u0338', 'e\u0301',
                           '\u00e9', 'a\u0302\u0323', 'a\u0323\u0302', 'A\u030a', '\u1e9b\u0323'])
    return ''.join(rng.choice(WORDS[:20]) + rng.choice(marks) for _ in range(rng.randint(1, 3)))


def piece(rng, spaces, pools):
    if pools and rng.random() < 0.2:
        return nfc_piece(rng, pools)
    kind = rng.random()
    if kind < 0.45:
        return word(rng)
    if kind < 0.55:
        return number(rng)
    if kind < 0.68:
        return script_word(rng)
    if kind < 0.73:
        return rng.choice(EMOJI)
    if kind < 0.82:
        return rng.choice(PUNCT)
    if kind < 0.85:
        return rng.choice(SPECIAL)
    if kind < 0.87:
        return rng.choice(CODE)
    if kind < 0.93:
        return rng.choice(spaces)
    return rng.choice(NEWLINES)


def main():
    seed, size = int(sys.argv[1]), int(sys.argv[2])
    spaces = [s for s in SPACES if not ('--byte-level-js' in sys.argv[3:] and s in ('\u0085', '\ufeff'))]
    pools = nfc_pools() if '--nfc' in sys.argv[3:] else None
    rng = random.Random(seed)
    out, n = [], 0
    while n < size:
        p = piece(rng, spaces, pools)
        if rng.random() < 0.7:
            p = ' ' + p
        out.append(p)
        n += len(p.encode('utf-8'))
    sys.stdout.buffer.write(''.join(out).encode('utf-8'))


if __name__ == '__main__':
    main()
