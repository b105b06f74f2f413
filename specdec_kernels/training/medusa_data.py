"""Self-distillation data for Medusa heads: the frozen target answers prompts made here, and
the final-norm hidden states of its own decoding are recorded through the engine's
target-features doorway (no second forward).

Prompts come from a topic list and request templates written for this package (never from
the benchmark prompts). A second stage builds prompts around the target's own first-stage
answers (summarize, translate, answer from a passage, rewrite), so the data also holds long
inputs of the kinds a user sends.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from specdec_kernels.decoding.drafter import NoDrafter

__all__ = ["CHUNK_SUFFIX", "FeatureRecorder", "chunk_path", "first_stage_prompts",
           "generate_chunk", "load_cache", "load_chunk", "refuse_pickles", "save_chunk",
           "second_stage_prompts"]

#: Cache chunks are safetensors files (tensors plus a JSON header): loading one cannot run
#: code, unlike a pickle (``torch.save``), so a cache folder from anywhere is safe to reuse.
CHUNK_SUFFIX = ".safetensors"

#: The ``format`` field of a chunk's metadata.
CHUNK_FORMAT = "specdec_kernels.medusa.cache/1"

#: Files that an older version wrote (or anyone could plant): pickles, never loaded.
_PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".bin")

TOPICS = [
    "photosynthesis", "black holes", "the French Revolution", "machine learning", "volcanoes",
    "the stock market", "climate change", "the human immune system", "ancient Rome",
    "renewable energy", "the water cycle", "quantum computing", "the Renaissance",
    "honey bees", "electric cars", "the printing press", "sleep", "coffee", "the Moon landing",
    "blockchain", "vaccines", "the Great Wall of China", "jazz music", "plate tectonics",
    "the internet", "dinosaurs", "meditation", "the Amazon rainforest", "inflation",
    "the Olympic Games", "DNA", "social media", "the Silk Road", "recycling", "earthquakes",
    "chess", "the solar system", "nutrition", "the Industrial Revolution", "coral reefs",
    "artificial intelligence ethics", "public speaking", "time management", "gardening",
    "the history of writing", "bridges", "antibiotics", "the ocean tides", "origami",
    "democracy", "supply and demand", "the human brain", "space telescopes", "baking bread",
    "the Roman alphabet", "wind turbines", "migration of birds", "the Cold War", "cryptography",
    "marathon training", "the periodic table", "smartphones", "rainbows", "ancient Egypt",
    "vitamins", "3D printing", "the theory of evolution", "libraries", "deserts", "robots",
    "personal finance", "the Eiffel Tower", "music theory", "glaciers", "electricity",
    "the Byzantine Empire", "video games", "tea", "language learning", "magnetism",
    "the Mediterranean diet", "hurricanes", "Shakespeare", "satellites", "friendship",
    "job interviews", "composting", "the speed of light", "mountains", "trains",
    "the Maya civilization", "cloud computing", "photography", "wolves", "soap",
    "the history of medicine", "urban planning", "chocolate", "the Pythagorean theorem",
    "prime numbers", "probability", "spreadsheets", "first aid", "penguins", "the violin",
]

TEMPLATES = [
    "Explain {topic} to a high school student.",
    "Write a short essay about {topic}.",
    "What are the main advantages and disadvantages of {topic}?",
    "Give me five interesting facts about {topic}.",
    "Write a short poem about {topic}.",
    "How would you describe {topic} to a child?",
    "Write a blog post introduction about {topic}.",
    "What are common misconceptions about {topic}?",
    "Summarize the history of {topic} in a few paragraphs.",
    "Create a study plan for learning about {topic}.",
    "Write a dialogue between a teacher and a student about {topic}.",
    "What questions would an expert ask about {topic}? Answer two of them.",
    "Compare {topic} and {other}.",
    "Write a short story that involves {topic}.",
    "List the steps someone should follow to get started with {topic}.",
    "Why is {topic} important today?",
]

MATH_TEMPLATES = [
    "A shop sells {a} apples per day. How many apples does it sell in {b} days? "
    "Explain step by step.",
    "If a train travels {a} kilometers in {b} hours, what is its average speed? "
    "Show your reasoning.",
    "Tom has {a} marbles and gives {b} to his friend. Then he buys twice as many as he has "
    "left. How many marbles does he have now? Think step by step.",
    "What is {a} multiplied by {b}? Show the steps.",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
    "Solve for x: {a}x + {b} = {c}. Explain each step.",
]

LANGUAGES = ["French", "German", "Spanish", "Italian", "Portuguese"]


def first_stage_prompts(count: int, seed: int = 0) -> list:
    """``count`` varied requests from the topic list and the templates (math included)."""
    rng = random.Random(seed)
    prompts: dict = {}
    while len(prompts) < count:
        if rng.random() < 0.15:
            a, b = rng.randint(3, 90), rng.randint(2, 40)
            prompt = rng.choice(MATH_TEMPLATES).format(a=a, b=b, c=a * 3 + b)
        else:
            topic, other = rng.sample(TOPICS, 2)
            prompt = rng.choice(TEMPLATES).format(topic=topic, other=other)
        prompts[prompt] = None
    return list(prompts)


def _sentences(text: str) -> list:
    parts = [s.strip() for s in text.replace("\n", " ").split(". ")]
    return [s.rstrip(".") + "." for s in parts if 30 <= len(s) <= 240]


def second_stage_prompts(answers: list, count: int, seed: int = 1) -> list:
    """Requests built around the target's own answers: summarize, translate, answer from a
    passage, rewrite, continue."""
    rng = random.Random(seed)
    usable = [a.strip() for a in answers if len(a.strip()) > 200]
    prompts = []
    while usable and len(prompts) < count:
        text = rng.choice(usable)
        kind = rng.randrange(5)
        if kind == 0:
            prompts.append(f"Summarize the following text in two sentences.\n\n{text}")
        elif kind == 1:
            sentences = _sentences(text) or [text[:200]]
            chosen = " ".join(sentences[:2])
            prompts.append(f"Translate to {rng.choice(LANGUAGES)}: {chosen}")
        elif kind == 2:
            sentence = rng.choice(_sentences(text) or [text[:120]])
            words = sentence.split()
            subject = " ".join(words[: min(4, len(words))])
            prompts.append(
                f"Use the passage to answer the question.\n\nPassage: {text}\n\n"
                f"Question: What does the passage say about {subject.lower().rstrip('.,')}?"
            )
        elif kind == 3:
            prompts.append(f"Rewrite the following text as a bulleted list.\n\n{text}")
        else:
            prompts.append(f"Continue this text with one more paragraph:\n\n{text}")
    return prompts


class FeatureRecorder(NoDrafter):
    """Plain decoding that records, through the target-features doorway, the final-norm
    hidden state behind every emitted token (the prefill's last row, then each step's row)."""

    name = "feature-recorder"
    target_features = "final_norm"

    def start(self, state) -> None:
        self.ids = list(range(state.batch))
        self.steps: list = []  # (request ids, [B, H] features)
        self._take(state)

    def _take(self, state) -> None:
        self.steps.append((list(self.ids), state.last_features().to(torch.float16).cpu()))

    def accept(self, state, outcome) -> None:
        self._take(state)

    def select_requests(self, keep: list) -> None:
        self.ids = [self.ids[b] for b in keep]

    def per_request(self, batch: int) -> list:
        rows = [[] for _ in range(batch)]
        for ids, feats in self.steps:
            for b, r in enumerate(ids):
                rows[r].append(feats[b])
        return [torch.stack(r) for r in rows]


def generate_chunk(
    loaded,
    batch: list,
    path: Path,
    *,
    max_new_tokens: int,
    sampled_fraction: float = 0.5,
    temperature: float = 0.8,
    top_p: float = 0.95,
    seed: int = 0,
    log=print,
) -> None:
    """Generate answers to one batch of prompts and write them as the cache chunk ``path``.

    A chunk holds, per request, ``tokens`` (the pending token, then every new
    token) and ``features`` ``[len(tokens), H]`` float16, where ``features[j]`` is the
    final-norm hidden state whose logits gave ``tokens[j]``; plus the prompt text and whether
    the answer was sampled (:func:`save_chunk`'s format). An existing chunk is kept (the run
    resumes).
    """
    from specdec_kernels.training.selfdistill import answer_prompts

    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    recorder = FeatureRecorder()
    ids, sampled, out, seconds = answer_prompts(
        loaded, batch, recorder, max_new_tokens=max_new_tokens,
        sampled_fraction=sampled_fraction, temperature=temperature, top_p=top_p, seed=seed)
    feats = recorder.per_request(len(batch))
    records = []
    for i, prompt in enumerate(batch):
        tokens = [ids[i][-1]] + out.tokens[i]
        # The last emitted token never ran through the target: features stop before it.
        f = feats[i][: len(tokens)]
        records.append({
            "prompt": prompt, "sampled": sampled[i], "tokens": tokens[: len(f)],
            "features": f.clone(), "text": out.text[i],
        })
    save_chunk(records, path)
    new = sum(len(t) for t in out.tokens)
    log(f"{path.name}: {len(batch)} prompts, {new} tokens, {seconds:.0f} s")


def chunk_path(folder: Path, index: int) -> Path:
    """Where chunk ``index`` of a cache stage lives."""
    return Path(folder) / f"chunk_{index:04d}{CHUNK_SUFFIX}"


def save_chunk(records: list, path: Path) -> None:
    """Write records (see :func:`generate_chunk`) as one safetensors file: the tensors
    ``features`` ``[R, H]`` float16 and ``tokens`` ``[R]`` int64 of all records end to end,
    ``lengths`` ``[n]`` int64; the prompts, texts and sampled flags as JSON in its header.
    Written to a temporary name and renamed, so a chunk is whole or absent."""
    from safetensors.torch import save_file

    tensors = {
        "features": torch.cat([r["features"].to(torch.float16) for r in records]).contiguous(),
        "tokens": torch.tensor([t for r in records for t in r["tokens"]], dtype=torch.int64),
        "lengths": torch.tensor([len(r["tokens"]) for r in records], dtype=torch.int64),
    }
    texts = [{"prompt": r["prompt"], "sampled": bool(r["sampled"]), "text": r["text"]}
             for r in records]
    metadata = {"format": CHUNK_FORMAT, "records": json.dumps(texts)}
    tmp = Path(str(path) + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.rename(path)


def _bad_chunk(path: Path, why: str) -> ValueError:
    return ValueError(
        f"{path} is not a Medusa cache chunk of this package ({why}); delete it and run the "
        "data phase again (`specdec train medusa --data ...` regenerates missing chunks)"
    )


def load_chunk(path: Path) -> list:
    """The records of one chunk written by :func:`save_chunk`, each checked against the
    format (tensor names, dtypes and shapes, the JSON header).

    Raises
    ------
    ValueError
        The file is not a readable safetensors file, or its contents do not match the format.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError) as error:
        raise _bad_chunk(path, f"unreadable as safetensors: {error}") from None
    if metadata.get("format") != CHUNK_FORMAT:
        raise _bad_chunk(path, f"format {metadata.get('format')!r}, expected {CHUNK_FORMAT!r}")
    if sorted(tensors) != ["features", "lengths", "tokens"]:
        raise _bad_chunk(path, f"tensors {sorted(tensors)}, expected features, lengths, tokens")
    features, tokens, lengths = tensors["features"], tensors["tokens"], tensors["lengths"]
    rows = features.shape[0] if features.dim() == 2 else -1
    if (features.dtype != torch.float16 or rows < 0 or tokens.dtype != torch.int64
            or lengths.dtype != torch.int64 or tokens.shape != (rows,) or lengths.dim() != 1
            or bool((lengths < 1).any()) or int(lengths.sum()) != rows):
        raise _bad_chunk(
            path, f"features {features.dtype} {tuple(features.shape)}, tokens {tokens.dtype} "
            f"{tuple(tokens.shape)}, lengths {lengths.dtype} {tuple(lengths.shape)} do not fit "
            "together"
        )
    try:
        texts = json.loads(metadata.get("records", ""))
    except json.JSONDecodeError as error:
        raise _bad_chunk(path, f"its records header is not JSON: {error}") from None
    fields = {"prompt": str, "sampled": bool, "text": str}
    if (not isinstance(texts, list) or len(texts) != lengths.numel() or not all(
            isinstance(t, dict) and all(isinstance(t.get(k), kind) for k, kind in fields.items())
            for t in texts)):
        raise _bad_chunk(path, f"its header does not describe {lengths.numel()} records with "
                         f"{sorted(fields)}")
    records = []
    for text, feats, ids in zip(texts, features.split(lengths.tolist()),
                                tokens.split(lengths.tolist())):
        records.append({**text, "tokens": ids.tolist(), "features": feats})
    return records


def refuse_pickles(folder: Path) -> None:
    """Raise ``ValueError`` when ``folder`` holds pickle files (e.g. chunks an older version
    wrote with ``torch.save``): loading a pickle can run any code, so none is ever read."""
    found = sorted(p for p in Path(folder).glob("*") if p.suffix in _PICKLE_SUFFIXES)
    if found:
        raise ValueError(
            f"{found[0]} is a pickle file (an older cache format, or planted): pickles can run "
            f"code when loaded, so this package never reads them. Move or delete the "
            f"{len(found)} pickle file(s) in {folder}; the data phase writes chunks as "
            f"*{CHUNK_SUFFIX}"
        )


def load_cache(folder: Path) -> list:
    """Every record of every chunk in ``folder`` (see :func:`generate_chunk`).

    Raises
    ------
    ValueError
        The folder holds a pickle (never loaded, see :func:`refuse_pickles`) or a chunk that
        does not match the format (see :func:`load_chunk`).
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    refuse_pickles(folder)
    records = []
    for path in sorted(folder.glob(f"chunk_*{CHUNK_SUFFIX}")):
        records.extend(load_chunk(path))
    return records


def answers_of(folder: Path) -> list:
    return [r["text"] for r in load_cache(folder)]


def write_manifest(folder: Path, info: dict) -> None:
    (Path(folder) / "manifest.json").write_text(json.dumps(info, indent=1))
