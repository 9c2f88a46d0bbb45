#!/usr/bin/env bash
# t_hf.sh: scripts/export_hf.py and scripts/import_hf.py, Hugging Face GPT-2 interop. Export then import
# gives the model file back bit for bit (V=500, padded to 512; V=50257 from a checkpoint directory, cut and
# padded again; bf16); the exported safetensors has a valid header and HF's names and shapes, and an
# independent PyTorch GPT-2 written here in HF's convention (Conv1D x @ W + b, tanh GELU, tied head) reads
# it by name and gives the trainer's step-0 logits; a pytorch_model.bin with `transformer.` names and
# mask buffers, and a BF16 safetensors, import to the same file; the trainer trains from an imported file;
# bad input, including every malformed safetensors the safetensors library refuses, ends in one `error:` line
# and no output; neither script overwrites its input; export_hf.py refuses a non-empty folder unless --force,
# which removes the old Hugging Face files; a full disk, SIGINT or SIGTERM leaves nothing behind. The
# importer refuses the shapes the trainer refuses (head sizes 6, 20, 256; its rule asked of train_gpt_cpu for
# many shapes); a tied head bit-identical to an embedding holding NaN imports with --allow-nonfinite; export
# warns of NaN and infinity, naming the tensor; both scripts run without PyTorch (a torch that fails to import
# first on PYTHONPATH), but for pytorch_model.bin, refused in one line. The checks in Python read and write
# safetensors with their own code.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
BIN=./train_gpt_cpu
if [ ! -x "$BIN" ]; then
    t_fail trainer_built "$BIN is missing (run: make train_gpt_cpu)"
    t_finish
fi

cat > "$TMP/hfcheck.py" <<'PY'
"""Checks for t_hf.sh, independent of scripts/hf_format.py. Modes:
  header NAME DIR MODEL.bin      safetensors header, HF names and shapes, config.json, tokenizer files
  logits NAME DIR SHARD LOGITS B T   HF-convention forward of DIR's weights vs the trainer's logits
  variants SRC OUT               HF folders derived from SRC: pt, bf16, missing, shape, dtype, untied, notensor (a non-tensor entry), notdict (a list), notgpt2
  malformed SRC OUT              HF folders whose model.safetensors or config.json is SRC's edited (see there)
  shapes TRAINER                 the importer's shape rule against the trainer's
  losses NAME LOG N              N finite losses in a trainer log.jsonl
"""
import json, math, os, struct, sys
import numpy as np
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "tools"))
from safetensors_plain import read_st, write_st
# torch (over a second to import) only in the modes that use it: logits and variants.

SUFFIXES = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
            "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
            "mlp.c_proj.weight", "mlp.c_proj.bias"]


def report(name, bad):
    print("ok %s" % name if not bad else "FAIL %s: %s" % (name, "; ".join(bad)))


def st_tensors(path):
    header, _, data = read_st(path)
    return {k: np.frombuffer(data, "<f4", math.prod(e["shape"]), e["data_offsets"][0]).reshape(e["shape"])
            for k, e in header.items() if k != "__metadata__"}


def model_header(path):   # maxT, V, L, NH, C
    return [int(x) for x in np.fromfile(path, np.int32, 8)[2:7]]


def hf_shapes(maxT, V, L, C):
    per = {"attn.c_attn.weight": (C, 3 * C), "attn.c_attn.bias": (3 * C,), "attn.c_proj.weight": (C, C),
           "mlp.c_fc.weight": (C, 4 * C), "mlp.c_fc.bias": (4 * C,), "mlp.c_proj.weight": (4 * C, C)}
    out = {"wte.weight": (V, C), "wpe.weight": (maxT, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    out.update({"h.%d.%s" % (l, s): per.get(s, (C,)) for l in range(L) for s in SUFFIXES})
    return out


def header(name, d, model):
    maxT, V, L, NH, C = model_header(model)
    h, n, data = read_st(os.path.join(d, "model.safetensors"))
    bad = [] if (8 + n) % 8 == 0 else ["data starts at %d, not 8-byte aligned" % (8 + n)]
    if h.pop("__metadata__", None) != {"format": "pt"}:
        bad.append("__metadata__ is not {'format': 'pt'}")
    end = 0
    for k, e in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"]):
        b, en = e["data_offsets"]
        if b != end or en - b != 4 * math.prod(e["shape"]) or e["dtype"] != "F32":
            bad.append("%s: offsets %s, shape %s, dtype %s after byte %d" % (k, e["data_offsets"], e["shape"], e["dtype"], end))
        end = en
    if end != len(data):
        bad.append("tensors end at %d of %d data bytes" % (end, len(data)))
    got = {k: tuple(e["shape"]) for k, e in h.items()}
    want = hf_shapes(maxT, V, L, C)
    if got != want:
        bad.append("names/shapes differ: %s" % sorted(set(got.items()) ^ set(want.items()))[:4])
    report(name + "_safetensors_header", bad)
    cfg = json.load(open(os.path.join(d, "config.json")))
    want = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": C, "n_layer": L, "n_head": NH,
            "n_positions": maxT, "n_ctx": maxT, "vocab_size": V, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5, "bos_token_id": 50256, "eos_token_id": 50256, "tie_word_embeddings": True}
    gen = json.load(open(os.path.join(d, "generation_config.json")))
    report(name + "_config", ["%s=%r, want %r" % (k, cfg.get(k), v) for k, v in want.items() if cfg.get(k) != v]
           + ([] if gen.get("eos_token_id") == 50256 else ["generation_config %r" % gen]))
    same = lambda a, b: open(os.path.join(d, a), "rb").read() == open(os.path.join("data/tokenizer", b), "rb").read()
    report(name + "_tokenizer_files", [f for f, g in (("vocab.json", "encoder.json"), ("merges.txt", "vocab.bpe"))
                                       if not same(f, g)])


def hf_forward(w, cfg, idx):
    """GPT-2 as Hugging Face computes it, in float64: Conv1D is x @ W + b, W of shape (in, out)."""
    import torch
    import torch.nn.functional as F
    w = {k: torch.from_numpy(v.astype(np.float64)) for k, v in w.items()}
    B, T = idx.shape
    C, NH = cfg["n_embd"], cfg["n_head"]
    ln = lambda x, p: F.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"], eps=cfg["layer_norm_epsilon"])
    conv = lambda x, p: x @ w[p + ".weight"] + w[p + ".bias"]
    x = w["wte.weight"][idx] + w["wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(cfg["n_layer"]):
        p = "h.%d." % l
        q, k, v = (t.reshape(B, T, NH, C // NH).transpose(1, 2) for t in conv(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, -1))
        att = (q @ k.transpose(-1, -2) / math.sqrt(C // NH)).masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + conv((att @ v).transpose(1, 2).reshape(B, T, C), p + "attn.c_proj")
        x = x + conv(F.gelu(conv(ln(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh"), p + "mlp.c_proj")
    return ln(x, "ln_f") @ w["wte.weight"].T


def logits(name, d, shard, path, B, T):
    import torch
    B, T = int(B), int(T)
    cfg = json.load(open(os.path.join(d, "config.json")))
    tokens = np.fromfile(shard, np.uint16, offset=1024)[:B * T].astype(np.int64).reshape(B, T)
    ours = hf_forward(st_tensors(os.path.join(d, "model.safetensors")), cfg, torch.from_numpy(tokens)).numpy()
    theirs = np.fromfile(path, np.float32)
    if theirs.size != B * T * cfg["vocab_size"]:
        return report(name, ["%s has %d floats, want B*T*V = %d" % (path, theirs.size, B * T * cfg["vocab_size"])])
    err = float(np.abs(ours.reshape(-1) - theirs).max())
    report(name, [] if err <= 1e-5 else ["max |HF forward - trainer| = %.3g > 1e-5" % err])
    print("# %s: max abs error %.2g over %d logits" % (name, err, theirs.size))


def folder(out, sub, cfg):
    d = os.path.join(out, sub)
    os.makedirs(d)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    return d


def variants(src, out):
    import torch
    cfg = json.load(open(os.path.join(src, "config.json")))
    w = st_tensors(os.path.join(src, "model.safetensors"))
    T = cfg["n_positions"]
    sd = {"transformer." + k: torch.from_numpy(v.copy()) for k, v in w.items()}
    for l in range(cfg["n_layer"]):
        sd["transformer.h.%d.attn.bias" % l] = torch.ones(1, 1, T, T, dtype=torch.bool).tril()
        sd["transformer.h.%d.attn.masked_bias" % l] = torch.tensor(-1e4)
    sd["lm_head.weight"] = sd["transformer.wte.weight"].clone()
    torch.save(sd, os.path.join(folder(out, "pt", cfg), "pytorch_model.bin"))
    sd["lm_head.weight"][0, 0] += 1
    torch.save(sd, os.path.join(folder(out, "untied", cfg), "pytorch_model.bin"))
    torch.save(dict(sd, step=3), os.path.join(folder(out, "notensor", cfg), "pytorch_model.bin"))
    torch.save(list(sd.values()), os.path.join(folder(out, "notdict", cfg), "pytorch_model.bin"))
    f32 = [(k, "F32", v) for k, v in w.items()]
    bf16 = [(k, "BF16", torch.from_numpy(v.copy()).bfloat16().view(torch.int16).numpy()) for k, v in w.items()]
    write_st(os.path.join(folder(out, "bf16", cfg), "model.safetensors"), bf16)
    write_st(os.path.join(folder(out, "missing", cfg), "model.safetensors"),
             [t for t in f32 if t[0] != "h.1.mlp.c_fc.bias"])
    write_st(os.path.join(folder(out, "shape", cfg), "model.safetensors"),
             [(k, d, v.T if k == "h.0.attn.c_attn.weight" else v) for k, d, v in f32])
    write_st(os.path.join(folder(out, "dtype", cfg), "model.safetensors"),
             [(k, "I32", v.astype(np.int32)) if k == "h.0.ln_2.weight" else (k, d, v) for k, d, v in f32])
    write_st(os.path.join(folder(out, "notgpt2", dict(cfg, model_type="gpt_neox")), "model.safetensors"), f32)


def malformed(src, out):
    """SRC's folder with its model.safetensors or config.json edited: one folder the safetensors library
    accepts (bool_buffer: an extra BOOL mask), and one per way it refuses a file, or the importer refuses
    its content."""
    cfg = json.load(open(os.path.join(src, "config.json")))
    header, _, data = read_st(os.path.join(src, "model.safetensors"))

    def save(sub, h=header, d=data, text=None, conf=cfg, n=None):
        t = json.dumps(h).encode() if text is None else text
        t += b" " * (-len(t) % 8)
        with open(os.path.join(folder(out, sub, conf), "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(t) if n is None else n) + t + d)

    def edit(name, **fields):
        return dict(header, **{name: dict(header[name], **fields)})

    def add(sub, name, dtype, shape, raw):   # one more tensor, after the others
        save(sub, dict(header, **{name: {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}}), data + raw)

    b, e = header["h.0.ln_1.weight"]["data_offsets"]
    save("shifted", edit("h.0.ln_1.weight", data_offsets=[b + 1, e + 1]))
    save("overlap", edit("h.0.ln_2.weight", data_offsets=[b, e]))
    save("trailing", d=data + bytes(4))
    save("truncated", d=data[:-4])
    first = next(k for k, v in header.items() if k != "__metadata__" and v["data_offsets"][0] == 0)
    end = header[first]["data_offsets"][1]
    save("float_offset", edit(first, data_offsets=[0.0, end]))
    save("string_offset", edit(first, data_offsets=["0", end]))
    add("bool_buffer", "h.0.attn.bias", "BOOL", [1], b"\1")
    add("bool_shape", "h.0.attn.bias", "BOOL", [True], b"\1")
    add("buffer_bytes", "h.0.attn.bias", "BOOL", [2], b"\1")
    add("unknown_dtype", "h.0.attn.bias", "Q7", [1], b"\1")
    add("prefixed", "transformer.h.0.ln_1.weight", "F32", [cfg["n_embd"]], np.ones(cfg["n_embd"], "<f4").tobytes())
    fake = json.dumps({"wte.weight": dict(header["wte.weight"], dtype="F16")})
    save("duplicate_key", text=(fake[:-1] + ", " + json.dumps(header)[1:]).encode())
    save("header_beyond_file", n=10 ** 9)
    save("deep", text=b"[" * 100000 + b"]" * 100000)
    vals = bytearray(data)
    at = header["h.1.attn.c_proj.weight"]["data_offsets"][0]
    vals[at:at + 12] = np.array([np.nan, np.inf, np.nan], "<f4").tobytes()
    save("nonfinite", d=bytes(vals))
    save("huge_embd", conf=dict(cfg, n_embd=2 ** 31))
    save("many_layers", conf=dict(cfg, n_layer=256))
    for D, NH in ((6, 2), (20, 3), (256, 1)):   # head sizes the trainer refuses, in folders otherwise whole
        conf = dict(cfg, n_embd=D * NH, n_head=NH, n_layer=1)
        write_st(os.path.join(folder(out, "head%d" % D, conf), "model.safetensors"),
                 [(k, "F32", np.zeros(s, "<f4")) for k, s in hf_shapes(conf["n_positions"], conf["vocab_size"], 1,
                                                                         D * NH).items()])
    # A tied head stored bit for bit as the embedding, which holds NaN (unequal to itself).
    vals = bytearray(data)
    b, e = header["wte.weight"]["data_offsets"]
    vals[b:b + 8] = np.array([np.nan, np.nan], "<f4").tobytes()
    head = dict(header["wte.weight"], data_offsets=[len(data), len(data) + e - b])
    save("nan_tied", dict(header, **{"lm_head.weight": head}), bytes(vals) + bytes(vals[b:e]))


def shapes(trainer):
    """hf_format.trainer_shape_error, which import_hf.py applies, against train_gpt_cpu --estimate (which
    checks the shape and allocates nothing): head sizes on either side of each bound in both families, and
    the layer, vocabulary and channel bounds. Both accept, or both refuse for the same reason (every number
    in the importer's error is in the trainer's)."""
    import re, subprocess
    sys.path.append("scripts")
    import hf_format
    from families import gpt2 as gpt2_family, llama as llama_family
    Vp = lambda V: (V + 127) // 128 * 128
    gpt2 = lambda L, C, NH, V: ("L%dC%dH%dV%dT64" % (L, C, NH, V), gpt2_family.Config(64, V, L, NH, C, Vp(V)))
    llama = lambda C, D, V: ("llama:L1,C%d,H4,D%d,F96,V%d,T64" % (C, D, V),
                             llama_family.Config(64, V, 1, 4, C, Vp(V), 4, D, 96))
    cases = [gpt2(1, 2 * D, 2, 500) for D in (2, 6, 8, 12, 16, 20, 64, 120, 128, 136, 256)]
    cases += [llama(64, D, 500) for D in (2, 6, 7, 8, 20, 64, 128, 130, 136, 256)]
    cases += [gpt2(256, 64, 2, 500), gpt2(257, 64, 2, 500), gpt2(1, 64, 2, 1), gpt2(1, 64, 2, 2),
              gpt2(1, 64, 2, 1 << 24), gpt2(1, 64, 2, (1 << 24) + 1), llama(60, 16, 500), llama(72, 16, 500)]
    bad, refused = [], 0
    for spec, cfg in cases:
        r = subprocess.run([trainer, "-e", spec, "--estimate", "-i", "none", "-j", "", "-b", "1", "-t", "8"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        theirs = next((l for l in r.stderr.splitlines() if l.startswith("error: ")), r.stderr) if r.returncode else None
        ours = hf_format.trainer_shape_error(cfg)
        refused += ours is not None
        numbers = lambda text: set(re.findall(r"\d+", text))
        if (ours is None) != (theirs is None) or (ours and not numbers(ours) <= numbers(theirs)):
            bad.append("%s: import_hf.py says %r, the trainer %r" % (spec, ours, theirs))
    report("import_shape_rule_is_trainers", bad + ([] if refused else ["no shape refused"]))


def losses(name, log, n):
    vals = [json.loads(l)["loss"] for l in open(log) if '"loss"' in l]
    report(name, [] if len(vals) == int(n) and all(math.isfinite(v) for v in vals) else ["losses %s" % vals])


{"header": header, "logits": logits, "variants": variants, "malformed": malformed, "shapes": shapes,
 "losses": losses}[sys.argv[1]](*sys.argv[2:])
PY

# Runs the checker; a crash without a FAIL line is still a FAIL.
check() {   # name, args...
    local name=$1; shift
    local out rc
    out=$("$PYTHON" "$TMP/hfcheck.py" "$@" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -E '^(ok|FAIL|#) '
    if printf '%s\n' "$out" | grep -q '^FAIL '; then FAILED=1
    elif [ "$rc" -ne 0 ]; then t_fail "$name" "exited $rc: $(printf '%s\n' "$out" | tail -1)"; fi
}
run() {   # name, command...: quiet; FAILs with the last lines of its output
    local name=$1; shift
    "$@" > "$TMP/$name.log" 2>&1 && return 0
    t_fail "$name" "'$*' failed: $(tail -2 "$TMP/$name.log" | tr '\n' ' ')"
    return 1
}
export_hf() { run "$1" "$PYTHON" scripts/export_hf.py "$2" "$3"; }
import_hf() { local name=$1; shift; run "$name" "$PYTHON" scripts/import_hf.py "$@"; }
same_file() {   # name, a, b
    if [ -s "$2" ] && cmp -s "$2" "$3"; then t_ok "$1"; else t_fail "$1" "$2 and $3 differ (or are missing)"; fi
}

run shard "$PYTHON" scripts/make_shard.py -o "$TMP/data.bin" -n 20000 -V 500 --seed 7 || t_finish
# A: V=500, padded to 512, given as a model file. B: GPT-2's V=50257 (padded to 50304), given as the
# checkpoint directory; exporting cuts wte to 50257 rows, importing pads it again.
run init_a $BIN -e L2C64H4V500T64 -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 0 -s 0 -o "$TMP/a" || t_finish
run init_b $BIN -e L1C64H2V50257T32 -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 0 -s 0 -o "$TMP/b" || t_finish
A=$TMP/a/ckpt_000000/model.bin
B=$TMP/b/ckpt_000000/model.bin

export_hf export_a "$A" "$TMP/hf_a" && import_hf import_a "$TMP/hf_a" "$TMP/a2.bin" && same_file roundtrip_v500 "$A" "$TMP/a2.bin"
export_hf export_b "$TMP/b/ckpt_000000" "$TMP/hf_b" && import_hf import_b "$TMP/hf_b" "$TMP/b2.bin" &&
    same_file roundtrip_v50257_from_checkpoint_dir "$B" "$TMP/b2.bin"
# bf16 (version 5): import --bf16 rounds to bf16; exporting that file (BF16, the file's precision) and
# importing it again (bf16, the weights' precision) changes no bit.
import_hf import_a_bf16 "$TMP/hf_a" "$TMP/a16.bin" --bf16 && export_hf export_a16 "$TMP/a16.bin" "$TMP/hf_a16" &&
    import_hf import_a16 "$TMP/hf_a16" "$TMP/a16_2.bin" && same_file roundtrip_bf16 "$TMP/a16.bin" "$TMP/a16_2.bin"
run ref_bf16 "$PYTHON" scripts/reference.py -e "$A" -x 0 --save "$TMP/a_ref16.bin" --save-version 5 &&
    same_file import_bf16_matches_reference_save "$TMP/a_ref16.bin" "$TMP/a16.bin"
t_check bf16_is_version_5 "[ \"\$(od -An -tu4 -j4 -N4 '$TMP/a16.bin' 2>/dev/null | tr -d ' ')\" = 5 ]"

check header_a header hf_a "$TMP/hf_a" "$A"
check header_b header hf_b "$TMP/hf_b" "$B"

# The trainer's step-0 logits (B*T x V, fp32) against the HF-convention forward of the exported weights.
for m in a b; do
    model=$TMP/$m/ckpt_000000/model.bin
    mkdir -p "$TMP/dump_$m"
    run "dump_$m" $BIN -e "$model" -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 1 -s 0 -v 0 -dump "$TMP/dump_$m" -o "$TMP/run_$m" &&
        check "logits_$m" logits "hf_logits_match_trainer_$m" "$TMP/hf_$m" "$TMP/data.bin" "$TMP/dump_$m/logits0.f32" 2 32
done

check variants variants "$TMP/hf_a" "$TMP/v"
check malformed malformed "$TMP/hf_a" "$TMP/m"
import_hf import_pt "$TMP/v/pt" "$TMP/pt.bin" && same_file import_pytorch_model_bin "$TMP/a2.bin" "$TMP/pt.bin"
t_check import_pt_skips_buffers_silently "[ -s '$TMP/import_pt.log' ] && ! grep -q warning '$TMP/import_pt.log'" \
    "$(cat "$TMP/import_pt.log")"
import_hf import_bf16_st "$TMP/v/bf16" "$TMP/bf16.bin" --bf16 && same_file import_bf16_safetensors "$TMP/a16.bin" "$TMP/bf16.bin"

# Training starts from an imported file (the V=50257 one: its padding rows came from the importer).
run train_imported $BIN -e "$TMP/b2.bin" -i "$TMP/data.bin" -j "" -b 2 -t 32 -x 2 -s 0 -v 0 -o "$TMP/run_imported" &&
    check train_imported losses train_from_imported "$TMP/run_imported/log.jsonl" 2

# Bad input: exit 1, one stderr line `error: ...` matching the pattern, no output file. The cases are
# independent single-threaded Python processes (each spends most of its time importing torch): they run
# two at a time, each with its own output path, and are checked in order once all have ended.
bad_cases=()
expect_error() {   # name, pattern, folder
    local n=${#bad_cases[@]}
    bad_cases+=("$1"$'\t'"$2")
    ( "$PYTHON" scripts/import_hf.py "$3" "$TMP/bad$n.bin" > /dev/null 2> "$TMP/err$n"; echo $? > "$TMP/rc$n" ) &
    [ $((n % 2)) -eq 1 ] && wait
}
check_errors() {
    wait
    local n name pattern rc
    for n in "${!bad_cases[@]}"; do
        IFS=$'\t' read -r name pattern <<< "${bad_cases[$n]}"
        rc=$(cat "$TMP/rc$n" 2>/dev/null)
        if [ "$rc" = 1 ] && [ "$(wc -l < "$TMP/err$n")" -eq 1 ] && grep -Eq "^error: .*$pattern" "$TMP/err$n" && [ ! -e "$TMP/bad$n.bin" ]; then
            t_ok "$name"
        else t_fail "$name" "rc=$rc, stderr: $(head -c 300 "$TMP/err$n")"; fi
    done
}
expect_error error_missing_tensor "tensor h\.1\.mlp\.c_fc\.bias is missing" "$TMP/v/missing"
expect_error error_wrong_shape "tensor h\.0\.attn\.c_attn\.weight has shape \[192, 64\], config.json says \[64, 192\]" "$TMP/v/shape"
expect_error error_dtype "tensor h\.0\.ln_2\.weight has dtype I32" "$TMP/v/dtype"
expect_error error_untied_head "lm_head\.weight differs from wte\.weight" "$TMP/v/untied"
expect_error error_entry_not_tensor "entry 'step' is a int, not a named tensor" "$TMP/v/notensor"
expect_error error_not_state_dict "holds a list, not a state dict" "$TMP/v/notdict"
expect_error error_not_gpt2 "model_type 'gpt_neox' is not one of gpt2, llama, qwen2, qwen3" "$TMP/v/notgpt2"
expect_error error_missing_folder "no such folder" "$TMP/nothing"
mkdir -p "$TMP/empty" && cp "$TMP/hf_a/config.json" "$TMP/empty/"
expect_error error_no_weights "neither model.safetensors nor pytorch_model.bin" "$TMP/empty"
# What the safetensors library refuses, import_hf.py refuses before reading a tensor (tensor.rs, validate():
# offsets sorted and contiguous from 0 to the end of the file, byte counts that match dtype and shape); and
# what it would read wrong: a repeated JSON key, a name with and without `transformer.`, NaN or infinite
# weights, config.json sizes the weights file cannot hold (checked before anything is allocated from them).
M=$TMP/m
expect_error error_offset_gap "tensor h\.0\.ln_1\.weight starts at data byte [0-9]+, but .*\(a gap of 1 bytes\)" "$M/shifted"
expect_error error_offset_overlap "tensor h\.0\.ln_[12]\.weight starts at .*\(an overlap\)" "$M/overlap"
expect_error error_trailing_bytes "4 trailing bytes after the last tensor" "$M/trailing"
expect_error error_truncated "the tensors need [0-9]+ data bytes; the file holds" "$M/truncated"
expect_error error_float_offset "data_offsets that are not two integers" "$M/float_offset"
expect_error error_string_offset "data_offsets that are not two integers" "$M/string_offset"
expect_error error_bool_in_shape "h\.0\.attn\.bias has a shape that is not a list of integers" "$M/bool_shape"
expect_error error_buffer_byte_count "h\.0\.attn\.bias has offsets .*: 1 bytes, but BOOL shape \[2\] is 2 bytes" "$M/buffer_bytes"
expect_error error_unknown_dtype "h\.0\.attn\.bias has no safetensors dtype" "$M/unknown_dtype"
expect_error error_duplicate_json_key "key 'wte\.weight' appears twice" "$M/duplicate_key"
expect_error error_name_with_and_without_prefix "h\.0\.ln_1\.weight is stored both with and without" "$M/prefixed"
expect_error error_header_beyond_file "header length 1000000000 exceeds the file" "$M/header_beyond_file"
expect_error error_deep_header "model\.safetensors: JSON nested too deeply" "$M/deep"
expect_error error_nonfinite "h\.1\.attn\.c_proj\.weight has 3 non-finite values .*\(2 NaN, 1 infinite\)" "$M/nonfinite"
expect_error error_config_int32 "config\.json: n_embd is 2147483648, more than" "$M/huge_embd"
expect_error error_config_beyond_weights "config\.json: .* at least [0-9]+ bytes; .*model\.safetensors has [0-9]+ bytes" "$M/many_layers"
for D in 6 20 256; do
    expect_error "error_head_size_$D" "config\.json: head size $D must be a multiple of 8 and at most 128" "$M/head$D"
done
expect_error error_nan_tied_needs_allow_nonfinite "tensor wte\.weight has 2 non-finite values .*\(2 NaN, 0 infinite\)" "$M/nan_tied"
check_errors
check shapes shapes "$BIN"
import_hf import_bool_buffer "$M/bool_buffer" "$TMP/bool_buffer.bin" && same_file import_accepts_bool_buffer "$TMP/a2.bin" "$TMP/bool_buffer.bin"
import_hf import_nonfinite "$M/nonfinite" "$TMP/nonfinite.bin" --allow-nonfinite &&
    py_check import_allow_nonfinite "$TMP/nonfinite.bin" <<'PY'
import sys, numpy as np
n = np.count_nonzero(~np.isfinite(np.fromfile(sys.argv[1], np.float32, offset=1024)))
print("ok" if n == 3 else "%d non-finite values imported, want 3" % n)
PY
# A tied head stored bit for bit as an embedding that holds NaN is the embedding (NaN != NaN as values).
import_hf import_nan_tied "$M/nan_tied" "$TMP/nan_tied.bin" --allow-nonfinite &&
    py_check import_tied_head_with_nan "$TMP/nan_tied.bin" <<'PY'
import sys, numpy as np
n = np.count_nonzero(np.isnan(np.fromfile(sys.argv[1], np.float32, offset=1024)))
print("ok" if n == 2 else "%d NaN imported, want wte's 2" % n)
PY
# Exporting NaN and infinity warns first, naming the tensor and the counts, and writes them as they are:
# the folder imports back to the same file.
run export_nonfinite "$PYTHON" scripts/export_hf.py "$TMP/nonfinite.bin" "$TMP/hf_nonfinite" &&
    t_check export_warns_nonfinite "grep -q '^warning: tensor h\.1\.attn\.c_proj\.weight has 2 NaN and 1 infinite values of 4096' \
        '$TMP/export_nonfinite.log' && [ \$(grep -c '^warning: tensor' '$TMP/export_nonfinite.log') = 1 ]" "$(cat "$TMP/export_nonfinite.log")" &&
    import_hf import_nonfinite_back "$TMP/hf_nonfinite" "$TMP/nonfinite_back.bin" --allow-nonfinite &&
    same_file export_nonfinite_roundtrip "$TMP/nonfinite.bin" "$TMP/nonfinite_back.bin"

# Without PyTorch, which scripts/install_deps.sh run does not install: a torch package that fails to import
# comes first on PYTHONPATH. A safetensors folder exports and imports back; pytorch_model.bin is one error
# line naming PyTorch, and nothing written.
mkdir -p "$TMP/notorch/torch" && echo 'raise ImportError("No module named torch (hidden by t_hf.sh)")' > "$TMP/notorch/torch/__init__.py"
notorch=(env PYTHONPATH="$TMP/notorch" "$PYTHON")
if "${notorch[@]}" -c 'import torch' 2> /dev/null; then t_fail torch_hidden "PYTHONPATH=$TMP/notorch still imports torch"
else
    run export_without_torch "${notorch[@]}" scripts/export_hf.py "$A" "$TMP/hf_notorch" &&
        run import_without_torch "${notorch[@]}" scripts/import_hf.py "$TMP/hf_notorch" "$TMP/notorch.bin" &&
        same_file roundtrip_without_torch "$A" "$TMP/notorch.bin"
    "${notorch[@]}" scripts/import_hf.py "$TMP/v/pt" "$TMP/notorch_pt.bin" > /dev/null 2> "$TMP/notorch_pt.err"; rc=$?
    t_check import_pytorch_model_bin_without_torch "[ $rc = 1 ] && [ \$(wc -l < '$TMP/notorch_pt.err') = 1 ] &&
        grep -q '^error: .*pt/pytorch_model\.bin: reading it needs PyTorch' '$TMP/notorch_pt.err' && [ ! -e '$TMP/notorch_pt.bin' ]" \
        "rc=$rc, stderr: $(head -c 300 "$TMP/notorch_pt.err")"
fi

# The model file is renamed over OUT at the end: OUT naming one of the inputs (or a link to one) is refused,
# and the input is left as it was.
for out in model.safetensors config.json link.bin; do
    own=$TMP/own_${out%.*}
    cp -r "$TMP/hf_a" "$own" && ln -s "$own/model.safetensors" "$own/link.bin"
    "$PYTHON" scripts/import_hf.py "$own" "$own/$out" > /dev/null 2> "$own.err"; rc=$?
    t_check "import_refuses_overwriting_its_input_${out%.*}" "[ $rc = 1 ] && [ \$(wc -l < '$own.err') = 1 ] &&
        grep -q '^error: .*is the input' '$own.err' && cmp -s '$TMP/hf_a/model.safetensors' '$own/model.safetensors' &&
        cmp -s '$TMP/hf_a/config.json' '$own/config.json'" "rc=$rc, stderr: $(head -c 300 "$own.err")"
done

# export_hf.py never mixes with what OUTDIR holds: a non-empty folder is refused; --force removes the files
# a Hugging Face loader would read instead of the new ones (shards and their index, pytorch_model.bin,
# tokenizer.json) and keeps the rest.
mkdir "$TMP/stale"
for f in README.md tokenizer.json model-00001-of-00002.safetensors model.safetensors.index.json pytorch_model.bin; do
    echo old > "$TMP/stale/$f"
done
cp -r "$TMP/stale" "$TMP/stale.before"
"$PYTHON" scripts/export_hf.py "$A" "$TMP/stale" > /dev/null 2> "$TMP/stale.err"; rc=$?
t_check export_refuses_nonempty_folder "[ $rc = 1 ] && [ \$(wc -l < '$TMP/stale.err') = 1 ] &&
    grep -q '^error: .*stale: is not empty' '$TMP/stale.err' && diff -r '$TMP/stale.before' '$TMP/stale' > /dev/null" \
    "rc=$rc, stderr: $(head -c 300 "$TMP/stale.err")"
run export_force "$PYTHON" scripts/export_hf.py "$A" "$TMP/stale" --force &&
    t_check export_force_removes_stale_hf_files "[ \"\$(cd '$TMP/stale' && LC_ALL=C ls -A | tr '\n' ' ')\" = 'README.md config.json generation_config.json merges.txt model.safetensors vocab.json ' ]" \
        "$TMP/stale holds: $(ls -A "$TMP/stale" | tr '\n' ' ')" &&
    import_hf import_force "$TMP/stale" "$TMP/force.bin" && same_file roundtrip_after_force "$A" "$TMP/force.bin"
# --force does not remove the model file being exported.
mkdir "$TMP/own_export" && cp "$A" "$TMP/own_export/pytorch_model.bin"
"$PYTHON" scripts/export_hf.py "$TMP/own_export/pytorch_model.bin" "$TMP/own_export" --force > /dev/null 2> "$TMP/own_export.err"; rc=$?
t_check export_refuses_removing_its_input "[ $rc = 1 ] && grep -q '^error: .*pytorch_model.bin: is the input' '$TMP/own_export.err' &&
    cmp -s '$A' '$TMP/own_export/pytorch_model.bin'" "rc=$rc, stderr: $(head -c 300 "$TMP/own_export.err")"

# A failed export or import leaves nothing: a full disk (a file size limit: Python ignores SIGXFSZ, so the
# write fails with EFBIG) into a new folder whose parents are new too, a failed --force export into a full
# folder, and SIGINT or SIGTERM arriving mid-export (sent by the process to itself once model.safetensors is
# written).
fails_cleanly() {   # name, pattern, folder that must end as it began (a copy: FOLDER.before), command...
    local name=$1 pattern=$2 keep=$3 rc; shift 3
    "$@" > /dev/null 2> "$TMP/$name.err"; rc=$?
    t_check "$name" "[ $rc = 1 ] && [ \$(wc -l < '$TMP/$name.err') = 1 ] && grep -Eq '^error: .*$pattern' '$TMP/$name.err' &&
        diff -r '$keep.before' '$keep' > /dev/null" "rc=$rc, stderr: $(head -c 300 "$TMP/$name.err"); $keep holds: $(ls -A "$keep" | tr '\n' ' ')"
}
mkdir "$TMP/full" "$TMP/full.before"
fails_cleanly export_full_disk_leaves_nothing "cannot write .*File too large" "$TMP/full" \
    bash -c 'ulimit -f 64 && exec "$@"' - "$PYTHON" scripts/export_hf.py "$A" "$TMP/full/new/hf"
fails_cleanly import_full_disk_leaves_nothing "full/a\.bin: cannot write \(File too large\)" "$TMP/full" \
    bash -c 'ulimit -f 64 && exec "$@"' - "$PYTHON" scripts/import_hf.py "$TMP/hf_a" "$TMP/full/a.bin"
cp -r "$TMP/stale" "$TMP/full_force" && cp -r "$TMP/stale" "$TMP/full_force.before"
fails_cleanly export_full_disk_keeps_folder "cannot write .*File too large" "$TMP/full_force" \
    bash -c 'ulimit -f 64 && exec "$@"' - "$PYTHON" scripts/export_hf.py "$B" "$TMP/full_force" --force
cat > "$TMP/interrupt.py" <<'PY'
"""export_hf.py ARGS... that sends itself SIG (INT or TERM) once model.safetensors is written."""
import os, runpy, signal, sys
sys.path.append("scripts")
import hf_format
sig, write_json = getattr(signal, "SIG" + sys.argv[1]), hf_format.write_json
signal.signal(signal.SIGINT, signal.default_int_handler)   # as Python sets it unless launched ignored (a background job)
def signalled(*args):
    os.kill(os.getpid(), sig)
    write_json(*args)
hf_format.write_json = signalled
sys.argv = ["scripts/export_hf.py"] + sys.argv[2:]
runpy.run_path("scripts/export_hf.py", run_name="__main__")
PY
for sig in INT TERM; do
    mkdir "$TMP/sig$sig" "$TMP/sig$sig.before"
    fails_cleanly "export_sig${sig,,}_leaves_nothing" "interrupted" "$TMP/sig$sig" \
        "$PYTHON" "$TMP/interrupt.py" $sig "$A" "$TMP/sig$sig/hf"
done
t_finish
