"""Where do Tachyon's and transformers' greedy tokens part on the GPU? Small model, fp32, several paths."""

from __future__ import annotations

import random
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, ".")
from tachyon import LLM, SamplingParams  # noqa: E402

print("tf32 matmul", torch.backends.cuda.matmul.allow_tf32, "cudnn", torch.backends.cudnn.allow_tf32,
      "precision", torch.get_float32_matmul_precision(), "transformers", transformers.__version__)
cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                               num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096,
                               initializer_range=0.06, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False)
torch.manual_seed(0)
hf = transformers.LlamaForCausalLM(cfg).to("cuda").eval()
d = tempfile.mkdtemp()
hf.save_pretrained(d)
print(open(d + "/config.json").read())
print("hf rope", hf.model.rotary_emb.inv_freq[:4].tolist(), getattr(hf.config, "rope_parameters", None))
rng = random.Random(1)
prompts = [[rng.randrange(100, 30000) for _ in range(rng.randrange(65, 400))] for _ in range(8)]
N = 8


def hf_loop(model, p, dev):
    out, ids = [], torch.tensor([p], device=dev)
    with torch.no_grad():
        o = model(ids, use_cache=True)
        for _ in range(N):
            out.append(int(o.logits[0, -1].argmax()))
            o = model(torch.tensor([[out[-1]]], device=dev), past_key_values=o.past_key_values, use_cache=True)
    return out


def hf_full(model, p, dev):  # no cache at all: recompute the whole sequence each step
    out = []
    with torch.no_grad():
        for _ in range(N):
            out.append(int(model(torch.tensor([p + out], device=dev)).logits[0, -1].argmax()))
    return out


hf.generation_config.eos_token_id = None
res = {"hf_loop": [hf_loop(hf, p, "cuda") for p in prompts], "hf_full": [hf_full(hf, p, "cuda") for p in prompts]}
res["hf_generate"] = [hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=N, do_sample=False,
                                  pad_token_id=0)[0, len(p):].tolist() for p in prompts]
hf_cpu = hf.to("cpu")
res["hf_cpu_loop"] = [hf_loop(hf_cpu, p, "cpu") for p in prompts[:4]]
del hf, hf_cpu
for name, kw in (("tachyon_triton_graphs", {}), ("tachyon_torch_eager", dict(attention_backend="torch", enforce_eager=True))):
    llm = LLM(model=d, dtype="float32", swap_space=0, gpu_memory_utilization=0.3, max_model_len=2048, **kw)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=N, ignore_eos=True))
    res[name] = [o.outputs[0].token_ids for o in outs]
    one = llm.generate([{"prompt_token_ids": p} for p in prompts[:1]], SamplingParams(temperature=0, max_tokens=N, ignore_eos=True))
    res[name + "_alone"] = [one[0].outputs[0].token_ids]
    del llm
    import gc
    gc.collect()
    torch.cuda.empty_cache()
for k, v in res.items():
    print(f"{k:28s}", v[0], v[1] if len(v) > 1 else "")
