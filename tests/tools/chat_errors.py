#!/usr/bin/python3
"""Bad input to scripts/tokenize.py --chat (tests/system/t_chat_tokenize.sh): each case must end the run with
exit status 1 and one "error: ..." line naming the file, the line and the problem, and leave OUTDIR as it was
(no shard, mask, chat_format.json or private directory added or changed).

  chat_errors.py TOKENIZER_DIR TEMPLATES_DIR WORKDIR OUTDIR
TOKENIZER_DIR: chat_tiny_tokenizer.py's folder (Qwen3's template); TEMPLATES_DIR: tests/data/chat; OUTDIR holds
a set made with TOKENIZER_DIR's tokenizer. Prints one "ok NAME" or "FAIL NAME: why" line per case.
"""
import contextlib
import importlib.util
import io
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GOOD = '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}'


def load_tokenize():
    spec = importlib.util.spec_from_file_location('project_tokenize',   # not the standard library's tokenize
                                                  os.path.join(HERE, '..', '..', 'scripts', 'tokenize.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.ensure_helper()
    module.ensure_helper = lambda: None   # built now; a make run per call would be most of these cases' time
    return module


def snapshot(outdir):
    """Every file below outdir but the lock, with its contents."""
    found = {}
    for d, _, files in os.walk(outdir):
        for f in files:
            path = os.path.join(d, f)
            if f != '.tokenize.lock':
                with open(path, 'rb') as fh:
                    found[os.path.relpath(path, outdir)] = fh.read()
    return found


def cases(templates, work, tokdir):
    """(name, lines of the conversations file, extra arguments, the text the error must hold)."""
    msg = '{"messages": [%s]}'
    user, asst = '{"role": "user", "content": "%s"}', '{"role": "assistant", "content": "%s"}'
    alternating = ['--chat-template', os.path.join(templates, 'alternating.jinja')]
    broken = os.path.join(work, 'type_error.jinja')
    with open(broken, 'w') as f:
        f.write("{% for m in messages %}{{ m['content'] + loop.index }}{% endfor %}")
    twice = os.path.join(work, 'twice.jinja')
    with open(twice, 'w') as f:
        f.write("{% for m in messages %}<|im_start|>{{ m['content'] }}|{{ m['content'] }}<|im_end|>{% endfor %}")
    return [
        ('not_json', [GOOD, 'not json'], [], ':2: not JSON'),
        ('not_an_object', [GOOD, '[1, 2]'], [], ':2: not a JSON object with a non-empty "messages" list'),
        ('no_messages', [GOOD, '{"messages": []}'], [], ':2: not a JSON object with a non-empty "messages" list'),
        ('message_without_content', [GOOD, msg % '{"role": "user"}'], [], ':2: message 0 is not {"role": string'),
        ('content_not_a_string', [msg % '{"role": "user", "content": 3}'], [], ':1: message 0 is not {"role"'),
        ('message_with_other_key', [msg % '{"role": "user", "content": "x", "name": "n"}'], [],
         ':1: message 0 is not {"role": string, "content": string} (exactly these keys)'),
        ('lone_surrogate', [GOOD, msg % (user % '\\ud800' + ', ' + asst % 'b')], [], ':2: the conversation holds a '
         'lone surrogate U+D800'),
        ('unknown_role_refused', [GOOD, GOOD, msg % '{"role": "tool", "content": "x"}'], alternating,
         ':3: the chat template refuses the conversation: Only user and assistant roles are supported, not tool'),
        ('roles_refused', [msg % (asst % 'a' + ', ' + user % 'b')], alternating,
         ':1: the chat template refuses the conversation: Conversation roles must alternate'),
        ('template_fails', [GOOD], ['--chat-template', broken],
         ':1: the chat template failed on the conversation: TypeError: can only concatenate str'),
        ('no_consistent_span', [GOOD], ['--chat-template', twice],
         ':1: assistant message 1 has no consistent span in the rendering (the template writes its content 2 times)'),
        ('nothing_trained', [msg % (user % 'a'), msg % (user % 'b')], [],
         ': none of its 2 conversations has a trained token (--train-on assistant)'),
        ('val_fraction_takes_all', [GOOD, GOOD], ['--val-fraction', '0.9'],
         '--val-fraction 0.9 of 2 conversations leaves none for training'),
    ]


def run(tokenize, argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = tokenize.main(argv)
    return rc, err.getvalue()


def check(name, rc, err, want, before, after):
    lines = err.splitlines()
    if rc != 1 or len(lines) != 1 or not lines[0].startswith('error: ') or want not in lines[0]:
        return f'FAIL {name}: exit {rc}, stderr {err!r}; wanted one "error: ...{want}..." line'
    if before != after:
        changed = sorted(set(before) ^ set(after) | {k for k in before if after.get(k, before[k]) != before[k]})
        return f'FAIL {name}: the output directory changed: {changed}'
    return f'ok {name}'


def main(tokdir, templates, work, outdir):
    tokenize = load_tokenize()
    tokenizer = os.path.join(tokdir, 'tokenizer.json')
    for name, lines, extra, want in cases(templates, work, tokdir):
        path = os.path.join(work, f'{name}.jsonl')
        with open(path, 'w') as f:
            f.write('\n'.join(lines) + '\n')
        before = snapshot(outdir)
        rc, err = run(tokenize, ['--chat', path, '--tokenizer', tokenizer, '-o', outdir, '-q'] + extra)
        print(check(name, rc, err, path + want if want.startswith(':') else want, before, snapshot(outdir)))
    missing_special(tokenize, templates, work)


def missing_special(tokenize, templates, work):
    """A tokenizer.json without the template's <|im_end|>: refused at the first line that renders it, into an
    empty directory that stays without shards."""
    tokdir, outdir = os.path.join(work, 'no_im_end'), os.path.join(work, 'no_im_end_out')
    subprocess.run([sys.executable, os.path.join(HERE, 'chat_tiny_tokenizer.py'), tokdir,
                    os.path.join(templates, 'qwen3.json'), '--without', '<|im_end|>'], check=True)
    path = os.path.join(work, 'missing_special.jsonl')
    with open(path, 'w') as f:
        f.write(GOOD + '\n')
    rc, err = run(tokenize, ['--chat', path, '--tokenizer', os.path.join(tokdir, 'tokenizer.json'), '-o', outdir])
    left = sorted(f for f in os.listdir(outdir) if f not in ('.tokenize.lock', 'tokenizer.json'))
    want = f"{path}:1: the rendering holds '<|im_end|>', which the tokenizer does not have as one token"
    print(check('missing_special_token', rc, err, want, [], left))


if __name__ == '__main__':
    main(*sys.argv[1:])
