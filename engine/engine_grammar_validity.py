"""Validates constrained outputs (engine_grammar_outputs' JSON lines) with jsonschema.

Run with $FERRY_GRAMMAR_PYTHON. Every `stop` output must parse as JSON and validate under its
schema with Draft202012Validator and its FormatChecker (date, uuid, email here); every `length`
output must be a prefix the grammar accepts (`prefix_ok`, checked by the C++ side with a fresh
byte matcher) and is not counted invalid; `length` finishes must be at most 5% of all; any other
finish fails.

  engine_grammar_validity.py SCHEMAS.json OUTPUTS.jsonl EXPECTED_REQUESTS
"""
import collections
import json
import sys

import jsonschema


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    schemas = {s["name"]: s["schema"] for s in json.load(open(sys.argv[1]))}
    validators = {
        name: jsonschema.Draft202012Validator(
            schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        for name, schema in schemas.items()}
    expected = int(sys.argv[3])
    failures = []
    finishes = collections.Counter()
    per_schema = collections.Counter()
    examples = {}
    lines = [json.loads(line) for line in open(sys.argv[2])]
    for r in lines:
        name, finish = r["schema"], r["finish"]
        finishes[finish] += 1
        per_schema[name, finish] += 1
        raw = bytes.fromhex(r["text_hex"])
        where = f"{name} seed {r['seed']} ({finish})"
        if finish == "length":
            if not r["prefix_ok"]:
                failures.append(f"{where}: not a prefix of the grammar: {raw!r}")
            continue
        if finish != "stop":
            failures.append(f"{where}: finish {finish} {r['error']}: {raw!r}")
            continue
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            failures.append(f"{where}: not JSON ({e}): {raw!r}")
            continue
        errors = list(validators[name].iter_errors(doc))
        if errors:
            failures.append(f"{where}: invalid: {errors[0].message}: {raw!r}")
        examples.setdefault(name, raw.decode("utf-8"))
    if len(lines) != expected:
        failures.append(f"{len(lines)} outputs, expected {expected}")
    length_share = finishes["length"] / max(1, len(lines))
    for name in schemas:
        print(f"  {name}: {per_schema[name, 'stop']} stop, {per_schema[name, 'length']} length; "
              f"e.g. {examples.get(name, '')[:100]}")
    print(f"{len(lines)} outputs: {dict(finishes)}; length finishes {100 * length_share:.1f}% "
          f"(at most 5%)")
    if length_share > 0.05:
        failures.append(f"length finishes are {100 * length_share:.1f}% of all, more than 5%")
    if failures:
        print(f"FAILURES ({len(failures)}):\n" + "\n".join(failures[:40]))
        sys.exit(1)
    print("OK: every stop output validates with jsonschema")


if __name__ == "__main__":
    main()
