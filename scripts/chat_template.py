"""A model's chat template, rendered as Hugging Face transformers' apply_chat_template renders it.

The template is Jinja2 text: the "chat_template" of the tokenizer_config.json beside a tokenizer.json (a list of
named templates: the one named "default"), else the chat_template.jinja beside it, or a file given on its own.
It runs in the environment transformers gives it: Jinja2's ImmutableSandboxedEnvironment with trim_blocks and
lstrip_blocks, the loop controls extension (break, continue) and the {% generation %} tag (rendered as its
body), the raise_exception(message) and strftime_now(format) globals, and a tojson filter that is json.dumps
with ensure_ascii=False and the indent, separators and sort_keys arguments. A rendering gets `messages`,
`add_generation_prompt` and the tokenizer's special tokens (bos_token, eos_token, unk_token, sep_token,
pad_token, cls_token, mask_token, additional_special_tokens: those tokenizer_config.json sets, as strings, an
AddedToken's "content" for one written as an object); `tools` and `documents` are none.
"""
import datetime
import hashlib
import json
import os

import jinja2
import jinja2.ext
import jinja2.sandbox

SPECIAL_TOKEN_KEYS = ('bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token')


class TemplateProblem(Exception):
    """A template or tokenizer_config.json that cannot be used; its message names the file and the problem."""


class RenderError(Exception):
    """The template stopped while rendering a conversation. `refused` is true when the template itself raised
    (raise_exception): the message is then the template's own."""
    def __init__(self, message, refused):
        super().__init__(message)
        self.refused = refused


class GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}, which transformers' templates may use to mark what the assistant
    writes: rendered as its body, as transformers renders it."""
    tags = {'generation'}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(('name:endgeneration',), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method('_body'), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes <, >, & and ' for HTML; templates expect plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def environment():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters['tojson'] = tojson
    env.globals['raise_exception'] = raise_exception
    env.globals['strftime_now'] = strftime_now
    return env


def token_text(value):
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken object with "content"."""
    if isinstance(value, dict):
        value = value.get('content')
    return value if isinstance(value, str) else None


def special_token_variables(config):
    """The special tokens a template sees, by name, as transformers' special_tokens_map gives them (those set)."""
    found = {k: token_text(config.get(k)) for k in SPECIAL_TOKEN_KEYS}
    found = {k: v for k, v in found.items() if v is not None}
    extra = config.get('additional_special_tokens')
    if isinstance(extra, list):
        found['additional_special_tokens'] = [t for t in map(token_text, extra) if t is not None]
    return found


def declared_special_tokens(config):
    """Every token string tokenizer_config.json declares special: its special-token variables and the entries of
    added_tokens_decoder marked special."""
    found = set()
    for v in special_token_variables(config).values():
        found.update(v if isinstance(v, list) else [v])
    decoder = config.get('added_tokens_decoder')
    if isinstance(decoder, dict):
        found.update(t['content'] for t in decoder.values()
                     if isinstance(t, dict) and t.get('special') and isinstance(t.get('content'), str))
    return found


class ChatTemplate:
    """A compiled template with the variables it renders with. `text` is the template, `source` where it came
    from (for messages), `specials` the special token strings tokenizer_config.json declares."""
    def __init__(self, text, source, config):
        self.text, self.source = text, source
        self.sha256 = hashlib.sha256(text.encode('utf-8')).hexdigest()
        self.variables = special_token_variables(config)
        self.specials = declared_special_tokens(config)
        try:
            self.template = environment().from_string(text)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise TemplateProblem(f'{source}: the chat template is not valid Jinja (line {e.lineno}: {e.message})')

    def render(self, messages, add_generation_prompt=False):
        try:
            return self.template.render(messages=messages, tools=None, documents=None,
                                        add_generation_prompt=add_generation_prompt, **self.variables)
        except jinja2.exceptions.TemplateError as e:
            # raise_exception raises the base class; Jinja's own errors (undefined, security, syntax) subclass it.
            if type(e) is jinja2.exceptions.TemplateError:
                raise RenderError(str(e), refused=True)
            raise RenderError(f'{type(e).__name__}: {e}', refused=False)
        except Exception as e:   # a template's Python-level failure: a bad index, a type mismatch, ...
            raise RenderError(f'{type(e).__name__}: {e}', refused=False)


def read_json(path):
    try:
        with open(path, 'rb') as f:
            return json.loads(f.read())
    except OSError as e:
        raise TemplateProblem(f'{path}: {e.strerror}')
    except ValueError as e:
        raise TemplateProblem(f'{path}: not valid JSON ({e})')


def read_text(path):
    try:
        with open(path, 'rb') as f:
            return f.read().decode('utf-8')
    except OSError as e:
        raise TemplateProblem(f'{path}: {e.strerror}')
    except UnicodeDecodeError as e:
        raise TemplateProblem(f'{path}: not valid UTF-8 at byte {e.start}')


def pick_template(value, source):
    """A chat_template value: one template, or a list of named ones, of which transformers renders "default"."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, dict) for t in value):
        named = {t.get('name'): t.get('template') for t in value}
        if isinstance(named.get('default'), str):
            return named['default']
        names = ', '.join(repr(n) for n in named)
        raise TemplateProblem(f'{source}: chat_template is a list of templates ({names}) with no "default" one')
    raise TemplateProblem(f'{source}: chat_template is neither a string nor a list of named templates')


def template_file_text(path):
    """--chat-template FILE: Jinja text, or a JSON file (.json) whose "chat_template" holds it."""
    if not path.endswith('.json'):
        return read_text(path)
    obj = read_json(path)
    if not isinstance(obj, dict) or 'chat_template' not in obj:
        raise TemplateProblem(f'{path}: a .json chat template file needs a "chat_template" key')
    return pick_template(obj['chat_template'], path)


def load(tokenizer_path, template_path=None):
    """The chat template for the tokenizer.json at tokenizer_path (or the one in template_path), with the special
    tokens of the tokenizer_config.json beside it, if there is one."""
    folder = os.path.dirname(os.path.abspath(tokenizer_path))
    config_path = os.path.join(folder, 'tokenizer_config.json')
    config = read_json(config_path) if os.path.exists(config_path) else {}
    if not isinstance(config, dict):
        raise TemplateProblem(f'{config_path}: not a JSON object')
    if template_path:
        return ChatTemplate(template_file_text(template_path), template_path, config)
    if config.get('chat_template') is not None:
        return ChatTemplate(pick_template(config['chat_template'], config_path), config_path, config)
    jinja_path = os.path.join(folder, 'chat_template.jinja')
    if os.path.exists(jinja_path):
        return ChatTemplate(read_text(jinja_path), jinja_path, config)
    raise TemplateProblem(f'no chat template for {tokenizer_path}: {config_path} has no "chat_template" and there '
                          f'is no {jinja_path}; give one with --chat-template FILE')
