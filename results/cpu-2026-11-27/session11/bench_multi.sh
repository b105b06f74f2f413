#!/usr/bin/env bash
# The merged prophet with its default prophets, then with EAGLE added to them (Medusa and
# EAGLE in one merged drafter, possible since this session), 36 dev prompts, greedy, AVX-512
# path; one run each, each with its own plain loop.
set -e
R=results/cpu-2026-11-27/session11
B="python3 -m specdec_kernels.bench --max-new-tokens 128 --prompts-per-category 6"
$B --methods ours-autoregressive,ours-multi --out "$R/bench6-multi-default"
$B --methods ours-autoregressive,ours-multi --prophets prompt-lookup,suffix,token-recycling,retrieval,medusa,eagle --out "$R/bench6-multi-medusa-eagle"
