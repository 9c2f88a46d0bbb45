#!/usr/bin/python3
"""Made-up conversations for measuring tokenize.py --chat: chat_bench_data.py N [SEED] > FILE.jsonl

Each: a system message in every third, then one to three user/assistant exchanges of random common English
words (5-30 words a question, one to four sentences of 5-20 words an answer).
"""
import json
import random
import sys

WORDS = ('the of and to in is you that it he was for on are as with his they I at be this have from or one had '
         'by word but not what all were we when your can said there use an each which she do how their if will up '
         'other about out many then them these so some her would make like him into time has look two more write '
         'go see number no way could people my than first water been call who oil its now find long down day did '
         'get come made may part').split()


def sentence(rng, n):
    return ' '.join(rng.choice(WORDS) for _ in range(n)).capitalize() + '.'


def conversation(rng, i):
    messages = [{'role': 'system', 'content': sentence(rng, 8)}] if i % 3 == 0 else []
    for _ in range(rng.randint(1, 3)):
        answer = ' '.join(sentence(rng, rng.randint(5, 20)) for _ in range(rng.randint(1, 4)))
        messages += [{'role': 'user', 'content': sentence(rng, rng.randint(5, 30))},
                     {'role': 'assistant', 'content': answer}]
    return {'messages': messages}


def main(n, seed=1):
    rng = random.Random(int(seed))
    for i in range(int(n)):
        sys.stdout.write(json.dumps(conversation(rng, i)) + '\n')


if __name__ == '__main__':
    main(*sys.argv[1:])
