"""Asset builders above the decoding layer: self-distillation data from a frozen target
(:mod:`.selfdistill`, its prompts in :mod:`.prompts`), the trainers of the drafters that learn
from it (:mod:`.eagle`, :mod:`.medusa`), and retrieval corpora and datastores
(:mod:`.retrieval_corpus`, ``specdec datastore``: :mod:`.datastore_cli`). The decoding layer
never imports this package: what it loads (weights, configs, datastores) is defined beside the
drafters that use it (:mod:`specdec_kernels.medusa`, :mod:`specdec_kernels.eagle`,
:mod:`specdec_kernels.retrieval`)."""
