"""Speculative decoding on Hugging Face causal LMs: one propose -> verify -> commit step shared
by every method; methods differ only in the drafter.

- :func:`generate`: the one-call API; :func:`make_drafter`: a drafter by its registry name
  (:mod:`specdec_kernels.drafters`, the one list of drafters, their options and classes).
- Drafters: :class:`DraftModelDrafter`, :class:`SelfSpeculativeDrafter`,
  :class:`PromptLookupDrafter`, :class:`LookaheadDrafter`, :class:`JacobiDrafter`,
  :class:`MedusaDrafter`, :class:`BlockwiseDrafter`, :class:`RetrievalDrafter`,
  :class:`QuantizedSelfDrafter`, :class:`TokenRecyclingDrafter`, :class:`SuffixDrafter` (with
  an opt-in :class:`SuffixMemory` of earlier outputs), :class:`MultiDrafter` (several merged
  into one cost-budgeted tree, :class:`TreeBudget`) (subclass :class:`Drafter` for more; what a
  drafter can get from the step is documented in :mod:`~specdec_kernels.decoding.drafter`).
- Acceptance rules a proposal carries: :data:`LOSSLESS` (default), :class:`Typical`,
  :data:`GREEDY` (:mod:`~specdec_kernels.decoding.acceptance`).
- :class:`Engine`, :class:`ModelRunner`, :class:`KVCache`: the parts, for harnesses.
"""

from specdec_kernels.decoding.acceptance import GREEDY, LOSSLESS, AcceptanceRule, Typical
from specdec_kernels.decoding.api import DRAFTER_NAMES, GenerationOutput, generate, make_drafter
from specdec_kernels.decoding.cache import KVCache
from specdec_kernels.decoding.chain_drafter import AutoregressiveDrafter
from specdec_kernels.decoding.draft_model import DraftModelDrafter
from specdec_kernels.decoding.drafter import (
    ChainProposal,
    DecodeState,
    Drafter,
    ExtraRows,
    NoDrafter,
    Proposal,
    StepOutcome,
    TreeProposal,
)
from specdec_kernels.decoding.budget import AcceptanceStats, TreeBudget
from specdec_kernels.decoding.eagle import EagleDrafter
from specdec_kernels.decoding.medusa import BlockwiseDrafter, MedusaDrafter
from specdec_kernels.decoding.multi import MultiDrafter
from specdec_kernels.decoding.quantized import QuantizedSelfDrafter
from specdec_kernels.decoding.retrieval import RetrievalDrafter
from specdec_kernels.decoding.suffix import SuffixDrafter, SuffixMemory
from specdec_kernels.decoding.token_recycling import TokenRecyclingDrafter
from specdec_kernels.decoding.engine import Engine, EngineOutput, Generation, StopCriteria
from specdec_kernels.decoding.factory import DrafterContext
from specdec_kernels.decoding.lookahead import JacobiDrafter, LookaheadDrafter
from specdec_kernels.decoding.prompt_lookup import PromptLookupDrafter
from specdec_kernels.decoding.runner import FeatureSpec, ModelRunner
from specdec_kernels.decoding.self_speculative import SelfSpeculativeDrafter
from specdec_kernels.decoding.stats import RequestStats, RunStats

__all__ = [
    "DRAFTER_NAMES",
    "GREEDY",
    "LOSSLESS",
    "AcceptanceRule",
    "AcceptanceStats",
    "AutoregressiveDrafter",
    "BlockwiseDrafter",
    "ChainProposal",
    "DecodeState",
    "DraftModelDrafter",
    "Drafter",
    "DrafterContext",
    "EagleDrafter",
    "Engine",
    "EngineOutput",
    "ExtraRows",
    "FeatureSpec",
    "Generation",
    "GenerationOutput",
    "JacobiDrafter",
    "KVCache",
    "LookaheadDrafter",
    "MedusaDrafter",
    "ModelRunner",
    "MultiDrafter",
    "NoDrafter",
    "PromptLookupDrafter",
    "Proposal",
    "QuantizedSelfDrafter",
    "RequestStats",
    "RetrievalDrafter",
    "RunStats",
    "SelfSpeculativeDrafter",
    "StepOutcome",
    "StopCriteria",
    "SuffixDrafter",
    "SuffixMemory",
    "TokenRecyclingDrafter",
    "TreeBudget",
    "TreeProposal",
    "Typical",
    "generate",
    "make_drafter",
]
