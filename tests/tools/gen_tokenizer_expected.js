// Writes tests/data/tokenizer_expected.json: the GPT-2 ids of varied hard texts as given by npm's tiktoken
// (OpenAI's Rust tokenizer compiled to WASM; encode_ordinary, so "<|endoftext|>" is plain text), with
// npm's gpt-3-encoder as a second opinion. gpt-3-encoder's pattern uses \p{L}/\p{N} with the /u flag,
// but JS's \s is not Unicode White_Space (it adds U+FEFF, drops U+0085), so where the two disagree the
// case records it and tiktoken is taken. Run through tests/gen_tokenizer_expected.sh.
'use strict';
const fs = require('fs');
const path = require('path');
const root = path.join(__dirname, '..');
const { get_encoding } = require(path.join(root, 'node_modules', 'tiktoken'));
const gpt3 = require(path.join(root, 'node_modules', 'gpt-3-encoder'));

const cases = {
  ascii: 'Hello world! This is a test of GPT-2 tokenization.',
  contractions: "I'm sure you're right, they'll go; we've seen it, she'd know, it's done, don't. " +
    "ISN'T 'S 'sam 'll 're've 'D x's 'T ''s '",
  whitespace_runs: 'a  b   c\t\td \n\n\n e   \n  f\t \t g     ',
  trailing_space: 'end   ',
  only_whitespace: '   \n\t \r\n  ',
  crlf: 'line one\r\nline two\r\n\r\nline three\r\n',
  space_newline_mix: ' \n hello \n\nworld \n\n \nx',
  emoji: '👍🏽 🇺🇸 👨‍👩‍👧 😀😀😀 ❤️ 🤖 ok👌',
  cjk: '日本語のテキスト、中文测试。한국어 텍스트입니다',
  rtl: 'مرحبا بالعالم! שלום עולם.',
  devanagari: 'नमस्ते दुनिया, यह एक परीक्षण है।',
  cyrillic_greek: 'Привет, мир! Γειά σου Κόσμε. Ёжик',
  numbers: '123456789 3.14159 1,000,000 ٣٤٥ ½ Ⅻ x² ९८',
  endoftext_plain: 'before<|endoftext|>after <|endoftext|> x\n<|endoftext|>',
  unicode_spaces: 'a\u00a0b\u2003c\u3000d\u0085e\ufeff f\u200bg\u2028h\u000bi\u000cj',
  controls: '\u0000\u0001x\u001c\u001f\u007f y',
  accents: 'café cafe\u0301 naïve Ångström façade',
  code: 'def f(x):\n    return x**2  # square\n\tif a != b: pass\n}\n',
  punctuation: '!!!??? ...--- *** ((( ))) "quoted" — dash – «guillemets»',
  url: 'see https://example.com/path?q=1&r=2#frag or mail@example.org',
  math_letters: '∑∫√∞≠≤ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛',
  long_run: '='.repeat(300) + ' ' + 'a'.repeat(500) + ' ' + 'ab'.repeat(200),
  long_nonlatin: 'Ш'.repeat(100) + ' ' + '🙂'.repeat(40),
  single_char: 'a',
  single_space: ' ',
};

// A seeded mix of characters from many classes, so boundaries fall in every combination.
function fuzz(seed, n) {
  const pool = [..."aZ09 '’\t\n\r.,!?-_=+<|>" + 'éßЖжλΩא٣ع中文かナ한ह्िー１２' + '😀🇺👍🏽\u0301\u00a0\u0085\u2003\u3000'];
  let x = seed >>> 0;
  let out = '';
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    out += pool[x % pool.length];
  }
  return out;
}
cases.fuzz_1 = fuzz(1, 2000);
cases.fuzz_2 = fuzz(2, 2000);

const enc = get_encoding('gpt2');
const out = [];
let disagree = 0;
for (const [name, text] of Object.entries(cases)) {
  const ids = Array.from(enc.encode_ordinary(text));
  const other = gpt3.encode(text);
  const agrees = other.length === ids.length && other.every((v, i) => v === ids[i]);
  if (!agrees) { disagree++; console.error(`gpt-3-encoder disagrees with tiktoken on ${name}`); }
  out.push({ name, text, ids, gpt3_encoder_agrees: agrees });
}
enc.free();
fs.writeFileSync(path.join(root, 'tests', 'data', 'tokenizer_expected.json'), JSON.stringify(out) + '\n');
console.error(`${out.length} cases written; gpt-3-encoder disagrees on ${disagree}`);
