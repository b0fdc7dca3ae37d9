#!/usr/bin/env python3
"""llama.cpp as the peer of `./ferry bench engine`: the same model, measured the same way.

  llamacpp_peer.py bf16-gguf SRC.gguf DST.gguf          (reference venv: needs `gguf`, numpy)
      Copy of SRC with every KV pair and every tensor, in the same order, but each 2-D tensor
      dequantized and stored as BF16 (float32 rounded to nearest even, as Ferry rounds) and each
      1-D tensor (norm weights) as F32. general.file_type becomes MOSTLY_BF16 (the only KV that
      changes: it describes the tensors). This gives llama.cpp the weights Ferry computes with.

  llamacpp_peer.py sliced-gguf SRC.gguf DST.gguf [--hidden 512] [--heads 8] [--kv-heads 2]
                   [--layers 4]                           (reference venv)
      A smaller llama model cut out of SRC's trained weights, as F32: the first --layers blocks,
      the first --hidden channels of the residual stream, the first --heads query heads and
      --kv-heads key/value heads (64-wide, as SRC's), every FFN channel and every token. Its rows
      are multiples of 256 when --hidden and the FFN width are, so llama.cpp's quantizer can make
      K-quants of it (SmolLM2's 576 cannot); the weights keep a trained model's distributions,
      the outputs are those of no trained model.

  llamacpp_peer.py moe-gguf SRC.gguf DST.gguf --arch qwen2moe|llama [--layers 4]
                                                          (reference venv)
      A mixture-of-experts model made from sliced-gguf's 512-wide cut of SRC: each layer's FFN
      channels split into experts of 256 (qwen2moe: 4 experts from the first 1024 channels and
      a shared expert of the other 512, with its sigmoid gate; llama, Mixtral's layout: 6
      experts), routers and the shared gate random (seeded; F32, as llama.cpp keeps them), 2
      experts per token; qwen2moe adds random q/k/v biases and an output matrix (the embedding's
      copy: llama.cpp requires one for it). Expert tensors are 3-D, experts
      outermost, as llama.cpp's converter writes them.

  llamacpp_peer.py prompt MODEL.gguf [--tokens 1024]      (client venv)
      Prints {"prompt": [ids]}: the benchmark prompt, for Ferry's side of the same run.

  llamacpp_peer.py bench MODEL.gguf --threads N [--prompt-tokens 1024] [--decode-tokens 64]
                   [--repeats 3] [--flash-attn] [--prompt-file PROMPT.json]
                                                          (client venv: needs llama-cpp-python)
      Prefill: one llama_decode of --prompt-tokens tokens from an empty KV cache, logits for the
      last token only. Decode: after a 16-token prompt, --decode-tokens single-token decodes at
      batch 1, each fed the greedy (argmax) token of the one before; only the decode calls are
      timed. Each figure is the best of --repeats, after one untimed warm-up. Prints one JSON line
      on stdout; progress goes to stderr.

  llamacpp_peer.py bench-batch MODEL.gguf --threads N --batch B [--batch B ...]
                   [--decode-tokens 32] [--repeats 2] [--flash-attn] [--prompt-file PROMPT.json]
                                                          (client venv)
      Batched decode: B sequences (one llama_context with n_seq_max = B), each after its own
      16-token prompt (the prompt ids rotated by the sequence number); then --decode-tokens steps
      of one llama_decode carrying one token of every sequence (each the greedy token of its
      sequence's previous step). Only the decode calls are timed (argmax in numpy is not).
      Prints {"decode_tok_s": {"B": tokens/s, ...}} with tokens/s = B * steps / seconds, the
      best of --repeats.

The prompt is a fixed English text tokenized by the model's own tokenizer (no special tokens),
repeated and cut to length, so every run of every model file sees the same ids.
"""
import argparse
import json
import os
import sys
import time

TEXT = (
    "The river rises in the hills to the north of the town and runs south through farmland, "
    "woods and a string of small villages before it reaches the sea. In the last century its "
    "banks were lined with mills that ground grain, sawed timber and spun wool, and a canal was "
    "cut beside it so that barges could carry coal inland and bring cloth back to the port. "
    "Most of the mills have closed, but several of the buildings survive as houses, workshops "
    "and a small museum that explains how water wheels and gears turned the machinery. Walkers "
    "follow the old towpath for most of its length; it is flat, well drained and marked with "
    "stone posts every mile. Herons fish in the shallows, kingfishers nest in the steep banks, "
    "and in late autumn salmon can be seen leaping the weir below the bridge. The council "
    "publishes a map of the route, with notes on where to find food, water and shelter, and "
    "volunteers clear fallen trees after the winter storms. "
)
DECODE_CONTEXT = 16


def log(message):
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# bf16-gguf

def field_value(field):
    """A GGUFReader field as a value GGUFWriter.add_key_value packs back to the same bytes."""
    from gguf import GGUFValueType
    main = field.types[0]
    if main == GGUFValueType.ARRAY:
        if len(field.types) != 2:
            raise ValueError(f"{field.name}: nested arrays are not supported")
        if field.types[1] == GGUFValueType.STRING:
            # Raw bytes: not every token string need be valid UTF-8.
            return [bytes(field.parts[i]) for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if main == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]])
    return field.parts[field.data[0]].tolist()[0]


def copy_fields(reader, writer, rename=lambda name: name, overrides=None):
    """Every KV pair of `reader` into `writer`, in order, under rename(name), with the values of
    `overrides` ({new name: value}) in place of the file's; the header's fields and the
    architecture (the writer sets them itself) excepted."""
    import gguf
    skip = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture"}
    for field in reader.fields.values():
        if field.name in skip:
            continue
        name = rename(field.name)
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        value = (overrides or {}).get(name, None)
        if value is None:
            value = field_value(field)
        if name == "general.alignment":
            writer.data_alignment = value
        writer.add_key_value(name, value, field.types[0], sub_type=sub_type)


def bf16_gguf(src, dst):
    import numpy as np
    import gguf
    from gguf.quants import dequantize
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from dequantize_reference import to_bf16  # Ferry's rounding, written once

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    copy_fields(reader, writer, overrides={"general.file_type": int(gguf.LlamaFileType.MOSTLY_BF16)})

    for tensor in reader.tensors:
        # tensor.data is in ggml order reversed (rows, columns), as the writer wants it.
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        if values.ndim >= 2:
            writer.add_tensor(tensor.name, to_bf16(np.ascontiguousarray(values, np.float32)),
                              raw_dtype=gguf.GGMLQuantizationType.BF16)
            kind = "BF16"
        else:
            writer.add_tensor(tensor.name, np.ascontiguousarray(values))
            kind = "F32"
        log(f"{tensor.name}: {tensor.tensor_type.name} {list(values.shape)} -> {kind}")

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def sliced_gguf(src, dst, hidden, heads, kv_heads, layers):
    import re
    import numpy as np
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    if arch != "llama":
        raise SystemExit(f"{src}: architecture {arch}, not llama")
    head_dim = hidden // heads
    overrides = {f"{arch}.block_count": layers, f"{arch}.embedding_length": hidden,
                 f"{arch}.attention.head_count": heads, f"{arch}.attention.head_count_kv": kv_heads,
                 f"{arch}.rope.dimension_count": head_dim,
                 "general.file_type": int(gguf.LlamaFileType.ALL_F32)}
    writer = gguf.GGUFWriter(dst, arch)
    copy_fields(reader, writer, overrides=overrides)

    q_rows, kv_rows = heads * head_dim, kv_heads * head_dim
    for tensor in reader.tensors:
        match = re.match(r"blk\.(\d+)\.(.*)$", tensor.name)
        if match and int(match.group(1)) >= layers:
            continue
        kind = match.group(2) if match else tensor.name
        w = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        # [rows (outputs), columns (inputs)] in numpy order.
        cut = {"token_embd.weight": (slice(None), slice(0, hidden)),
               "output.weight": (slice(None), slice(0, hidden)),
               "attn_q.weight": (slice(0, q_rows), slice(0, hidden)),
               "attn_k.weight": (slice(0, kv_rows), slice(0, hidden)),
               "attn_v.weight": (slice(0, kv_rows), slice(0, hidden)),
               "attn_output.weight": (slice(0, hidden), slice(0, q_rows)),
               "ffn_gate.weight": (slice(None), slice(0, hidden)),
               "ffn_up.weight": (slice(None), slice(0, hidden)),
               "ffn_down.weight": (slice(0, hidden), slice(None))}
        if w.ndim == 1:
            w = w[:hidden]
        elif kind in cut:
            w = w[cut[kind]]
        else:
            raise SystemExit(f"{src}: no rule to slice {tensor.name}")
        writer.add_tensor(tensor.name, np.ascontiguousarray(w, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def moe_gguf(src, dst, arch, layers):
    import re
    import numpy as np
    import gguf
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        sliced = os.path.join(tmp, "sliced.gguf")
        sliced_gguf(src, sliced, 512, 8, 2, layers)
        reader = gguf.GGUFReader(sliced)
        rng = np.random.default_rng(7)
        hidden, expert_ff = 512, 256
        experts = 4 if arch == "qwen2moe" else 6
        shared_ff = 512 if arch == "qwen2moe" else 0
        writer = gguf.GGUFWriter(dst, arch)
        # The slice's llama.* keys under the new architecture; llama's FFN width is an expert's.
        copy_fields(reader, writer, rename=lambda name: re.sub(r"^llama\.", arch + ".", name),
                    overrides={f"{arch}.feed_forward_length":
                               expert_ff if arch == "llama" else 1536})
        writer.add_uint32(f"{arch}.expert_count", experts)
        writer.add_uint32(f"{arch}.expert_used_count", 2)
        if arch == "qwen2moe":
            writer.add_uint32(f"{arch}.expert_feed_forward_length", expert_ff)
            writer.add_uint32(f"{arch}.expert_shared_feed_forward_length", shared_ff)

        tensors = {t.name: np.array(t.data, dtype=np.float32) for t in reader.tensors}
        for name, w in tensors.items():
            if not name.startswith("blk.") or name.split(".")[2] not in ("ffn_gate", "ffn_up",
                                                                          "ffn_down"):
                writer.add_tensor(name, np.ascontiguousarray(w))
        for layer in range(layers):
            p = f"blk.{layer}."
            gate, up, down = (tensors[p + n + ".weight"] for n in ("ffn_gate", "ffn_up", "ffn_down"))
            cut = [slice(e * expert_ff, (e + 1) * expert_ff) for e in range(experts)]
            writer.add_tensor(p + "ffn_gate_inp.weight",
                              (rng.standard_normal((experts, hidden)) / np.sqrt(hidden))
                              .astype(np.float32))
            writer.add_tensor(p + "ffn_gate_exps.weight", np.stack([gate[c] for c in cut]))
            writer.add_tensor(p + "ffn_up_exps.weight", np.stack([up[c] for c in cut]))
            writer.add_tensor(p + "ffn_down_exps.weight",
                              np.ascontiguousarray(np.stack([down[:, c] for c in cut])))
            if shared_ff:
                rest = slice(experts * expert_ff, experts * expert_ff + shared_ff)
                writer.add_tensor(p + "ffn_gate_shexp.weight", np.ascontiguousarray(gate[rest]))
                writer.add_tensor(p + "ffn_up_shexp.weight", np.ascontiguousarray(up[rest]))
                writer.add_tensor(p + "ffn_down_shexp.weight", np.ascontiguousarray(down[:, rest]))
                writer.add_tensor(p + "ffn_gate_inp_shexp.weight",
                                  (rng.standard_normal(hidden) / np.sqrt(hidden)).astype(np.float32))
            if arch == "qwen2moe" and layer == 0:
                # llama.cpp's qwen2moe requires its own output matrix: the tied embedding's copy.
                writer.add_tensor("output.weight", np.ascontiguousarray(tensors["token_embd.weight"]))
            if arch == "qwen2moe":
                for n, size in (("attn_q", hidden), ("attn_k", 128), ("attn_v", 128)):
                    writer.add_tensor(p + n + ".bias",
                                      (rng.standard_normal(size) * 0.1).astype(np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()


# ---------------------------------------------------------------------------------------------
# bench

def prompt_ids(llm, n):
    ids = llm.tokenize(TEXT.encode(), add_bos=False, special=False)
    return (ids * (n // len(ids) + 1))[:n]


def greedy(llm, n_vocab):
    import numpy as np
    import llama_cpp
    logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return int(np.ctypeslib.as_array(logits, shape=(n_vocab,)).argmax())


def time_prefill(llm, prompt):
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    return time.perf_counter() - start


def time_decode(llm, context, steps, n_vocab):
    """Seconds spent in `steps` batch-1 decodes after `context`, and the tokens chosen."""
    llm.reset()
    llm.eval(context)
    tokens, elapsed = [], 0.0
    for _ in range(steps):
        token = greedy(llm, n_vocab)
        tokens.append(token)
        start = time.perf_counter()
        llm.eval([token])
        elapsed += time.perf_counter() - start
    return elapsed, tokens


def bench(args):
    import llama_cpp

    n_ctx = max(2048, args.prompt_tokens, DECODE_CONTEXT + args.decode_tokens)
    load_start = time.perf_counter()
    llm = llama_cpp.Llama(model_path=args.model, n_threads=args.threads,
                          n_threads_batch=args.threads, n_ctx=n_ctx, n_batch=n_ctx,
                          n_ubatch=n_ctx, logits_all=False, flash_attn=args.flash_attn,
                          seed=0, verbose=False)
    log(f"loaded {args.model} in {time.perf_counter() - load_start:.2f} s")
    n_vocab = llm.n_vocab()
    if args.prompt_file:
        with open(args.prompt_file) as f:
            prompt = json.load(f)["prompt"][:args.prompt_tokens]
        if len(prompt) != args.prompt_tokens:
            raise SystemExit(f"{args.prompt_file}: fewer than {args.prompt_tokens} tokens")
    else:
        prompt = prompt_ids(llm, args.prompt_tokens)
    context = prompt[:DECODE_CONTEXT]

    time_prefill(llm, prompt[:64])  # warm-up: page the weights in, size the buffers
    prefill = []
    for i in range(args.repeats):
        prefill.append(time_prefill(llm, prompt))
        log(f"prefill {i + 1}/{args.repeats}: {args.prompt_tokens / prefill[-1]:.1f} tok/s")
    decode, first = [], None
    for i in range(args.repeats):
        seconds, tokens = time_decode(llm, context, args.decode_tokens, n_vocab)
        decode.append(seconds)
        first = first or tokens
        log(f"decode {i + 1}/{args.repeats}: {args.decode_tokens / seconds:.1f} tok/s")
    log("greedy continuation: " + repr(llm.detokenize(context + first).decode(errors="replace")))

    print(json.dumps({
        "model": args.model, "threads": args.threads,
        "prefill_tok_s": round(args.prompt_tokens / min(prefill), 2),
        "decode_tok_s": round(args.decode_tokens / min(decode), 2),
        "prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode_tokens,
        "repeats": args.repeats, "flash_attn": args.flash_attn,
        "llama_cpp_version": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
    }))


def bench_batch(args):
    import numpy as np
    import llama_cpp

    import ctypes

    @llama_cpp.llama_log_callback
    def quiet(level, text, user_data):
        pass

    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(args.model.encode(),
                                                 llama_cpp.llama_model_default_params())
    if not model:
        raise SystemExit(f"cannot load {args.model}")
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    with open(args.prompt_file) as f:
        ids = json.load(f)["prompt"]
    steps, context = args.decode_tokens, DECODE_CONTEXT
    out = {}
    for b in args.batch:
        params = llama_cpp.llama_context_default_params()
        params.n_seq_max = b
        params.n_ctx = b * ((context + steps + 1 + 255) // 256 * 256)
        params.n_batch = params.n_ubatch = b * context
        params.n_threads = params.n_threads_batch = args.threads
        params.flash_attn_type = 1 if args.flash_attn else 0  # LLAMA_FLASH_ATTN_TYPE_ENABLED
        ctx = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            raise SystemExit(f"cannot create a context for batch {b}")
        batch = llama_cpp.llama_batch_init(b * context, 0, b)

        def put(i, token, pos, seq, want_logits):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = want_logits

        def argmax(i):
            row = llama_cpp.llama_get_logits_ith(ctx, i)
            return int(np.ctypeslib.as_array(row, shape=(n_vocab,)).argmax())

        best = None
        for _ in range(args.repeats):
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
            for s in range(b):
                prompt = [ids[(s + j) % len(ids)] for j in range(context)]
                for j, t in enumerate(prompt):
                    put(s * context + j, t, j, s, j == context - 1)
            batch.n_tokens = b * context
            if llama_cpp.llama_decode(ctx, batch) != 0:
                raise SystemExit("llama_decode failed (prefill)")
            tokens = [argmax(s * context + context - 1) for s in range(b)]
            elapsed = 0.0
            for step in range(steps):
                for s in range(b):
                    put(s, tokens[s], context + step, s, True)
                batch.n_tokens = b
                start = time.perf_counter()
                if llama_cpp.llama_decode(ctx, batch) != 0:
                    raise SystemExit("llama_decode failed (decode)")
                elapsed += time.perf_counter() - start
                tokens = [argmax(s) for s in range(b)]
            rate = b * steps / elapsed
            best = rate if best is None else max(best, rate)
            log(f"batch {b}{' (flash attn)' if args.flash_attn else ''}: {rate:.1f} tok/s")
        out[str(b)] = round(best, 2)
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    print(json.dumps({"decode_tok_s": out, "threads": args.threads, "flash_attn": args.flash_attn,
                      "decode_tokens": steps}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser("bf16-gguf", help="write a BF16 copy of a GGUF model")
    convert.add_argument("src")
    convert.add_argument("dst")
    sliced = commands.add_parser("sliced-gguf", help="cut a smaller llama model out of a GGUF")
    sliced.add_argument("src")
    sliced.add_argument("dst")
    sliced.add_argument("--hidden", type=int, default=512)
    sliced.add_argument("--heads", type=int, default=8)
    sliced.add_argument("--kv-heads", type=int, default=2)
    sliced.add_argument("--layers", type=int, default=4)
    moe = commands.add_parser("moe-gguf", help="make a mixture-of-experts model of a GGUF's FFNs")
    moe.add_argument("src")
    moe.add_argument("dst")
    moe.add_argument("--arch", choices=["qwen2moe", "llama"], required=True)
    moe.add_argument("--layers", type=int, default=4)
    run = commands.add_parser("bench", help="llama.cpp prefill and decode tokens/s")
    run.add_argument("model")
    run.add_argument("--threads", type=int, required=True)
    run.add_argument("--prompt-tokens", type=int, default=1024)
    run.add_argument("--decode-tokens", type=int, default=64)
    run.add_argument("--repeats", type=int, default=3)
    run.add_argument("--flash-attn", action="store_true")
    run.add_argument("--prompt-file", help='{"prompt": [ids]} to use instead of the built-in text')
    batched = commands.add_parser("bench-batch", help="llama.cpp batched decode tokens/s")
    batched.add_argument("model")
    batched.add_argument("--threads", type=int, required=True)
    batched.add_argument("--batch", type=int, action="append", required=True)
    batched.add_argument("--decode-tokens", type=int, default=32)
    batched.add_argument("--repeats", type=int, default=2)
    batched.add_argument("--flash-attn", action="store_true")
    batched.add_argument("--prompt-file", required=True)
    show = commands.add_parser("prompt", help="print the benchmark prompt's token ids")
    show.add_argument("model")
    show.add_argument("--tokens", type=int, default=1024)
    args = parser.parse_args()
    if args.command == "bf16-gguf":
        bf16_gguf(args.src, args.dst)
    elif args.command == "moe-gguf":
        moe_gguf(args.src, args.dst, args.arch, args.layers)
    elif args.command == "sliced-gguf":
        sliced_gguf(args.src, args.dst, args.hidden, args.heads, args.kv_heads, args.layers)
    elif args.command == "prompt":
        import llama_cpp
        llm = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
        print(json.dumps({"prompt": prompt_ids(llm, args.tokens)}))
    elif args.command == "bench-batch":
        bench_batch(args)
    else:
        bench(args)


if __name__ == "__main__":
    main()
