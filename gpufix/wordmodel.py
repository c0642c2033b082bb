"""The word model: which failure a log's words are most like, for wordings no rule knows.

Rules name failures by their exact wording; a wording no rule has seen (a library's own message, a
framework's paraphrase) falls through to "not a GPU problem" even when every line around it speaks of
CUDA, NaN or the loader. The word model reads the whole excerpt as a reader would: a multinomial logistic
regression over its words and word pairs, trained on the development part of the real-world corpus and
the wording inventories (`python -m gpufix.rules.wordmodel_train`, which needs torch; this module needs
nothing). The engine asks it only when no rule found a GPU failure, and speaks only when its probability
clears the threshold measured on held-out development cases, through the category's family rule with
low confidence (engine.py).

The model is data (`rules/wordmodel.json`): features, their weights per category, the threshold and
what it was trained on. Nothing in it is executed.
"""

from __future__ import annotations

import math
import os
import re
from array import array
from zlib import crc32

TYPE_CHECKING = False  # typing costs start-up time; annotations are strings (PEP 563)
if TYPE_CHECKING:
    from typing import Any, NamedTuple
else:
    from gpufix.tuples import NamedTuple

MODEL_FILE = "wordmodel.json"
FORMAT = 1
EVIDENCE_LINES = 3  # lines quoted for a guess: those whose words weigh most towards it

_TOKEN = re.compile(r"[a-z][a-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def tokens(text: str) -> list[str]:
    """Lower-case words of two or more letters and digits, starting with a letter (numbers, paths'
    punctuation and single letters carry no wording). Colour codes are gone already (logscan.keep_tail)."""
    return _TOKEN.findall(text.lower())


def features(text: str) -> set[str]:
    """The words of `text` and each pair of neighbouring words ("out memory" reads as one thing), once as
    written and once with CamelCase identifiers split ("cudaErrorMemoryAllocation" also reads "memory allocation",
    words a wording no rule knows shares with known ones)."""
    found: set[str] = set()
    for words in (tokens(text), tokens(_CAMEL.sub(" ", text))):
        found.update(words)
        found.update(f"{a} {b}" for a, b in zip(words, words[1:]))
    return found


class Guess(NamedTuple):
    category: str
    probability: float
    lines: list[tuple[str, int, str]]  # (source, line, text) of the lines that weigh most towards it


class WordModel:
    """A trained model: `guess(tails)` says which category an excerpt reads as, and how sure."""

    def __init__(self, categories: list[str], bias: list[float], threshold: float, other: str,
                 arrays: tuple[bytes, array, array, array, array, array]) -> None:
        self.categories = categories
        self.bias = bias
        self.threshold = threshold
        self.other = categories.index(other)
        # Flat arrays, not a dict of lists (40 ms to load) nor a list of names (2 ms to split): a diagnosis looks
        # up a few hundred features, so the compact copy loads as it is stored and each lookup hashes.
        # names: every feature's UTF-8 bytes, feature k at names[name_at[k]:name_at[k + 1]];
        # slots: an open-addressing table, crc32(name) & (len - 1), linear probing, -1 empty, else k;
        # feature k's weights: cats/values[weight_at[k]:weight_at[k + 1]] (only those that matter).
        self._names, self._name_at, self._slots, self._weight_at, self._cats, self._values = arrays
        n = len(self._name_at) - 1
        size = len(self._slots)
        # ValueError unless the arrays agree: a damaged file or copy must not fail a diagnosis later. (The
        # compact copy, written from a checked file, gets these checks only; scanning its arrays costs 3 ms.)
        if not (n >= 0 and len(self._weight_at) == n + 1 and self._name_at[-1] == len(self._names)
                and self._weight_at[-1] == len(self._cats) == len(self._values) and size > n
                and size & (size - 1) == 0 and len(self.bias) == len(self.categories)):
            raise ValueError("word model arrays do not agree")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WordModel:
        """From the shipped JSON (`format`, `categories`, `other`, `bias`, `threshold`, `weights`:
        {feature: [category index, weight, ...]})."""
        from zlib import crc32

        if data.get("format") != FORMAT:
            raise ValueError(f"word model format {data.get('format')!r}, expected {FORMAT}")
        encoded = [name.encode() for name in data["weights"]]
        if any(not 0 <= int(c) < len(data["categories"]) for pairs in data["weights"].values() for c in pairs[0::2]):
            raise ValueError("word model weights name a category it does not have")
        name_at, weight_at, cats, values = array("I", [0]), array("I", [0]), array("B"), array("f")
        size = 1 << max(4, (2 * len(encoded)).bit_length())  # at most half full: short probes
        slots = array("i", [-1]) * size
        for k, (name, pairs) in enumerate(zip(encoded, data["weights"].values())):
            if len(pairs) % 2:
                raise ValueError(f"word model feature {name!r}: category and weight pairs expected")
            name_at.append(name_at[-1] + len(name))
            cats.extend(int(c) for c in pairs[0::2])
            values.extend(float(v) for v in pairs[1::2])
            weight_at.append(len(cats))
            slot = crc32(name) & (size - 1)
            while slots[slot] != -1:
                slot = (slot + 1) & (size - 1)
            slots[slot] = k
        return cls(list(data["categories"]), [float(b) for b in data["bias"]], float(data["threshold"]),
                   str(data.get("other", "other")), (b"".join(encoded), name_at, slots, weight_at, cats, values))

    def to_bytes(self) -> bytes:
        import marshal

        return marshal.dumps((FORMAT, self.categories, self.bias, self.threshold, self.categories[self.other],
                              self._names, *(a.tobytes() for a in (self._name_at, self._slots, self._weight_at,
                                                                   self._cats, self._values))))

    @classmethod
    def from_bytes(cls, blob: bytes) -> WordModel:
        import marshal

        version, categories, bias, threshold, other, names, *arrays = marshal.loads(blob)
        if version != FORMAT:
            raise ValueError("stale word model cache")
        name_at, slots, weight_at, cats, values = (array(code, raw) for code, raw in zip("IiIBf", arrays))
        return cls(categories, bias, threshold, other, (names, name_at, slots, weight_at, cats, values))

    def weights(self, feature: str) -> list[tuple[int, float]]:
        """(category index, weight) of a feature; empty for a feature the model does not weigh."""
        name = feature.encode()
        mask = len(self._slots) - 1
        slot = crc32(name) & mask
        while (k := self._slots[slot]) != -1:
            if self._names[self._name_at[k]:self._name_at[k + 1]] == name:
                lo, hi = self._weight_at[k], self._weight_at[k + 1]
                return list(zip(self._cats[lo:hi], self._values[lo:hi]))
            slot = (slot + 1) & mask
        return []

    def probabilities(self, found: set[str]) -> list[float]:
        """P(category | words) for every category, in `categories` order."""
        known = [w for w in map(self.weights, found) if w]
        scale = 1 / math.sqrt(len(found)) if found else 0.0  # each excerpt's features count as a unit vector
        logits = list(self.bias)
        for pairs in known:
            for category, weight in pairs:
                logits[category] += weight * scale
        top = max(logits)
        exps = [math.exp(v - top) for v in logits]
        total = sum(exps)
        return [e / total for e in exps]

    def guess(self, tails: list[tuple[str, int, str]]) -> Guess | None:
        """The GPU category the excerpts read as, when its probability clears the threshold; else None.
        `tails`: (source, first line number, text) of each input's end."""
        text = "\n".join(t for _s, _l, t in tails)
        if not text.strip():
            return None
        probs = self.probabilities(features(text))
        best = max((i for i in range(len(probs)) if i != self.other), key=probs.__getitem__)
        if probs[best] < self.threshold:
            return None
        return Guess(self.categories[best], probs[best], self._lines(tails, best))

    def _lines(self, tails: list[tuple[str, int, str]], category: int) -> list[tuple[str, int, str]]:
        """The lines whose words weigh most towards `category` against `other`, in input order."""
        scored = []
        for source, first, text in tails:
            for offset, line in enumerate(text.split("\n")):
                weight = 0.0
                for feature in features(line):
                    for c, w in self.weights(feature):
                        weight += w if c == category else -w if c == self.other else 0.0
                if weight > 0:
                    scored.append((weight, source, first + offset, line.rsplit("\r", 1)[-1].strip()))
        best = sorted(scored, key=lambda s: -s[0])[:EVIDENCE_LINES]
        best = [b for b in best if b[0] >= best[0][0] / 4]  # not a line that only leans the same way
        return [(source, line, text) for _w, source, line, text in sorted(best, key=lambda s: (s[1], s[2]))]


_LOADED: dict[str, WordModel | str | None] = {}  # path -> the model, why it could not be read, or None: no file


def model_in(rules_dir: str) -> WordModel | str | None:
    """The word model shipped in a rule pack's folder, loaded once per process (from a compact copy in the
    rule cache folder when one matches the file's size and time). None when the pack has none, and a sentence
    saying why when the file is there but unreadable: either way the rules alone decide."""
    path = os.path.join(rules_dir, MODEL_FILE)
    if path not in _LOADED:
        _LOADED[path] = _load(path)
    return _LOADED[path]


def _load(path: str) -> WordModel | str | None:
    from gpufix.rules.loader import cache_dir

    try:
        st = os.stat(path)
    except OSError:
        return None
    # (a path may hold any bytes: surrogate-escaped, and no newline in the key line)
    key = f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{FORMAT}".encode("utf-8", "surrogateescape").replace(b"\n", b" ")
    cached = os.path.join(cache_dir(), f"wordmodel-{crc32(key):08x}.bin")
    try:
        with open(cached, "rb") as f:
            stored_key, blob = f.read().split(b"\n", 1)
        if stored_key == key:
            return WordModel.from_bytes(blob)
    except (OSError, ValueError, EOFError, TypeError):
        pass  # no copy yet, or a stale one
    try:
        import json

        with open(path, "rb") as f:
            model = WordModel.from_dict(json.loads(f.read()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{path}: the word model could not be read ({type(exc).__name__}: {exc}); the rules alone decided"
    try:
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        tmp = f"{cached}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(key + b"\n" + model.to_bytes())
        os.replace(tmp, cached)
        _prune(os.path.dirname(cached))
    except OSError:
        pass  # a read-only home: load from JSON each time
    return model


def _prune(folder: str, keep: int = 4) -> None:
    """Keep the newest few compact copies: each retrained model or upgrade writes one (about 1 MB)."""
    names = [n for n in os.listdir(folder) if n.startswith("wordmodel-") and n.endswith(".bin")]
    for name in sorted(names, key=lambda n: os.stat(os.path.join(folder, n)).st_mtime, reverse=True)[keep:]:
        os.remove(os.path.join(folder, name))
