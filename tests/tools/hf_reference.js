// The reference for the tokenizer.json tests (tests/system/t_tokenizer_hf.sh) and scripts/bench_tokenizer.sh:
// npm's @huggingface/tokenizers, a JavaScript port of Hugging Face tokenizers, from .npm/ (installed by
// scripts/install_deps.sh test).
//   node tests/tools/hf_reference.js encode TOKENIZER.json TEXT OUT.u32 [TEXT OUT.u32 ...]
//       each TEXT's ids as uint32 little-endian, with no special tokens added around it; prints one line per
//       TEXT, "WALL_S CPU_S BYTES NTOK", timing the encoding alone (reading and set-up excluded)
//   node tests/tools/hf_reference.js decode TOKENIZER.json IDS.u32 OUT
//       the ids' text as UTF-8, as decoded with no clean-up of spaces
'use strict';
const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');

const local = createRequire(path.join(__dirname, '..', '..', '.npm', 'package.json'));
const { Tokenizer } = local('@huggingface/tokenizers');

function load(file) {
    return new Tokenizer(JSON.parse(fs.readFileSync(file, 'utf8')), {});
}

function encode(tok, textFile, outFile) {
    const text = fs.readFileSync(textFile, 'utf8');
    const t0 = process.hrtime.bigint();
    const c0 = process.cpuUsage();
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    const c1 = process.cpuUsage(c0);
    const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
    fs.writeFileSync(outFile, Buffer.from(new Uint32Array(ids).buffer));
    console.log(`${seconds} ${(c1.user + c1.system) / 1e6} ${Buffer.byteLength(text, 'utf8')} ${ids.length}`);
}

function decode(tok, idsFile, outFile) {
    const raw = fs.readFileSync(idsFile);
    const ids = Array.from(new Uint32Array(raw.buffer, raw.byteOffset, raw.length / 4));
    fs.writeFileSync(outFile, tok.decode(ids, { clean_up_tokenization_spaces: false }), 'utf8');
}

const [mode, tokenizerFile, ...files] = process.argv.slice(2);
const tok = load(tokenizerFile);
if (mode === 'encode' && files.length % 2 === 0) {
    for (let i = 0; i < files.length; i += 2) encode(tok, files[i], files[i + 1]);
} else if (mode === 'decode' && files.length === 2) {
    decode(tok, files[0], files[1]);
} else {
    console.error('usage: hf_reference.js encode TOKENIZER.json TEXT OUT.u32 [...] | decode TOKENIZER.json IDS.u32 OUT');
    process.exit(2);
}
