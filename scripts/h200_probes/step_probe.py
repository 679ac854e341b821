"""Step costs of one engine on the H200: a prefill-only pass (max_tokens=1) of n prompts of 512 ids, and a decode
step at b rows (from (t(65 tokens) - t(1 token)) / 64). Usage: step_probe.py ENGINE [MODEL_DIR]"""
import json, os, sys, time
import torch

def main():
    engine = sys.argv[1]
    if engine == "minisgl":
        from core import LLM, SamplingParams
        llm = LLM("random:qwen3-0.6b", max_running_req=256, max_seq_len=4096, page_size=128,
                  **json.loads(os.environ.get("MINISGL_KW", "{}")))
        mk = lambda mt: SamplingParams(max_tokens=mt, temperature=0.6, ignore_eos=True, seed=None)
    else:
        from minisgl.core import SamplingParams
        from minisgl.llm import LLM
        llm = LLM(sys.argv[2], max_seq_len_override=4096, max_extend_tokens=16384, cuda_graph_max_bs=256,
                  page_size=256, attention_backend="fi", use_dummy_weight=True)
        mk = lambda mt: SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=mt)
    shift = [0]
    def prompts(n, length=512):
        shift[0] += 1
        return [[(shift[0] * 7919 + i * 104729 + j) % 10000 for j in range(length)] for i in range(n)]
    def timed(ps, mt):
        torch.cuda.synchronize(); t = time.perf_counter()
        llm.generate(ps, [mk(mt) for _ in ps]); torch.cuda.synchronize()
        return time.perf_counter() - t
    timed(prompts(4), 4); timed(prompts(64), 8); timed(prompts(256, 128), 8)
    out = {"engine": engine}
    for n in (1, 2, 4, 8, 16):
        out[f"prefill_{n * 512}"] = round(1e3 * min(timed(prompts(n), 1) for _ in range(3)), 2)
    for b in (32, 128, 256):
        one = min(timed(prompts(b, 64), 1) for _ in range(2))
        many = min(timed(prompts(b, 64), 65) for _ in range(2))
        out[f"decode_{b}"] = round(1e3 * (many - one) / 64, 3)
    print(json.dumps(out))

main()
