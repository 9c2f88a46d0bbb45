"""Made-up conversations with something to learn, for the fine-tuning tests: a country's capital, after a
system message every third conversation, with a second turn every --thanks-every'th. Writes the
conversations as tokenize.py --chat reads them, every message's text one per line (to learn a tokenizer
from), and with --llama3-config Llama 3 Instruct's tokenizer_config.json (its template, <|eot_id|> ending a
turn) for a tokenizer folder.

Usage: capital_chats.py CHATS.jsonl TEXT.txt [-n N] [--countries K] [--thanks-every M] [--llama3-config OUT]
"""
import argparse
import json
import random

CAPITALS = [("France", "Paris"), ("Spain", "Madrid"), ("Italy", "Rome"), ("Japan", "Tokyo"), ("Egypt", "Cairo"),
            ("Peru", "Lima"), ("Kenya", "Nairobi"), ("Chile", "Santiago"), ("Norway", "Oslo"), ("Greece", "Athens")]
TEMPLATE = "tests/data/chat/llama3_instruct.json"


def conversation(i, capitals, thanks_every):
    country = random.choice(sorted(capitals))
    m = [{"role": "system", "content": "You answer in one sentence."}] if i % 3 == 0 else []
    m += [{"role": "user", "content": "What is the capital of %s?" % country},
          {"role": "assistant", "content": "The capital of %s is %s." % (country, capitals[country])}]
    if thanks_every and i % thanks_every == 0:
        m += [{"role": "user", "content": "Thank you."}, {"role": "assistant", "content": "You are welcome."}]
    return m


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("chats")
    p.add_argument("text")
    p.add_argument("-n", type=int, default=60)
    p.add_argument("--countries", type=int, default=len(CAPITALS))
    p.add_argument("--thanks-every", type=int, default=0)
    p.add_argument("--llama3-config")
    a = p.parse_args()
    random.seed(7)
    capitals = dict(CAPITALS[:a.countries])
    with open(a.chats, "w", encoding="utf-8") as f, open(a.text, "w", encoding="utf-8") as text:
        for i in range(a.n):
            m = conversation(i, capitals, a.thanks_every)
            f.write(json.dumps({"messages": m}) + "\n")
            text.write("\n".join(x["content"] for x in m) + "\n")
    if a.llama3_config:
        cfg = json.load(open(TEMPLATE, encoding="utf-8"))
        cfg.update(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
        json.dump(cfg, open(a.llama3_config, "w", encoding="utf-8"), indent=1)


if __name__ == "__main__":
    main()
