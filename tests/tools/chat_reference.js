// The reference for scripts/tokenize.py --chat (tests/system/t_chat_tokenize.sh): each conversation rendered
// with npm's @huggingface/jinja (Hugging Face's JavaScript Jinja for chat templates) and encoded with
// @huggingface/tokenizers without special tokens added around it, as transformers' apply_chat_template(...,
// tokenize=True) does. From .npm/ (scripts/install_deps.sh test).
//   node tests/tools/chat_reference.js TOKENIZER.json CONFIG.json CONVERSATIONS.jsonl OUT.jsonl [TEMPLATE.json]
// CONFIG: a tokenizer_config.json (its chat_template, "default" of a list, and its special tokens);
// TEMPLATE.json: {"chat_template": ...} in place of CONFIG's.
// OUT: one line per conversation, {"line": N, "ids": [...]}.
'use strict';
const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');

const local = createRequire(path.join(__dirname, '..', '..', '.npm', 'package.json'));
const { Tokenizer } = local('@huggingface/tokenizers');
const { Template } = local('@huggingface/jinja');

const SPECIAL_KEYS = ['bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token'];

function tokenText(v) {
    if (v && typeof v === 'object') v = v.content;
    return typeof v === 'string' ? v : null;
}

// The variables transformers renders with: its special_tokens_map (the tokens set, as strings).
function specialTokens(config) {
    const vars = {};
    for (const k of SPECIAL_KEYS) {
        const t = tokenText(config[k]);
        if (t !== null) vars[k] = t;
    }
    if (Array.isArray(config.additional_special_tokens))
        vars.additional_special_tokens = config.additional_special_tokens.map(tokenText).filter((t) => t !== null);
    return vars;
}

function chatTemplate(config) {
    const t = config.chat_template;
    return Array.isArray(t) ? t.find((x) => x.name === 'default').template : t;
}

const [tokenizerFile, configFile, conversationsFile, outFile, templateFile] = process.argv.slice(2);
if (!outFile) {
    console.error('usage: chat_reference.js TOKENIZER.json CONFIG.json CONVERSATIONS.jsonl OUT.jsonl [TEMPLATE.json]');
    process.exit(2);
}
const tok = new Tokenizer(JSON.parse(fs.readFileSync(tokenizerFile, 'utf8')), {});
const config = JSON.parse(fs.readFileSync(configFile, 'utf8'));
const template = new Template(chatTemplate(templateFile ? JSON.parse(fs.readFileSync(templateFile, 'utf8')) : config));
const vars = specialTokens(config);
const out = [];
fs.readFileSync(conversationsFile, 'utf8').split('\n').forEach((line, i) => {
    if (!line.trim()) return;
    const { messages } = JSON.parse(line);
    const text = template.render({ ...vars, messages, add_generation_prompt: false });
    out.push(JSON.stringify({ line: i + 1, ids: tok.encode(text, { add_special_tokens: false }).ids }));
});
fs.writeFileSync(outFile, out.join('\n') + '\n');
