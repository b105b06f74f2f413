import json, numpy as np, torch
from collections import Counter, defaultdict
from safetensors.torch import load_file
t = load_file('/tmp/devfeat/cache4/chunk_0000.safetensors')
toks, offs, pl = t['tokens'].tolist(), t['offsets'].tolist(), t['prompt_lens'].tolist()
for store in ['/work/main/specdec_kernels/data/datastore/smollm2-135m-instruct', '/work/i24/datastore-self']:
    corpus = np.load(store + '/tokens.npy')
    nxt = defaultdict(Counter)
    for a, b in zip(corpus[:-1], corpus[1:]): nxt[int(a)][int(b)] += 1
    prior = {v: [w for w, _ in c.most_common(8)] for v, c in nxt.items()}
    res = {k: [0, 0] for k in ('seen', 'unseen-none', 'unseen-prior')}
    hit1 = {'req': 0, 'req+prior': 0}; hit4 = {'req': 0, 'req+prior': 0}; n = 0
    for i in range(len(pl)):
        seq = toks[offs[i]:offs[i+1]]; p = pl[i]
        succ = defaultdict(list)
        for a, b in zip(seq[:p-1], seq[1:p]):
            if b in succ[a]: succ[a].remove(b)
            succ[a].insert(0, b)
        for j in range(p, len(seq) - 1):
            v, w = seq[j], seq[j+1]
            own = succ.get(v, [])
            both = own + [x for x in prior.get(v, []) if x not in own]
            n += 1
            hit1['req'] += own[:1] == [w]; hit4['req'] += w in own[:4]
            hit1['req+prior'] += both[:1] == [w]; hit4['req+prior'] += w in both[:4]
            if w in succ[v]: succ[v].remove(w)
            succ[v].insert(0, w)
    print(store.split('/')[-1], n, {k: round(v / n, 3) for k, v in hit1.items()}, {k: round(v / n, 3) for k, v in hit4.items()})
