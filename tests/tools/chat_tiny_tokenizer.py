#!/usr/bin/python3
"""A tiny tokenizer folder with a real chat template, for tests/system/t_chat_tokenize.sh.

  chat_tiny_tokenizer.py DIR TEMPLATE.json [--without TOKEN]
DIR/tokenizer.json: hf_tokenizer_files.py's tiny byte-level BPE plus the added tokens of Llama 3's and
ChatML's templates (special), and Qwen3's <think> and </think> (not special, as in Qwen3's own file), without
TOKEN when asked; DIR/tokenizer_config.json: TEMPLATE.json's chat_template with Llama 3's bos_token and
ChatML's eos_token.
"""
import argparse
import json
import os

import hf_tokenizer_files as files

SPECIAL = ['<|begin_of_text|>', '<|start_header_id|>', '<|end_header_id|>', '<|eot_id|>', '<|im_start|>',
           '<|im_end|>']
PLAIN = ['<think>', '</think>']


def main():
    p = argparse.ArgumentParser()
    p.add_argument('dir')
    p.add_argument('template')
    p.add_argument('--without', default=None)
    a = p.parse_args()
    tok = files.tiny()
    for content in SPECIAL + PLAIN:
        if content != a.without:
            token = files.added(len(tok['model']['vocab']) + len(tok['added_tokens']), content)
            token['special'] = content in SPECIAL
            tok['added_tokens'].append(token)
    with open(a.template, encoding='utf-8') as f:
        template = json.load(f)['chat_template']
    config = {'bos_token': '<|begin_of_text|>', 'eos_token': '<|im_end|>', 'chat_template': template}
    os.makedirs(a.dir, exist_ok=True)
    for name, obj in (('tokenizer.json', tok), ('tokenizer_config.json', config)):
        with open(os.path.join(a.dir, name), 'w', encoding='utf-8') as f:
            json.dump(obj, f, ensure_ascii=False)


if __name__ == '__main__':
    main()
