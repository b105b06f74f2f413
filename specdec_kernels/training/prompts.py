"""The prompts the self-distillation data is made from
(:func:`specdec_kernels.training.selfdistill.build_data`; also the generated retrieval corpus).

They come from a topic list and request templates written for this package, never from the
benchmark prompts. The first stage asks for essays, explanations, poems and small sums; the
second builds requests around the target's own first-stage answers (summarize, translate,
answer from a passage, rewrite), so the data also holds long inputs; the task stage adds the
other forms users send an assistant (code, short factual questions, multi-step word problems,
translations into English, ``Summarize:`` over long text, extraction into JSON). The target
also writes requests of its own (:func:`specdec_kernels.training.selfdistill.self_written_prompts`);
:func:`shares_benchmark_text` keeps the benchmark's questions out of those.
"""

from __future__ import annotations

import random

__all__ = ["BENCHMARK_NGRAM", "benchmark_ngrams", "first_stage_prompts", "second_stage_prompts",
           "shares_benchmark_text", "task_prompts"]

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


#: Programming requests (the task, then a language that suits it).
CODING_TASKS = [
    ("returns the n-th Fibonacci number", "Python"),
    ("checks whether a string is a palindrome", "Python"),
    ("reverses a linked list", "C++"), ("counts the words in a text file", "Python"),
    ("merges two sorted arrays into one sorted array", "Java"),
    ("finds the longest common prefix of a list of strings", "Python"),
    ("validates an email address with a regular expression", "JavaScript"),
    ("implements binary search on a sorted list", "Python"),
    ("computes the factorial of a number recursively", "C"),
    ("removes duplicates from a list while keeping the order", "Python"),
    ("converts a temperature from Celsius to Fahrenheit", "JavaScript"),
    ("finds the second largest number in an array", "Java"),
    ("implements a stack with push, pop and peek", "Python"),
    ("checks whether two strings are anagrams", "Python"),
    ("computes the greatest common divisor of two integers", "C++"),
    ("reads a CSV file and prints the average of one column", "Python"),
    ("sorts a list of dictionaries by a given key", "Python"),
    ("implements quicksort", "C++"), ("counts the vowels in a string", "JavaScript"),
    ("returns all prime numbers below n", "Python"),
    ("finds the maximum depth of a binary tree", "Java"),
    ("flattens a nested list", "Python"), ("transposes a matrix", "Python"),
    ("implements a queue using two stacks", "C++"),
    ("checks whether a number is a power of two", "C"),
    ("shows a button that changes the page's background color", "HTML and JavaScript"),
    ("selects the ten customers with the highest total orders", "SQL"),
    ("parses a JSON string and prints its keys", "Python"),
    ("finds the most frequent element in a list", "Python"),
    ("implements a simple class for a bank account with deposit and withdraw", "Python"),
    ("detects a cycle in a linked list", "Java"),
    ("computes the edit distance between two strings", "Python"),
]

CODING_TEMPLATES = [
    "Write a {language} function that {task}.",
    "Develop a {language} program that {task}.",
    "Implement a function in {language} that {task}. Explain how it works.",
    "Write code in {language} that {task}, with comments.",
]

#: Short factual questions in the style people type into a search box.
QUESTION_TEMPLATES = [
    "what is {topic}?", "who discovered {topic}?", "when did {topic} begin?",
    "where does {topic} come from?", "how does {topic} work?", "why is {topic} important?",
    "who is famous for {topic}?", "what is the main idea behind {topic}?",
]

NAMES = ["Maria", "James", "Aisha", "Chen", "Lucas", "Priya", "Omar", "Sofia", "Ben", "Yuki"]
ITEMS = [("notebooks", 3), ("cupcakes", 2), ("tickets", 12), ("books", 8), ("pens", 1),
         ("shirts", 15), ("plants", 6), ("bags of rice", 9)]

WORD_PROBLEMS = [
    "{name} buys {a} {item} at ${price} each and pays with a ${bill} bill. How much change "
    "does {name} get?",
    "{name} reads {a} pages a day for {b} days, then {c} pages a day for the next {b} days. "
    "How many pages did {name} read in total?",
    "A class has {a} students. {b} of them walk to school and half of the rest take the bus. "
    "How many students take the bus?",
    "{name} earns ${a} an hour and works {b} hours a week. After spending ${c} a week, how much "
    "does {name} save in 4 weeks?",
    "A farmer has {a} {item}. He sells {b} of them on Monday and twice as many on Tuesday. How "
    "many are left?",
    "{name} wants to buy {a} {item} that cost ${price} each. {name} has ${c}. How much more "
    "money does {name} need?",
]

EXTRACTION_TEMPLATES = [
    "Extract the names, places and numbers mentioned in the following text. Output in JSON "
    "format.\n{text}",
    "Identify the main topic and three key terms of the following text. Return the answer as "
    "a JSON object.\n{text}",
    "Read the text below and list every fact it states about {subject}, one per line.\n{text}",
    "Rate how positive the following text is on a scale of 1 to 5 and explain the rating.\n"
    "{text}",
]

#: Languages whose translations into English the task stage asks for (the sources are the
#: target's own translations from English made in earlier chunks).
SOURCE_LANGUAGES = ["German", "French", "Spanish"]


def _translations(sources: list) -> list:
    """``(language, text)`` of every earlier answer that translated into a source language."""
    found = []
    for prompt, answer in sources:
        for language in SOURCE_LANGUAGES:
            if (prompt.startswith(f"Translate to {language}:")
                    or prompt.startswith(f"Translate English to {language}:")):
                text = " ".join(answer.split())
                if 20 <= len(text) <= 400:
                    found.append((language, text))
    return found


def task_prompts(sources: list, count: int, seed: int = 2) -> list:
    """Requests in the forms users send an assistant, beside the first stage's essays: code,
    short factual questions, multi-step word problems, translations into English, news-style
    ``Summarize:`` requests over long text, answers from a passage, extraction into JSON.

    Parameters
    ----------
    sources : list of (str, str)
        ``(prompt, answer)`` pairs of earlier chunks: their answers are the long texts, and
        their translations from English (``Translate to German: ...``) become the sources of
        the translations into English. May be empty (the text-based kinds are skipped).
    count : int
        How many prompts.
    seed : int

    Returns
    -------
    list of str
    """
    rng = random.Random(seed)
    texts = [" ".join(a.split()) for _, a in sources if len(a.strip()) > 300]
    foreign = _translations(sources)
    prompts: list = []
    while len(prompts) < count:
        kind = rng.randrange(8)
        if kind == 0:
            task, language = rng.choice(CODING_TASKS)
            prompts.append(rng.choice(CODING_TEMPLATES).format(language=language, task=task))
        elif kind == 1:
            prompts.append(rng.choice(QUESTION_TEMPLATES).format(topic=rng.choice(TOPICS))
                           .capitalize())
        elif kind == 2:
            item, price = rng.choice(ITEMS)
            a, b, c = rng.randint(3, 40), rng.randint(2, 12), rng.randint(5, 60)
            prompts.append(rng.choice(WORD_PROBLEMS).format(
                name=rng.choice(NAMES), item=item, price=price, a=a, b=b, c=c,
                bill=(a * price // 50 + 1) * 50))
        elif kind == 3 and foreign:
            language, text = rng.choice(foreign)
            prompts.append(f"Translate {language} to English: {text}")
        elif kind == 3 or kind == 4:
            sentences = _sentences(rng.choice(texts)) if texts else []
            english = " ".join(sentences[:2]) or rng.choice(TEMPLATES).format(
                topic=rng.choice(TOPICS), other=rng.choice(TOPICS))
            prompts.append(f"Translate English to {rng.choice(SOURCE_LANGUAGES)}: {english}")
        elif not texts:
            continue
        elif kind == 5:
            prompts.append("Summarize: " + " ".join(rng.sample(texts, min(2, len(texts)))))
        elif kind == 6:
            text = rng.choice(texts)
            sentence = rng.choice(_sentences(text) or [text[:120]])
            subject = " ".join(sentence.split()[:4]).lower().rstrip(".,")
            prompts.append(f"{text}\nWhat does the text say about {subject}?")
        else:
            text = rng.choice(texts)
            subject = " ".join(text.split()[:3]).lower().rstrip(".,")
            prompts.append(rng.choice(EXTRACTION_TEMPLATES).format(text=text, subject=subject))
    return prompts


#: Words in a row that a self-written prompt may share with a benchmark prompt, less one: a
#: chat model may have seen the benchmark's questions in its own training and write them back,
#: and a prompt sharing a run this long is dropped.
BENCHMARK_NGRAM = 8


def _words(text: str) -> list:
    return "".join(c.lower() if c.isalnum() else " " for c in text).split()


def benchmark_ngrams(n: int = BENCHMARK_NGRAM) -> set:
    """Every run of ``n`` words (lower case, punctuation dropped) in every turn of the
    packaged benchmark prompts (``prompts_dev.jsonl``), and the whole word sequence of each
    turn shorter than that."""
    from specdec_kernels.data import load_prompts

    grams = set()
    for row in load_prompts():
        for turn in row["turns"]:
            words = _words(turn)
            grams.update(tuple(words[i : i + n]) for i in range(max(len(words) - n + 1, 1)))
    return grams


def shares_benchmark_text(text: str, grams: set, n: int = BENCHMARK_NGRAM) -> bool:
    """Whether ``text`` holds one of ``grams`` (:func:`benchmark_ngrams` of the same ``n``):
    a run of ``n`` words of a benchmark turn, or the words of a whole short turn."""
    words = _words(text)
    return any(tuple(words[i : i + size]) in grams
               for size in range(1, n + 1) for i in range(len(words) - size + 1))
