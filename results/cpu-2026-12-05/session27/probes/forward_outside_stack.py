"""The int4 quantized-self draft's one-token forward (default model, prefix 256, bfloat16 K/V)
under cProfile: what runs outside decoder_stack_ and the LM head."""
import cProfile, os, pstats, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../cpu-2026-12-04/session25/probes"))
import torch
from probe_lib import int4_draft

runner, cache, tokens, step = int4_draft()
with torch.inference_mode():
    for _ in range(20):
        step()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(200):
        step()
    profile.disable()
pstats.Stats(profile).sort_stats("tottime").print_stats(25)
