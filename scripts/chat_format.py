"""chat_format.json: a chat template as plain pieces of text, for renderers without Jinja (the trainer's -chat).

A conversation renders as
  prefix_with_system + the system message's content + roles.system[1]   when its first message is a system one,
  prefix                                                                otherwise,
then every other message as roles[role][0] + content + roles[role][1], then generation_prompt; a reply ends at
end_of_turn. The pieces come from renderings of probe conversations whose contents are sentinels:
  generation_prompt   what add_generation_prompt adds after [user];
  roles.user[1]       what follows the last user message's content before the generation prompt;
  roles.assistant[0]  what lies between a user's content and the next assistant's, less roles.user[1];
  roles.assistant[1]  what the template writes after an assistant's content when it is the last message, if
                      the next user turn follows that; else the closing text (chat_data.py) of the turn;
  roles.user[0]       the rest of what lies between an assistant's content and the next user's;
  prefix              what precedes the first user's content, less roles.user[0];
  prefix_with_system  what precedes a first system message's content; roles.system[1] what follows it, less
                      roles.user[0]; roles.system[0] what the template writes before a later system message;
  end_of_turn         the closing text of an assistant turn (chat_data.py).
The pieces are then checked: rendering probe conversations (with and without a system message, one to three
user messages, other sentinels) piece by piece must give the template's own text with the generation prompt,
which is what -chat renders. A template for which that fails gets no chat_format.json.
"""
import chat_data
import chat_template

VERSION = 1


class NoFormat(Exception):
    """The template cannot be written as pieces; the message says why."""


def split_at(text, marks):
    """text cut at each of the marks (which must each occur once, in order): the pieces between them."""
    pieces, at = [], 0
    for m in marks:
        if text.count(m) != 1 or text.index(m) < at:
            raise NoFormat('it does not write each message\'s content once, in order')
        i = text.index(m)
        pieces.append(text[at:i])
        at = i + len(m)
    return pieces + [text[at:]]


def strip_suffix(text, suffix, what):
    if not text.endswith(suffix):
        raise NoFormat(f'{what} does not end as the other renderings say it should')
    return text[:len(text) - len(suffix)]


def strip_prefix(text, prefix, what):
    if not text.startswith(prefix):
        raise NoFormat(f'{what} does not begin as the other renderings say it should')
    return text[len(prefix):]


def render(template, messages, add_generation_prompt=False):
    try:
        return template.render(messages, add_generation_prompt)
    except chat_template.RenderError as e:
        raise NoFormat(f'it refuses a probe conversation: {e}')


def msg(role, content):
    return {'role': role, 'content': content}


def derive(template, specials):
    """The pieces ({role: [before, after]} and the rest); `specials`: the tokenizer's special token strings."""
    s, u1, a1, u2 = '\ue000S\ue001', '\ue000U1\ue001', '\ue000A1\ue001', '\ue000U2\ue001'
    alone = render(template, [msg('user', u1)])
    opened = render(template, [msg('user', u1)], True)
    generation_prompt = strip_prefix(opened, alone, 'the generation prompt rendering')
    turns = [msg('user', u1), msg('assistant', a1), msg('user', u2)]
    head, user_assistant, assistant_user, tail = split_at(render(template, turns, True), [u1, a1, u2])
    user_after = strip_suffix(tail, generation_prompt, 'the text after the last user message')
    assistant_before = strip_prefix(user_assistant, user_after, 'the text between a user and an assistant message')
    last = split_at(render(template, turns[:2]), [u1, a1])[2]
    end_of_turn = chat_data.cut_after_special(chat_data.common_prefix([last, assistant_user]), specials)
    assistant_after = last if last and assistant_user.startswith(last) else end_of_turn
    user_before = assistant_user[len(assistant_after):]
    prefix = strip_suffix(head, user_before, 'the text before the first user message')
    with_system = [msg('system', s)] + turns
    prefix_with_system, system_user = split_at(render(template, with_system, True), [s, u1])[:2]
    system_after = strip_suffix(system_user, user_before, 'the text after the system message')
    system_before = later_system_before(template, turns, assistant_after, prefix, prefix_with_system)
    if not end_of_turn:
        raise NoFormat('an assistant turn has no closing text to stop a reply at')
    return {'version': VERSION, 'template_sha256': template.sha256, 'prefix': prefix,
            'prefix_with_system': prefix_with_system,
            'roles': {'system': [system_before, system_after], 'user': [user_before, user_after],
                      'assistant': [assistant_before, assistant_after]},
            'generation_prompt': generation_prompt, 'end_of_turn': end_of_turn}


def later_system_before(template, turns, assistant_after, prefix, prefix_with_system):
    """What the template writes before a system message that is not the first; a template that refuses one
    gets the part of prefix_with_system past prefix (or all of it)."""
    s = '\ue000S2\ue001'
    try:
        text = template.render(turns[:2] + [msg('system', s)] + turns[2:], True)
        between = split_at(text, [turns[1]['content'], s])[1]
        return strip_prefix(between, assistant_after, 'the text before a later system message')
    except (chat_template.RenderError, NoFormat):
        return prefix_with_system[len(prefix):] if prefix_with_system.startswith(prefix) else prefix_with_system


def render_pieces(fmt, messages):
    roles = fmt['roles']
    first = messages[0]['role'] == 'system'
    text = fmt['prefix_with_system'] + messages[0]['content'] + roles['system'][1] if first else fmt['prefix']
    for m in messages[first:]:
        text += roles[m['role']][0] + m['content'] + roles[m['role']][1]
    return text + fmt['generation_prompt']


def check(template, fmt):
    """The pieces must render what the template renders, for conversations that end with a user's message."""
    u = [msg('user', 'Hello, who are you?'), msg('assistant', 'An assistant.\nAsk away.'),
         msg('user', 'What is 2 + 2?'), msg('assistant', '4'), msg('user', 'Thanks!')]
    system = msg('system', 'You are terse.')
    for messages in (u[:1], u[:3], u, [system] + u[:1], [system] + u):
        if render_pieces(fmt, messages) != render(template, messages, True):
            roles = ', '.join(m['role'] for m in messages)
            raise NoFormat(f'rendering [{roles}] piece by piece does not give the template\'s text')


def chat_format(template, specials):
    """(the chat_format.json object, None), or (None, why the template cannot be written as pieces)."""
    try:
        fmt = derive(template, specials)
        check(template, fmt)
        return fmt, None
    except NoFormat as e:
        return None, str(e)
