#!/usr/bin/env python3
"""The peer we measure ourselves against on the GPU machine: Hugging Face transformers + PEFT.

Python here is a benchmark harness of the peer only (the GPU image has PyTorch, transformers and PEFT); ggml-rp
itself has no Python. tools/gpu-check.sh runs two commands:

  bench   LoRA finetuning steps of transformers' Qwen3 at a given shape (random weights, bf16), PEFT LoRA on
          every linear layer, gradient checkpointing, SDPA attention (flash attention when installed), the same
          sequence length, batch, micro-batches and rank as our run: tokens/s (median of the steps after the
          first) and peak GPU memory.
  check   the same weights through both engines: our base GGUF (f32/f16/bf16 tensors, read here with a few lines
          of struct/numpy: the gguf package is not in the image), our adapter, and the step rp-finetune dumped
          with --dump-grads (the batch, loss scale, loss, first sequence's logits, LoRA gradients) are loaded into
          transformers' Qwen3 with PEFT; its logits, loss and LoRA gradients are compared with ours.
  gguf    prints a GGUF file's tensors (name, type, shape, checksum): a self-test of the reader, no torch needed.
  hf      our exports read by transformers + PEFT: the cases bench/gpu/hf_cases.sh makes (a model of each
          architecture as rp-gguf export-hf writes it, a LoRA adapter as export-peft writes it, our logits with that
          adapter, texts with our token ids) loaded with AutoModelForCausalLM, PeftModel and AutoTokenizer; logits
          and ids compared with ours.

Every command writes one JSON object (--json FILE) and prints a line per result.
"""
import argparse
import json
import math
import struct
import sys
import time

# ---- GGUF (formats.md): header, metadata, tensor infos, data ---------------------------------------------------

GGUF_TYPES = {0: ("F32", 4), 1: ("F16", 2), 30: ("BF16", 2), 26: ("I32", 4)}
_VALUE = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class Gguf:
    """A GGUF file: kv (dict), tensors (name -> (type, ne list in ggml order, offset, nbytes)), raw bytes."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.data = f.read()
        self.path = path
        self.pos = 0
        if self.data[:4] != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        self.pos = 4
        version, = self._u("I")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version}")
        n_tensors, n_kv = self._u("Q"), self._u("Q")
        n_tensors, n_kv = n_tensors[0], n_kv[0]
        self.kv = {}
        for _ in range(n_kv):
            key = self._str()
            self.kv[key] = self._value(self._u("I")[0])
        infos = []
        for _ in range(n_tensors):
            name = self._str()
            nd, = self._u("I")
            ne = [self._u("Q")[0] for _ in range(nd)]
            t, = self._u("I")
            off, = self._u("Q")
            infos.append((name, t, ne, off))
        align = int(self.kv.get("general.alignment", 32))
        base = (self.pos + align - 1) // align * align
        self.tensors = {}
        for name, t, ne, off in infos:
            if t not in GGUF_TYPES:
                self.tensors[name] = (t, ne, base + off, 0)
                continue
            n = 1
            for x in ne:
                n *= x
            self.tensors[name] = (t, ne, base + off, n * GGUF_TYPES[t][1])

    def _u(self, fmt):
        v = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return v

    def _str(self):
        n, = self._u("Q")
        s = self.data[self.pos:self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return s

    def _value(self, t):
        if t == 8:
            return self._str()
        if t == 9:
            et, n = self._u("I")[0], self._u("Q")[0]
            return [self._value(et) for _ in range(n)]
        return self._u(_VALUE[t])[0]

    def raw(self, name):
        t, ne, off, nbytes = self.tensors[name]
        return t, ne, self.data[off:off + nbytes]

    def array(self, name):
        """numpy float32 (or int32) array with numpy shape = reversed ggml ne (HF's [out, in] for weights)."""
        import numpy as np
        t, ne, b = self.raw(name)
        shape = list(reversed(ne))
        if t == 0:
            return np.frombuffer(b, dtype=np.float32).reshape(shape).copy()
        if t == 1:
            return np.frombuffer(b, dtype=np.float16).astype(np.float32).reshape(shape)
        if t == 30:
            u = np.frombuffer(b, dtype=np.uint16).astype(np.uint32) << 16
            return u.view(np.float32).reshape(shape)
        if t == 26:
            return np.frombuffer(b, dtype=np.int32).reshape(shape).copy()
        raise ValueError(f"{self.path}: tensor {name} has type {t}: only f32/f16/bf16/i32 are read here")


def cmd_gguf(a):
    g = Gguf(a.file)
    out = {"file": a.file, "kv": len(g.kv), "tensors": []}
    for name, (t, ne, off, nbytes) in g.tensors.items():
        b = g.data[off:off + nbytes]
        out["tensors"].append({"name": name, "type": GGUF_TYPES.get(t, (str(t),))[0], "ne": ne,
                               "sum": sum(b) % 1000003})
        print(f"{name:40s} {GGUF_TYPES.get(t, (str(t),))[0]:5s} {ne}")
    return out


# ---- transformers' Qwen3 from a config / from our GGUF ----------------------------------------------------------

SHAPES = {  # the real shapes (n_embd, layers, heads, kv heads, head_dim, n_ff)
    "qwen3-0.6b": (1024, 28, 16, 8, 128, 3072),
    "qwen3-1.7b": (2048, 28, 16, 8, 128, 6144),
}


def qwen3_config(n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, vocab, rope_theta, eps, ctx, tied):
    from transformers import Qwen3Config
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=n_embd, intermediate_size=n_ff, num_hidden_layers=n_layer,
                      num_attention_heads=n_head, num_key_value_heads=n_head_kv, head_dim=head_dim, rms_norm_eps=eps,
                      max_position_embeddings=ctx, tie_word_embeddings=tied, attention_bias=False,
                      rope_theta=rope_theta)
    # transformers 5 keeps the rope settings in rope_parameters; older versions read rope_theta.
    if hasattr(cfg, "rope_parameters") and isinstance(getattr(cfg, "rope_parameters"), dict):
        cfg.rope_parameters["rope_theta"] = rope_theta
    return cfg


def attention_impl():
    try:
        import flash_attn  # noqa: F401
        return "flash_attention_2"
    except ImportError:
        return "sdpa"


# ggml names -> transformers names (qwen3: no Q/K permutation; ne [in, out] = HF [out, in] after the reversal).
def hf_name(ggml):
    if ggml == "token_embd.weight":
        return "model.embed_tokens.weight"
    if ggml == "output_norm.weight":
        return "model.norm.weight"
    if ggml == "output.weight":
        return "lm_head.weight"
    parts = ggml.split(".")
    if parts[0] != "blk":
        return None
    i, rest = parts[1], ".".join(parts[2:])
    m = {"attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
         "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
         "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
         "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
         "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
         "ffn_down.weight": "mlp.down_proj.weight"}
    return f"model.layers.{i}.{m[rest]}" if rest in m else None


def peft_module(ggml_base):
    """blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj (the module PEFT wraps)."""
    n = hf_name(ggml_base)
    return n[:-len(".weight")] if n else None


def lora_model(model, rank, alpha, targets="all-linear"):
    from peft import LoraConfig, get_peft_model
    cfg = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets, bias="none",
                     init_lora_weights=True)
    return get_peft_model(model, cfg)


# ---- bench ------------------------------------------------------------------------------------------------------

def cmd_bench(a):
    import torch
    from transformers import Qwen3ForCausalLM
    n_embd, n_layer, n_head, n_kv, hd, n_ff = SHAPES[a.shape]
    torch.manual_seed(0)
    cfg = qwen3_config(n_embd, n_layer, n_head, n_kv, hd, n_ff, a.vocab_size, 1e6, 1e-6, 40960, True)
    impl = attention_impl()
    cfg._attn_implementation = impl
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.gradient_checkpointing_enable()
    model.enable_input_require_grads()
    model = lora_model(model, a.rank, a.alpha)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    mb = a.batch // a.micro_batches
    times = []
    torch.cuda.reset_peak_memory_stats()
    for step in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.micro_batches):
            ids = torch.randint(0, a.vocab_size, (mb, a.seq_len), device="cuda")
            out = model(input_ids=ids, labels=ids)
            (out.loss / a.micro_batches).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        print(f"peft step {step + 1}/{a.steps}: {a.batch * a.seq_len / times[-1]:.0f} tok/s, loss {out.loss.item():.3f}")
    steady = sorted(times[1:] or times)
    med = steady[len(steady) // 2] if len(steady) % 2 else 0.5 * (steady[len(steady) // 2 - 1] + steady[len(steady) // 2])
    return {"engine": "transformers + peft", "attention": impl, "shape": a.shape, "params": params,
            "seq_len": a.seq_len, "batch": a.batch, "micro_batches": a.micro_batches, "rank": a.rank,
            "tokens_per_s": round(a.batch * a.seq_len / med, 1), "first_step_s": round(times[0], 3),
            "peak_memory_bytes": torch.cuda.max_memory_allocated()}


# ---- check ------------------------------------------------------------------------------------------------------

def rel_l2(a, b):
    import torch
    d = torch.linalg.vector_norm((a - b).double())
    n = torch.linalg.vector_norm(b.double())
    return float(d / n) if n > 0 else float(d)


def cmd_check(a):
    import numpy as np
    import torch
    from transformers import Qwen3ForCausalLM
    base, adapter, dump = Gguf(a.base), Gguf(a.adapter), Gguf(a.dump)
    kv = base.kv
    arch = kv.get("general.architecture")
    if arch != "qwen3":
        raise ValueError(f"{a.base}: architecture {arch}; the check builds transformers' Qwen3")
    emb = base.array("token_embd.weight")
    tied = "output.weight" not in base.tensors
    cfg = qwen3_config(int(kv["qwen3.embedding_length"]), int(kv["qwen3.block_count"]),
                       int(kv["qwen3.attention.head_count"]), int(kv["qwen3.attention.head_count_kv"]),
                       int(kv["qwen3.attention.key_length"]), int(kv["qwen3.feed_forward_length"]), emb.shape[0],
                       float(kv.get("qwen3.rope.freq_base", 1e6)), float(kv["qwen3.attention.layer_norm_rms_epsilon"]),
                       int(kv["qwen3.context_length"]), tied)
    cfg._attn_implementation = "eager"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    state = {}
    for name in base.tensors:
        hn = hf_name(name)
        if hn:
            state[hn] = torch.from_numpy(base.array(name))
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (tied and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weights: missing {missing}, unexpected {unexpected}")
    pairs = {}
    for name in adapter.tensors:
        if name.endswith(".lora_a"):
            pairs[name[:-len(".lora_a")]] = name
    r = adapter.array(next(iter(pairs.values()))).shape[0]
    alpha = float(adapter.kv["adapter.lora.alpha"])
    targets = sorted({peft_module(b).split(".")[-1] for b in pairs})
    model = lora_model(model, r, alpha, targets)
    with torch.no_grad():
        for b in pairs:
            mod = model.get_submodule("base_model.model." + peft_module(b))
            mod.lora_A["default"].weight.copy_(torch.from_numpy(adapter.array(b + ".lora_a")))
            mod.lora_B["default"].weight.copy_(torch.from_numpy(adapter.array(b + ".lora_b")))
    model = model.cuda()
    ids = torch.from_numpy(dump.array("batch.inputs").astype(np.int64)).cuda()     # [n_seq, seq_len]
    labels = torch.from_numpy(dump.array("batch.labels").astype(np.int64)).cuda()  # aligned: label t for position t
    logits = model(input_ids=ids).logits.float()                                   # [n_seq, T, V]
    ours_logits = torch.from_numpy(dump.array("batch.logits0")).cuda()             # [T, V]
    loss_scale = float(dump.kv["rp.loss_scale"])
    mask = labels >= 0
    ce = torch.nn.functional.cross_entropy(logits[mask], labels[mask], reduction="sum") * loss_scale
    ce.backward()
    res = {"engine": "transformers Qwen3 + peft, f32, eager attention", "loss_ours": float(dump.kv["rp.loss"]),
           "loss_theirs": float(ce), "loss_rel_error": abs(float(ce) - float(dump.kv["rp.loss"])) / abs(float(ce)),
           "logits_max_abs_diff": float((logits[0] - ours_logits).abs().max()),
           "logits_range": float(logits[0].max() - logits[0].min()), "lora_rank": r, "gradients": {}}
    worst = 0.0
    for b in pairs:
        mod = model.get_submodule("base_model.model." + peft_module(b))
        for ours, theirs in ((b + ".lora_a", mod.lora_A["default"].weight.grad),
                             (b + ".lora_b", mod.lora_B["default"].weight.grad)):
            e = rel_l2(torch.from_numpy(dump.array(ours)).cuda(), theirs)
            res["gradients"][ours] = e
            worst = max(worst, e)
    res["gradient_worst_rel_l2"] = worst
    res["ok"] = res["loss_rel_error"] < 1e-4 and worst < 1e-3 and res["logits_max_abs_diff"] < 1e-3 * max(1.0, res["logits_range"])
    print(f"check: loss ours {res['loss_ours']:.6f} theirs {res['loss_theirs']:.6f}, logits max |d| "
          f"{res['logits_max_abs_diff']:.3g} (range {res['logits_range']:.3g}), worst LoRA gradient rel L2 {worst:.3g}")
    return res


# ---- hf -------------------------------------------------------------------------------------------------------

def cmd_hf(a):
    """Our exports in transformers + PEFT: each case (bench/gpu/hf_cases.sh) loads its model from our export-hf
    directory (config.json, safetensors) with AutoModelForCausalLM, our export-peft adapter on it with PeftModel, and
    compares the logits of the dumped batch's first sequence with ours; its tokenizer files with AutoTokenizer, and
    compares the ids of the case's texts with ours."""
    import glob
    import os
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    res = {"engine": "transformers (AutoModelForCausalLM, eager attention, f32) + PEFT (PeftModel), AutoTokenizer",
           "device": device, "cases": {}}
    for case in a.cases:
        name = os.path.basename(case.rstrip("/"))
        r = {}
        try:
            model = AutoModelForCausalLM.from_pretrained(f"{case}/hf", torch_dtype=torch.float32, attn_implementation="eager")
            r["class"] = type(model).__name__
            if os.path.isdir(f"{case}/peft"):
                from peft import PeftModel
                model = PeftModel.from_pretrained(model, f"{case}/peft")
            model = model.to(device).eval()
            dump = Gguf(f"{case}/step.gguf")
            ids = torch.from_numpy(dump.array("batch.inputs").astype(np.int64))[:1].to(device)
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0].float()
            ours = torch.from_numpy(dump.array("batch.logits0")).to(device)
            r["logits_max_abs_diff"] = float((logits - ours).abs().max())
            r["logits_range"] = float(ours.max() - ours.min())
            r["logits_ok"] = r["logits_max_abs_diff"] <= 1e-3 * max(1.0, r["logits_range"])
        except Exception as e:  # one case's failure is its own
            r["logits_ok"] = False
            r["error"] = f"{type(e).__name__}: {e}"
        try:
            tok = AutoTokenizer.from_pretrained(f"{case}/hf")
            bad = []
            texts = sorted(glob.glob(f"{case}/texts/*.txt"))
            for t in texts:
                with open(t, encoding="utf-8") as f:
                    text = f.read()
                with open(t[:-len(".txt")] + ".ids") as f:
                    want = [int(x) for x in f.read().split()]
                got = tok(text, add_special_tokens=False)["input_ids"]
                if got != want:
                    bad.append({"text": text, "ours": want, "theirs": got})
            r["tokenizer_texts"] = len(texts)
            r["tokenizer_ok"] = bool(texts) and not bad
            r["tokenizer_mismatches"] = bad[:3]
        except Exception as e:
            r["tokenizer_ok"] = False
            r["tokenizer_error"] = f"{type(e).__name__}: {e}"
        res["cases"][name] = r
        print(f"hf {name}: logits max |d| {r.get('logits_max_abs_diff')} (range {r.get('logits_range')}), "
              f"tokenizer {'ok' if r['tokenizer_ok'] else 'MISMATCH'}{'; ' + r['error'] if 'error' in r else ''}")
    res["ok"] = bool(res["cases"]) and all(c["logits_ok"] and c["tokenizer_ok"] for c in res["cases"].values())
    return res


def finite_or_null(x):
    """x with every non-finite float (NaN, +-inf), at any depth, replaced by None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite_or_null(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_or_null(v) for v in x]
    return x


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--shape", default="qwen3-1.7b", choices=sorted(SHAPES))
    b.add_argument("--vocab-size", type=int, default=151936)
    b.add_argument("--seq-len", type=int, default=512)
    b.add_argument("--batch", type=int, default=8)
    b.add_argument("--micro-batches", type=int, default=4)
    b.add_argument("--steps", type=int, default=4)
    b.add_argument("--rank", type=int, default=32)
    b.add_argument("--alpha", type=float, default=16)
    c = sub.add_parser("check")
    c.add_argument("--base", required=True)
    c.add_argument("--adapter", required=True)
    c.add_argument("--dump", required=True)
    g = sub.add_parser("gguf")
    g.add_argument("file")
    h = sub.add_parser("hf")
    h.add_argument("cases", nargs="+", help="case directories made by bench/gpu/hf_cases.sh")
    for s in (b, c, g, h):
        s.add_argument("--json")
    a = p.parse_args()
    try:
        res = {"bench": cmd_bench, "check": cmd_check, "gguf": cmd_gguf, "hf": cmd_hf}[a.cmd](a)
    except Exception as e:  # the harness reports, gpu-check.sh goes on
        res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(f"peft_baseline {a.cmd}: {res['error']}", file=sys.stderr)
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            # JSON has no NaN or infinity (Python's json writes them unless told not to): they become null.
            json.dump(finite_or_null(res), f, indent=1, allow_nan=False, default=str)
        import os
        os.replace(a.json + ".tmp", a.json)
    return 0 if res.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
