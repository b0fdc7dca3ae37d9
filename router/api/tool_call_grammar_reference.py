"""Tool-call grammars (tool_call_grammar.h) replayed through llguidance.

tool_call_grammar_test, run with FERRY_TOOL_CALL_CASES=FILE, appends every grammar it built, the
text it fed and Ferry's matcher's verdict as JSON lines. Here llguidance (gbnf_to_lark, then its
matcher over a 256-byte vocabulary) reads each grammar and must give every text the same
verdict: an independent check that the grammar text is GBNF as llama.cpp's dialect means it and
that the texts the test expects accepted (and refused) are.

  tool_call_grammar_reference.py CASES.jsonl
"""
import json
import sys

import llguidance as llg
from llguidance import gbnf_to_lark as gbnf_to_lark_module
from llguidance.gbnf_to_lark import gbnf_to_lark

# As json_schema_reference.py: gbnf_to_lark prints a repetition of a repetition without
# parentheses, which its own Lark reader refuses; in parentheses it is the same grammar.
gbnf_to_lark_module.RepetitionNode.is_atomic = lambda self: False


class ByteTokenizer:
    def __init__(self):
        self.eos_token_id = 256
        self.bos_token_id = None
        self.tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
        self.special_token_ids = [256]

    def __call__(self, s):
        return list(s.encode() if isinstance(s, str) else s)


TOKENIZER = llg.LLTokenizer(llg.TokenizerWrapper(ByteTokenizer()), slices=[])


def accepts(grammar, text):
    m = llg.LLMatcher(TOKENIZER, grammar, log_level=0)
    if m.is_error():
        raise AssertionError(f"llguidance rejects the grammar: {m.get_error()}")
    for b in text.encode():
        if not m.consume_token(b):
            return False
    return m.is_accepting()


def main():
    grammars = {}
    failures = 0
    cases = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
    for case in cases:
        gbnf = case["gbnf"]
        if gbnf not in grammars:
            grammars[gbnf] = llg.grammar_from("lark", gbnf_to_lark(gbnf))
        got = accepts(grammars[gbnf], case["text"])
        if got != case["accepted"]:
            failures += 1
            print(f"DIFFERENT: Ferry {case['accepted']}, llguidance {got}: {case['text']!r}")
    accepted = sum(c["accepted"] for c in cases)
    print(f"{len(cases)} texts ({accepted} accepted, {len(cases) - accepted} refused) on "
          f"{len(grammars)} grammars; {failures} different")
    sys.exit(1 if failures or not cases else 0)


if __name__ == "__main__":
    main()
