"""ferry bench grammar: structured output's cost, against llguidance in the same run.

1. Mask time per token on SmolLM2's vocabulary (49,152 tokens, from FERRY_MODEL_GGUF): for each
   schema of engine/testdata/grammar_validity_schemas.json (the validity test's ten: formats
   date/uuid/email, enums, nested objects, bounded arrays, string lengths, integer ranges,
   prefixItems with $defs) and its documents below (canonical compact JSON, tokenized by
   llguidance's tokenizer), the time of one mask after every prefix of every document:
     Ferry       grammar_mask_tool bench: the schema compiled to GBNF (to_gbnf), one
                 TokenMatcher per document sharing the grammar's MaskCache, REPEAT passes; the
                 first pass is cold (cache entries made as met), the rest warm (a grammar
                 served before: the steady state), the figure is the warm passes';
     llguidance  grammar_reference.py bench-schema: llguidance 1.9.1's own JSON Schema compiler
                 under JSON_OPTIONS (Ferry's policies: compact, schema order), one LLMatcher per
                 schema reset for each document, so the lexer states it built in pass 1 (cold)
                 serve the later passes (warm, the figure), as Ferry's cache does; called from
                 Python (compute_bitmask into a new bytes object: the call's overhead, about
                 1 us, is included).
   Times pooled over all schemas; p50 and p99.
2. Decode throughput at batch 16 on SmolLM2 in process (grammar_decode_bench): constrained by a
   JSON Schema vs free, rounds alternating, medians.

Goals: mask p99 <= llguidance's p99; constrained >= 0.95x free. The last line is JSON.

  grammar_bench.py MASK_TOOL TO_GBNF DECODE_BENCH REFERENCE TOKENIZER_REFERENCE SCHEMAS
                   [--repeat N] [--rounds N]
(run with $FERRY_GRAMMAR_PYTHON; needs FERRY_REF_PYTHON and FERRY_MODEL_GGUF)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

# Canonical documents per schema (keys in the schema's order, no whitespace).
DOCS = {
    "task": [{"status": "active", "priority": 3}, {"status": "pending", "priority": 1,
              "blocked": True}, {"status": "done", "priority": 5, "blocked": False}],
    "color": ["red", "yellow", "green"],
    "number": [0, -20, 17],
    "day": ["2024-05-17", "1999-12-31", "2030-02-28"],
    "mail": ["ada@analytical.engine.org", "li.wei+test@example.cn", "j@x.io"],
    "id": ["123e4567-e89b-12d3-a456-426614174000", "00000000-0000-4000-8000-0000000000ff",
           "A1B2C3D4-E5F6-4A7B-8C9D-0E1F2A3B4C5D"],
    "user": [{"u": {"id": 42, "tags": ["adm", "ops"]}, "ok": True},
             {"u": {"id": 99, "tags": ["x"]}, "ok": False},
             {"u": {"id": 1, "tags": ["é", "bb"]}, "ok": True}],
    "scores": [[1, 2], [-9, 0, 9, 7], [3, 4, 5]],
    "code": [{"code": "AB12", "kind": "item"}, {"code": "XY", "kind": "item"},
             {"code": "a-b", "kind": "item"}],
    "point": [{"l": "orig", "xy": [0, 0]}, {"l": None, "xy": [-99, 99]},
              {"l": "p", "xy": [17, -54]}],
}


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def main():
    ap = argparse.ArgumentParser()
    for name in ("mask_tool", "to_gbnf", "decode_bench", "reference", "tokenizer_reference",
                 "schemas"):
        ap.add_argument(name)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    gguf = os.environ["FERRY_MODEL_GGUF"]
    ref_python = os.environ["FERRY_REF_PYTHON"]
    schemas = json.load(open(args.schemas))

    import llguidance  # the grammar venv's; imported here so that --help needs none of it
    work = tempfile.mkdtemp(prefix="ferry-grammar-bench.")
    tok_path = os.path.join(work, "tokenizer.json")
    with open(tok_path, "w") as f:
        f.write(run([ref_python, args.tokenizer_reference, "gguf-to-json", gguf]))
    tok = llguidance.LLTokenizer(open(tok_path, encoding="utf-8").read())

    ferry_us, llg_us, rows = [], [], []
    for s in schemas:
        name = s["name"]
        base = os.path.join(work, name)
        json.dump(s["schema"], open(base + ".schema.json", "w"))
        gbnf = run([args.to_gbnf, "schema", base + ".schema.json"])
        open(base + ".gbnf", "w").write(gbnf)
        seqs = [tok.tokenize_str(json.dumps(d, separators=(",", ":"), ensure_ascii=False))
                for d in DOCS[name]]
        json.dump(seqs, open(base + ".tokens.json", "w"))
        ours = json.loads(run([args.mask_tool, "bench", gguf, base + ".gbnf", base + ".tokens.json",
                               str(args.repeat), base + ".ferry_us"]))
        theirs = json.loads(run([sys.executable, args.reference, "bench-schema", tok_path,
                                 base + ".schema.json", base + ".tokens.json", str(args.repeat),
                                 base + ".llg_us"]))
        ferry_us += [float(x) for x in open(base + ".ferry_us")]
        llg_us += [float(x) for x in open(base + ".llg_us")]
        rows.append((name, sum(map(len, seqs)), ours, theirs))

    print(f"grammar: mask time per token on SmolLM2's vocabulary ({tok.vocab_size:,} tokens), "
          f"{len(schemas)} schemas, {args.repeat} passes over their documents (pass 1 cold, shown "
          f"apart; the rest warm); Ferry vs llguidance 1.9.1 (its JSON Schema compiler, from "
          f"Python)")
    print(f"  {'schema':10} {'tokens':>6} {'Ferry p50':>10} {'p99':>8} {'cold p99':>9} "
          f"{'llg p50':>8} {'llg p99':>8} {'cold p99':>9}  (us)")
    for name, n, ours, theirs in rows:
        print(f"  {name:10} {n:6} {ours['p50_us']:10.1f} {ours['p99_us']:8.1f} "
              f"{ours['cold_p99_us']:9.0f} {theirs['p50_us']:8.1f} {theirs['p99_us']:8.1f} "
              f"{theirs['cold_p99_us']:9.0f}")
    mask_p50, mask_p99 = pct(ferry_us, 0.5), pct(ferry_us, 0.99)
    llg_p50, llg_p99 = pct(llg_us, 0.5), pct(llg_us, 0.99)
    print(f"  {'all':10} {len(ferry_us):6} {mask_p50:10.1f} {mask_p99:8.1f} {'':9} "
          f"{llg_p50:8.1f} {llg_p99:8.1f}   (warm samples)")

    decode = json.loads(run([args.decode_bench, gguf, str(args.rounds)]))
    ratio = decode["ratio"]
    print(f"decode at batch 16, SmolLM2-135M bf16, CPU backend in process: free "
          f"{decode['free_tok_s']:.1f} tokens/s, constrained {decode['constrained_tok_s']:.1f} "
          f"tokens/s ({ratio:.2f}x; medians of {decode['rounds']} alternating rounds; the first "
          f"constrained round, cold cache: {decode['first_constrained_tok_s']:.1f})")
    result = {
        "bench": "grammar",
        "mask_p50_us": round(mask_p50, 2), "mask_p99_us": round(mask_p99, 2),
        "llguidance_p50_us": round(llg_p50, 2), "llguidance_p99_us": round(llg_p99, 2),
        "constrained_vs_free_b16": round(ratio, 3),
        "free_tok_s_b16": round(decode["free_tok_s"], 1),
        "constrained_tok_s_b16": round(decode["constrained_tok_s"], 1),
        "goals": {
            "mask_p99_le_llguidance": {"value": round(mask_p99, 2), "goal": round(llg_p99, 2),
                                       "met": mask_p99 <= llg_p99},
            "constrained_vs_free_b16": {"value": round(ratio, 3), "goal": 0.95,
                                        "met": ratio >= 0.95},
        },
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
