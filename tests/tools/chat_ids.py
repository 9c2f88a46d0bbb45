#!/usr/bin/python3
"""The ids scripts/tokenize.py --chat gives each conversation, for several templates with one tokenizer load:
rendered by scripts/chat_template.py and encoded by build/tokenizer (tokenize.py's encode_texts), as --chat
renders and encodes a conversation before masking it. For tests/system/t_chat_tokenize.sh, beside
tests/tools/chat_reference.js (same arguments, same output).

  chat_ids.py TOKENIZER.json CONFIG.json CONVERSATIONS.jsonl OUT.jsonl TEMPLATE [OUT TEMPLATE ...]
TEMPLATE: a --chat-template file, or "-" for the template of the tokenizer_config.json beside TOKENIZER.json
(CONFIG is chat_reference.js's and must be that file).
"""
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, '..', '..', 'scripts')


def load_tokenize():
    spec = importlib.util.spec_from_file_location('project_tokenize', os.path.join(SCRIPTS, 'tokenize.py'))
    module = importlib.util.module_from_spec(spec)   # not the standard library's tokenize
    spec.loader.exec_module(module)
    return module


def main(tokenizer, config, conversations, *jobs):
    if os.path.abspath(config) != os.path.join(os.path.dirname(os.path.abspath(tokenizer)), 'tokenizer_config.json'):
        sys.exit('error: CONFIG must be the tokenizer_config.json beside TOKENIZER.json')
    tokenize = load_tokenize()
    sys.path.append(SCRIPTS)
    import chat_template
    with open(conversations, encoding='utf-8') as f:
        numbered = [(i, json.loads(line)['messages']) for i, line in enumerate(f, 1) if line.strip()]
    texts = []
    for template in jobs[1::2]:
        t = chat_template.load(tokenizer, None if template == '-' else template)
        texts += [t.render(messages).encode('utf-8') for _, messages in numbered]
    ids, _ = tokenize.encode_texts(texts, tokenizer)
    for j, out in enumerate(jobs[0::2]):
        with open(out, 'w') as f:
            for k, (line, _) in enumerate(numbered):
                f.write(json.dumps({'line': line, 'ids': ids[j * len(numbered) + k]}) + '\n')


if __name__ == '__main__':
    main(*sys.argv[1:])
