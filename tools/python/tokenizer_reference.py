#!/usr/bin/env python3
"""Reference tokenizations for Ferry's tokenizer tests, from implementations no one here wrote.

  tokenizer_reference.py corpus N SEED                 a JSON array of N varied test strings
  tokenizer_reference.py gguf-to-json GGUF             an HF tokenizer.json for a GGUF vocabulary
  tokenizer_reference.py hf TOKENIZER_JSON CORPUS      HF `tokenizers` ids + decoded text
  tokenizer_reference.py llama GGUF CORPUS             llama.cpp (llama-cpp-python) ids + text
  tokenizer_reference.py bench-corpus MB SEED          documents of ~8 KiB, MB megabytes in all
  tokenizer_reference.py hf-bench TOKENIZER_JSON CORPUS   HF encode_batch/decode_batch speed
                                                          (threads: RAYON_NUM_THREADS)

Expected outputs are JSON arrays of {"ids": [...], "text": "..."}; strings are encoded with
special tokens recognised (HF's default; llama.cpp's special=True) and without BOS/EOS.
"""
import json
import random
import sys

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|eot_id|>",
            "<|begin_of_text|>", "<s>", "</s>", "<repo_name>", "<file_sep>"]

WORDS = ["the", "The", "THE", "hello", "world", "don't", "it's", "we'll", "they're", "I'm",
         "you've", "he'd", "naïve", "café", "résumé", "Straße", "über", "añadir", "ﬁne",
         "tokenizer", "Tokenization", "x", "a", "I", "OK", "iPhone", "e-mail", "co-operate",
         "U.S.A.", "v1.2.3", "foo_bar", "fooBar", "FooBar", "__init__", "0x1F", "3.14159",
         "1,000,000", "2026-11-29", "12:34:56", "$100", "100%", "#hashtag", "@user",
         "https://example.com/a?b=c&d=e", "user@example.com"]

CODE = ["def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
        "if x == 1 and y != 2:\n        pass", "const x = () => { return [1, 2, 3]; };",
        "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); }", "SELECT * FROM t WHERE a >= 10;",
        "    \n\n    \t\t", "<div class=\"x\">&amp;&lt;</div>", "a->b; c::d; e ?: f; g ?? h",
        "   indented\n      more\n   back", "x+=1;y-=2;z*=3;w/=4;", "'''docstring'''", "```python\nprint(1)\n```"]

SCRIPTS = [
    "日本語のテキストです。", "中文分词测试，你好世界！", "한국어 텍스트 예시입니다.",
    "Привет, мир! Съешь же ещё этих мягких булок.", "Γειά σου Κόσμε", "مرحبا بالعالم",
    "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Xin chào thế giới", "ሰላም ልዑል",
    "e\u0301 a\u0300 o\u0308 n\u0303", "\u0915\u094d\u0937", "Z\u0351\u036b\u0343\u036a\u0302\u036b",
    "😀😃😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵", "∑∫∂√∞≠≈ ⟨ψ|φ⟩", "①②③ Ⅳ Ⅻ ½ ¾ ²³",
    "٠١٢٣٤٥٦٧٨٩", "０１２３４５", "ｆｕｌｌｗｉｄｔｈ", "\u200b\u200c\u200d\ufeff", "\u00a0\u2003\u3000",
    "\u202eevil\u202c", "ﬀ ﬃ ﬆ", "Ǆ ǅ ǆ İ ı ẞ",
]

WHITESPACE = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t \t", "\u00a0", "\u3000",
              "        ", "\n\n\n\n", " \t\n\r\x0b\x0c"]


def random_string(rng):
    kind = rng.random()
    parts = []
    n = rng.randint(1, 12)
    for _ in range(n):
        r = rng.random()
        if r < 0.30:
            parts.append(rng.choice(WORDS))
        elif r < 0.42:
            parts.append(rng.choice(CODE))
        elif r < 0.60:
            parts.append(rng.choice(SCRIPTS))
        elif r < 0.72:
            parts.append(rng.choice(WHITESPACE))
        elif r < 0.80:
            parts.append("".join(rng.choice("0123456789") for _ in range(rng.randint(1, 20))))
        elif r < 0.86:
            parts.append(rng.choice(SPECIALS))
        elif r < 0.93:
            parts.append("".join(chr(rng.randint(0x20, 0x7e)) for _ in range(rng.randint(1, 10))))
        else:
            # Random code points from the whole range (no surrogates).
            cps = []
            for _ in range(rng.randint(1, 6)):
                cp = rng.randint(1, 0x10FFFF)
                if 0xD800 <= cp <= 0xDFFF:
                    cp = 0x4E00
                cps.append(chr(cp))
            parts.append("".join(cps))
        if kind < 0.5 and rng.random() < 0.6:
            parts.append(" ")
    return "".join(parts)


def corpus(count, seed):
    rng = random.Random(seed)
    out = ["", " ", "a", "Hello, world!", "  leading", "trailing  ", "\n", "<|im_start|>user\nhi<|im_end|>"]
    out += SCRIPTS + CODE + WORDS + WHITESPACE + SPECIALS
    while len(out) < count:
        out.append(random_string(rng))
    json.dump(out[:count], sys.stdout, ensure_ascii=False)


def gguf_to_json(path):
    from gguf import GGUFReader
    r = GGUFReader(path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def ints(key):
        f = r.fields[key]
        return [int(f.parts[i][0]) for i in f.data]

    model = bytes(r.fields["tokenizer.ggml.model"].parts[-1]).decode()
    pre = bytes(r.fields["tokenizer.ggml.pre"].parts[-1]).decode()
    if model != "gpt2" or pre not in ("smollm", "starcoder", "gpt2", "gpt-2"):
        sys.exit(f"gguf-to-json: only gpt2 vocabularies with smollm/starcoder/gpt2 pre-tokenizers "
                 f"are converted (got {model}/{pre})")
    tokens, types, merges = strings("tokenizer.ggml.tokens"), ints("tokenizer.ggml.token_type"), \
        strings("tokenizer.ggml.merges")
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    pre_tok = byte_level if pre in ("gpt2", "gpt-2") else {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level]}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[i] == 3}
             for i, t in enumerate(tokens) if types[i] in (3, 4)]
    doc = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": pre_tok,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": merges},
    }
    json.dump(doc, sys.stdout, ensure_ascii=False)


def hf(tokenizer_json, corpus_path):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_json)
    texts = json.load(open(corpus_path))
    encodings = tok.encode_batch(texts, add_special_tokens=False)
    out = []
    for enc in encodings:
        out.append({"ids": enc.ids, "text": tok.decode(enc.ids, skip_special_tokens=False)})
    json.dump(out, sys.stdout, ensure_ascii=False)


def llama(gguf_path, corpus_path):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=gguf_path, vocab_only=True, verbose=False)
    texts = json.load(open(corpus_path))
    out = []
    for t in texts:
        ids = llm.tokenize(t.encode("utf-8"), add_bos=False, special=True) if t else []
        text = llm.detokenize(ids, special=True).decode("utf-8", errors="replace") if ids else ""
        out.append({"ids": ids, "text": text})
    json.dump(out, sys.stdout, ensure_ascii=False)


def bench_corpus(megabytes, seed):
    """Documents of ~8 KiB: 85% text found on every Debian machine with Python (the standard
    library's sources, license texts), 15% the varied generated strings of `corpus`."""
    import glob
    rng = random.Random(seed)
    target = megabytes * 1_000_000
    files = sorted(glob.glob("/usr/lib/python3.11/**/*.py", recursive=True))
    files += sorted(glob.glob("/usr/share/common-licenses/*"))
    rng.shuffle(files)
    docs, total = [], 0
    for path in files:
        if total >= target * 0.85:
            break
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError, IsADirectoryError):
            continue
        for i in range(0, len(text), 8192):
            docs.append(text[i:i + 8192])
            total += len(docs[-1].encode("utf-8"))
    while total < target:
        parts, size = [], 0
        while size < 8192:
            s = random_string(rng)
            parts.append(s)
            size += len(s.encode("utf-8")) + 1
        doc = "".join(p + ("\n" if rng.random() < 0.3 else " ") for p in parts)
        docs.append(doc)
        total += len(doc.encode("utf-8"))
    rng.shuffle(docs)
    json.dump(docs, sys.stdout, ensure_ascii=False)


def hf_bench(tokenizer_json, corpus_path):
    import time
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_json)
    docs = json.load(open(corpus_path))
    total_bytes = sum(len(d.encode("utf-8")) for d in docs)
    tok.encode_batch(docs[:8], add_special_tokens=False)  # warm up
    best = 1e30
    for _ in range(3):
        start = time.perf_counter()
        encodings = tok.encode_batch(docs, add_special_tokens=False)
        best = min(best, time.perf_counter() - start)
    ids = [e.ids for e in encodings]
    tokens = sum(len(i) for i in ids)
    start = time.perf_counter()
    tok.decode_batch(ids, skip_special_tokens=False)
    decode = time.perf_counter() - start
    print(json.dumps({"encode_mb_s": total_bytes / best / 1e6, "decode_tok_s": tokens / decode,
                      "tokens": tokens, "bytes": total_bytes}))


if __name__ == "__main__":
    cmd = sys.argv[1:2]
    if cmd == ["corpus"]:
        corpus(int(sys.argv[2]), int(sys.argv[3]))
    elif cmd == ["gguf-to-json"]:
        gguf_to_json(sys.argv[2])
    elif cmd == ["hf"]:
        hf(sys.argv[2], sys.argv[3])
    elif cmd == ["llama"]:
        llama(sys.argv[2], sys.argv[3])
    elif cmd == ["bench-corpus"]:
        bench_corpus(int(sys.argv[2]), int(sys.argv[3]))
    elif cmd == ["hf-bench"]:
        hf_bench(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
