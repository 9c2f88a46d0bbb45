"""Conversations -> the text a chat template renders for each, and the loss mask of its tokens.

A conversation is one JSONL line, {"messages": [{"role": ..., "content": ...}, ...]} (other top-level keys are
ignored; a message has exactly those two keys, both strings). It renders with its chat template
(chat_template.py) as one document; the template supplies any BOS.

Which tokens are trained (--train-on):
  assistant       every assistant turn's tokens;
  last-assistant  the last assistant turn's tokens;
  all             every token.
A document's first token is never trained (nothing predicts it). An assistant turn's tokens are found by
rendering, never by looking for role names in the text:
  start    where the rendering of the messages before it with the generation prompt ends
           (render(messages[:k], add_generation_prompt=True)), so the header that opens the turn is not trained;
           when that is not a prefix of the whole rendering (a template that renders an earlier turn differently
           once more follows, as Qwen3's does for two assistant turns in a row), the end of the last generation
           prompt before the turn's content;
  content  rendering the whole conversation again with the turn's content replaced by a sentinel shows what the
           template puts before and after the content (whatever it does with the content: trim it, move a
           reasoning block);
  end      after the content, the closing text: what follows the content in every context the turn can be in
           (as it is, as the last message, followed by a user's message), up to and including its first
           special token when it holds one (Llama 3's <|eot_id|>, ChatML's <|im_end|>).
Text the template inserts between the turn's start and its content whatever the content is (Qwen3's empty
"<think>\\n\\n</think>\\n\\n" in the turns after the last user message) is not trained, unless
train_empty_think. A token belongs to the turn when its first byte does. No consistent turn (its content
rendered twice, an end before its start, ...) is an error naming the line and the turn.
"""
import functools
import json
import re
import unicodedata

import numpy as np

import chat_template

TRAINED, DOC_START = 1, 2
TRAIN_ON = ('assistant', 'last-assistant', 'all')


class ChatError(Exception):
    """Bad input: the message names the file, the line and the problem."""


# ---------- conversations ----------

def read_conversations(path):
    """Yields (line number, messages, bytes read since the last one) for each non-blank line of the JSONL file."""
    try:
        f = open(path, 'rb')
    except OSError as e:
        raise ChatError(f'{path}: {e.strerror}')
    with f:
        skipped = 0
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                skipped += len(line)
                continue
            yield lineno, parse_conversation(line, f'{path}:{lineno}'), skipped + len(line)
            skipped = 0


def parse_conversation(line, where):
    try:
        obj = json.loads(line)
    except UnicodeDecodeError as e:
        raise ChatError(f'{where}: not valid UTF-8 at byte {e.start} of the line')
    except ValueError as e:
        raise ChatError(f'{where}: not JSON ({e})')
    messages = obj.get('messages') if isinstance(obj, dict) else None
    if not isinstance(messages, list) or not messages:
        raise ChatError(f'{where}: not a JSON object with a non-empty "messages" list')
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and m.keys() == {'role', 'content'} and isinstance(m['role'], str)
                and isinstance(m['content'], str)):
            raise ChatError(f'{where}: message {i} is not {{"role": string, "content": string}} (exactly these keys)')
    return messages


# ---------- the tokenizer's token lengths ----------

class TokenTable:
    """What masking needs of a tokenizer.json (byte-level BPE, which build/tokenizer has accepted): each id's
    length in bytes (`lengths`: a vocabulary token is written one character per byte, in ByteLevel's alphabet;
    an added token is its content's UTF-8), the added tokens' strings (`added`), the special ones among them
    (`special`) and whether it normalizes text to NFC (`nfc`)."""
    def __init__(self, data, path):
        try:
            obj = json.loads(data)
            vocab, added = obj['model']['vocab'], obj['added_tokens']
            lengths = {i: len(s) for s, i in vocab.items()}
            lengths.update({t['id']: len(t['content'].encode('utf-8')) for t in added})
            self.added = {t['content'] for t in added}
            self.special = tuple(sorted(t['content'] for t in added if t.get('special')))
            self.nfc = normalizes_to_nfc(obj.get('normalizer'))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ChatError(f'{path}: not a tokenizer.json with model.vocab and added_tokens')
        self.lengths = np.zeros(max(lengths) + 1, dtype=np.int64)
        self.lengths[list(lengths)] = list(lengths.values())


def normalizes_to_nfc(normalizer):
    """build/tokenizer accepts no normalizer, NFC, or a Sequence of NFC."""
    if normalizer is None:
        return False
    steps = normalizer['normalizers'] if normalizer.get('type') == 'Sequence' else [normalizer]
    return any(n.get('type') == 'NFC' for n in steps)


# ---------- rendering a conversation into its trained spans ----------

def sentinel(text, tag):
    """A content string that appears nowhere in `text` and that no template trims or splits."""
    n = 0
    while f'\ue000{tag}{n}\ue001' in text:
        n += 1
    return f'\ue000{tag}{n}\ue001'


def common_prefix(texts):
    first = texts[0]
    n = len(first)
    for t in texts[1:]:
        n = min(n, len(t))
        while not t.startswith(first[:n]):
            n -= 1
    return first[:n]


class Conversation:
    """A rendered conversation: its UTF-8 text (as the tokens spell it: NFC when the tokenizer normalizes to
    it) and the byte spans whose tokens are trained (`trained`) and then untrained again (`untrained`)."""
    def __init__(self, where, data, trained, untrained):
        self.where, self.data, self.trained, self.untrained = where, data, trained, untrained


class Masker:
    def __init__(self, template, table, train_on='assistant', train_empty_think=False):
        self.template, self.table = template, table
        self.train_on, self.train_empty_think = train_on, train_empty_think
        self.generation_prompt = self.probe_generation_prompt()
        self.missing = sorted(s for s in template.specials | self.template_specials() if s not in table.added)

    def probe_generation_prompt(self):
        try:
            u = [{'role': 'user', 'content': sentinel('', 'u')}]
            plain, opened = self.template.render(u), self.template.render(u, add_generation_prompt=True)
        except chat_template.RenderError:
            return ''
        return opened[len(plain):] if opened.startswith(plain) else ''

    def template_specials(self):
        """The <|...|> strings the template writes itself (around sentinel contents), which must be tokens."""
        probe = [{'role': 'system', 'content': 's'}, {'role': 'user', 'content': 'u'},
                 {'role': 'assistant', 'content': 'a'}]
        for messages in (probe, probe[1:]):
            try:
                return set(re.findall(r'<\|[^<>|\s]{1,64}\|>', self.template.render(messages, True)))
            except chat_template.RenderError:
                continue
        return set()

    def render(self, messages, where):
        """The conversation's Conversation, or a ChatError naming `where` (file:line)."""
        text = self.render_or_fail(messages, False, where)
        for s in self.missing:
            if s in text:
                raise ChatError(f'{where}: the rendering holds {s!r}, which the tokenizer does not have as one token '
                                '(its tokenizer.json lacks the template\'s special tokens)')
        if self.train_on == 'all':
            spans, untrained = [(0, len(text))], []
        else:
            turns = [k for k, m in enumerate(messages) if m['role'] == 'assistant']
            if self.train_on == 'last-assistant':
                turns = turns[-1:]
            spans, untrained = [], []
            for k in turns:
                span, inserted = self.assistant_span(messages, k, text, where)
                spans.append(span)
                if inserted and not self.train_empty_think:
                    untrained.append(inserted)
        return self.to_bytes(text, spans, untrained, where)

    def render_or_fail(self, messages, add_generation_prompt, where):
        try:
            return self.template.render(messages, add_generation_prompt)
        except chat_template.RenderError as e:
            if e.refused:
                raise ChatError(f'{where}: the chat template refuses the conversation: {e}')
            raise ChatError(f'{where}: the chat template failed on the conversation: {e}')

    def assistant_span(self, messages, k, text, where):
        """(start, end) of assistant turn k in text, and the span of what the template inserts before its content
        (None when nothing)."""
        def inconsistent(why):
            return ChatError(f'{where}: assistant message {k} has no consistent span in the rendering ({why})')
        mark = sentinel(text, 'a')
        marked = messages[:k] + [{'role': 'assistant', 'content': mark}] + messages[k + 1:]
        probe = self.render_or_fail(marked, False, where)
        if probe.count(mark) != 1:
            raise inconsistent(f'the template writes its content {probe.count(mark)} times')
        i = probe.index(mark)
        before, after = probe[:i], probe[i + len(mark):]
        content_end = len(text) - len(after)
        if not text.endswith(after) or content_end < 0:
            raise inconsistent('the text after its content changes with the content')
        start = self.turn_start(messages, k, text, before)
        if start is None or start > content_end:
            raise inconsistent('its start is not where the generation prompt before it ends')
        inserted = None
        if text.startswith(before) and start < len(before) <= content_end:
            inserted = (start, len(before))
        return (start, content_end + len(self.closing(marked, k, mark, after))), inserted

    def turn_start(self, messages, k, text, before):
        try:
            opened = self.template.render(messages[:k], add_generation_prompt=True)
            if text.startswith(opened) and before.startswith(opened):
                return len(opened)
        except chat_template.RenderError:
            pass
        g = self.generation_prompt
        j = before.rfind(g) + len(g) if g and g in before else -1
        return j if j >= 0 and text.startswith(before[:j]) else None

    def closing(self, marked, k, mark, after):
        """What closes assistant turn k: the text after its content in every context it can be in, cut after its
        first special token."""
        contexts = [after]
        follow = sentinel(after, 'u')
        last = [] if k == len(marked) - 1 else [marked[:k + 1]]   # as the last message (`after` already is)
        for messages in last + [marked[:k + 1] + [{'role': 'user', 'content': follow}]]:
            try:
                probe = self.template.render(messages)
            except chat_template.RenderError:
                continue
            if probe.count(mark) == 1:
                contexts.append(probe[probe.index(mark) + len(mark):])
        return cut_after_special(common_prefix(contexts), self.table.special)

    def to_bytes(self, text, spans, untrained, where):
        """The Conversation: spans as byte offsets into the text the tokens spell."""
        try:
            data = text.encode('utf-8')
        except UnicodeEncodeError as e:
            raise ChatError(f'{where}: the conversation holds a lone surrogate U+{ord(e.object[e.start]):04X}, '
                            'which is not valid Unicode')
        if self.table.nfc and not unicodedata.is_normalized('NFC', text):
            return nfc_conversation(text, spans, untrained, where)
        offset = functools.lru_cache(None)(lambda c: len(text[:c].encode('utf-8')))
        to_b = lambda s: [(offset(a), offset(b)) for a, b in s]   # noqa: E731
        return Conversation(where, data, to_b(spans), to_b(untrained))

    def mask(self, conv, data, width):
        """The mask of the conversation's tokens (`data`: little-endian ids of `width` bytes) as a uint8 array, or
        None when no token is trained."""
        ids = np.frombuffer(data, '<u2' if width == 2 else '<u4')
        if len(ids) == 0:
            return None
        ends = np.cumsum(self.table.lengths[ids])
        if ends[-1] != len(conv.data):
            raise ChatError(f'{conv.where}: its {len(ids)} tokens spell {ends[-1]} bytes, the rendering has '
                            f'{len(conv.data)}')
        starts = ends - self.table.lengths[ids]
        mask = np.zeros(len(ids), dtype=np.uint8)
        for value, spans in ((TRAINED, conv.trained), (0, conv.untrained)):
            for a, b in spans:
                mask[np.searchsorted(starts, a):np.searchsorted(starts, b)] = value
        mask[0] = DOC_START
        return mask if (mask & TRAINED).any() else None


@functools.lru_cache(maxsize=64)
def cut_after_special(closing, specials):
    hits = [(closing.find(s), s) for s in specials if s in closing]
    if not hits:
        return closing
    at, s = min(hits, key=lambda h: (h[0], -len(h[1])))
    return closing[:at + len(s)]


def nfc_conversation(text, spans, untrained, where):
    """The tokenizer encodes text in NFC: its bytes, and each span boundary where its NFC form puts it (a
    boundary inside a sequence that NFC composes has no such place: an error)."""
    whole = unicodedata.normalize('NFC', text)

    def offset(c):
        head = unicodedata.normalize('NFC', text[:c])
        if not whole.startswith(head):
            raise ChatError(f'{where}: a turn boundary falls inside characters that NFC normalization joins')
        return len(head.encode('utf-8'))
    to_b = lambda s: [(offset(a), offset(b)) for a, b in s]   # noqa: E731
    return Conversation(where, whole.encode('utf-8'), to_b(spans), to_b(untrained))
