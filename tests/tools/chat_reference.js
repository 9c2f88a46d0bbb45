// The reference for scripts/tokenize.py --chat (tests/system/t_chat_tokenize.sh): each conversation rendered
// with npm's @huggingface/jinja (Hugging Face's JavaScript Jinja for chat templates) and encoded with
// @huggingface/tokenizers without special tokens added around it, as transformers' apply_chat_template(...,
// tokenize=True) does. From .npm/ (scripts/install_deps.sh test).
//   node tests/tools/chat_reference.js TOKENIZER.json CONFIG.json CONVERSATIONS.jsonl OUT.jsonl TEMPLATE [OUT TEMPLATE ...]
// CONFIG: a tokenizer_config.json (its special tokens, and its chat_template for TEMPLATE "-"); TEMPLATE: else a
// JSON file whose chat_template is the template ("default" of a list of named ones, as CONFIG's).
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

function render(template, vars, conversationsFile) {
    const out = [];
    fs.readFileSync(conversationsFile, 'utf8').split('\n').forEach((line, i) => {
        if (!line.trim()) return;
        const { messages } = JSON.parse(line);
        const text = template.render({ ...vars, messages, add_generation_prompt: false });
        out.push(JSON.stringify({ line: i + 1, ids: tok.encode(text, { add_special_tokens: false }).ids }));
    });
    return out.join('\n') + '\n';
}

const [tokenizerFile, configFile, conversationsFile, ...jobs] = process.argv.slice(2);
if (!conversationsFile || jobs.length === 0 || jobs.length % 2 !== 0) {
    console.error('usage: chat_reference.js TOKENIZER.json CONFIG.json CONVERSATIONS.jsonl OUT.jsonl TEMPLATE [...]');
    process.exit(2);
}
const tok = new Tokenizer(JSON.parse(fs.readFileSync(tokenizerFile, 'utf8')), {});
const config = JSON.parse(fs.readFileSync(configFile, 'utf8'));
const vars = specialTokens(config);
for (let j = 0; j < jobs.length; j += 2) {
    const source = jobs[j + 1] === '-' ? config : JSON.parse(fs.readFileSync(jobs[j + 1], 'utf8'));
    fs.writeFileSync(jobs[j], render(new Template(chatTemplate(source)), vars, conversationsFile));
}
