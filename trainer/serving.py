"""The servable DLRM: preprocessing, dictionary lookups and the model in one ``tf.Module``.

Everything a raw Criteo line needs on its way to a click probability is a TensorFlow op, so the
SavedModel written from this module (``trainer.export``) runs anywhere TensorFlow runs (Python,
TensorFlow Serving) without this project's code. The rules are those of the Spark job
(docs/spark_jobs.md, "Rules for every line"), applied to the same inputs with the same results:

- numericals: ``log(x + 3)`` for x > -3 (x as a double, the result rounded to float32, as Spark
  writes it), missing or x <= -3 -> 0; then rounded to float16 and back, because the model was
  trained on the binary dataset's float16 numericals;
- categoricals: 1-8 hex digits, any case, left-padded with zeros to 8 lowercase digits and
  looked up in the column's dictionary; unknown, rare (beyond the trained table) or missing
  values get id 0. A model trained on capped ids (``preprocess.ids: modulo``) has no
  dictionary: a value's id is its hex value modulo its column's cap (its table size), a
  missing value's 0, as ``spark_jobs.capped_ids`` gives them (``capped_ids`` below). One
  trained on contiguous ids (``preprocess.ids: contiguous``) looks its values up in the
  contiguous dictionaries by their rule (dlrm_contracts.contiguous_ids: missing is the value
  0, an unknown value is id 1, then the id modulo the table's rows, its cap);
- lines: a trailing ``\\n`` and then one trailing ``\\r`` are dropped; fields are split on tabs;
  fewer than 40 fields are padded with missing values; a line the Spark job would reject gets
  probability REJECTED_PROBABILITY (-1: not a probability, and valid JSON where NaN is not)
  and the Spark job's reason (``too_many_fields``, ``bad_label``,
  ``non_integer``, ``non_hex_categorical``), the first that applies.

The two signatures (names and tensors are the serving interface, documented in docs/trainer.md):
``serve_features(int_features int64 [n, 13], cat_features string [n, 26])`` and
``serve_lines(lines string [n], has_label bool [n])``, which is also ``serving_default``; both
return ``probability`` float32 [n]
and ``reject_reason`` string [n] ("" for a scored row); ``serve_lines`` also returns ``label``
int32 [n] (-1 when absent or rejected). A model trained on multi-hot rows holds each multi-hot
column's lookup table (one-hot id -> its row's k ids, the converters' materialization), so raw
values reach the rows the dataset held, and has one more signature, ``serve_multi_hot(
int_features int64 [n, 13], cat_ids int64 [n, sum(k)])``, taking those rows as the dataset
holds them. Every input and output has the batch as its first
dimension, so TensorFlow Serving's server-side batching can concatenate requests (it refuses
scalar inputs), and a REST response holds no NaN (which its JSON writer prints bare).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import tensorflow as tf

from dlrm_contracts.contiguous_ids import MISSING_VALUE, RARE_ID
from dlrm_contracts.schema import (
    BAD_LABEL,
    NON_HEX_CATEGORICAL,
    NON_INTEGER,
    NUM_CATEGORICAL,
    NUM_FIELDS,
    NUM_INTEGER,
    TOO_MANY_FIELDS,
)
from trainer.model import MLP, CrossNet, ModelDims, interaction, pooled_lookup

INT64_MAX_TAIL = 223_372_036_854_775_807  # 2**63 - 1 = 9 * 10**18 + this
_INTEGER = "-?[0-9]+"
_HEX = "[0-9a-fA-F]{1,8}"
# First line of every vocabulary file: takes line number (= id) 0, never equal to a normalised
# value (8 lowercase hex digits), so only unknown values get id 0 from the table's default.
VOCABULARY_HEADER = "<id 0: rare or missing>"
# A contiguous-id vocabulary's second line: id 1 (RARE_ID) is no value's, only the default's.
CONTIGUOUS_RARE_LINE = "<id 1: rare>"
# The probability of a row the Spark job would reject: outside [0, 1], and valid JSON.
REJECTED_PROBABILITY = -1.0
# serve_multi_hot's reason for a row holding an id its table has no row for
ID_OUT_OF_RANGE = "id_out_of_range"


def fits_int64(integers: tf.Tensor) -> tf.Tensor:
    """Whether strings matching ``-?[0-9]+`` hold a value in [-2**63, 2**63 - 1].

    Checked on the digits (leading zeros dropped) before any conversion: TensorFlow's
    string-to-number fails the whole batch on one overflowing value.
    """
    negative = tf.strings.substr(integers, 0, 1) == "-"
    digits = tf.strings.regex_replace(integers, "^-?0*", "")
    length = tf.strings.length(digits)
    at_limit = tf.equal(length, 19)
    nineteen = tf.where(at_limit, digits, "0000000000000000000")
    head = tf.strings.to_number(tf.strings.substr(nineteen, 0, 1), tf.int64)
    tail = tf.strings.to_number(tf.strings.substr(nineteen, 1, 18), tf.int64)
    tail_limit = INT64_MAX_TAIL + tf.cast(negative, tf.int64)
    fits_19 = (head < 9) | ((head == 9) & (tail <= tail_limit))
    return (length < 19) | (at_limit & fits_19)


def parse_integers(fields: tf.Tensor, missing: int) -> tuple[tf.Tensor, tf.Tensor]:
    """String fields -> (int64 values, missing ones = ``missing``; per row: all valid)."""
    empty = tf.equal(fields, "")
    matched = tf.strings.regex_full_match(fields, _INTEGER)
    valid = empty | (matched & fits_int64(tf.where(matched, fields, "0")))
    numbers = tf.strings.to_number(tf.where(valid & ~empty, fields, "0"), tf.int64)
    values = tf.where(empty | ~valid, tf.constant(missing, tf.int64), numbers)
    return values, tf.reduce_all(valid, axis=1)


def log_transform(values: tf.Tensor) -> tf.Tensor:
    """int64 [n, 13] -> float32 [n, 13] exactly as the training data saw them (see above)."""
    kept = values > -3
    safe = tf.where(kept, values, tf.zeros_like(values))
    logs = tf.cast(tf.math.log(tf.cast(safe, tf.float64) + 3.0), tf.float32)
    logs = tf.where(kept, logs, tf.zeros_like(logs))
    return tf.cast(tf.cast(logs, tf.float16), tf.float32)


def normalise_categoricals(fields: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """string [n, 26] -> (8 lowercase hex digits, missing mask, per row: all valid)."""
    missing = tf.equal(fields, "")
    valid = missing | tf.strings.regex_full_match(fields, _HEX)
    lower = tf.strings.lower(fields)
    padded = tf.strings.substr(tf.strings.join(["00000000", lower]), -8, 8)  # the last 8
    return padded, missing | ~valid, tf.reduce_all(valid, axis=1)


# The value of each of the 8 hex digits normalise_categoricals leaves, from its ASCII code.
_HEX_WEIGHTS = [16 ** (7 - i) for i in range(8)]


def hex_values(normalised: tf.Tensor) -> tf.Tensor:
    """string [...] of 8 lowercase hex digits -> their int64 value [...], exactly.

    TensorFlow's string-to-number reads decimal only (and a hash bucket is not the value), so
    the digits are taken as bytes and folded: '0'-'9' are 48-57, 'a'-'f' 97-102. Any other
    byte (a field already refused as non-hex) gives some number, never an error.
    """
    codes = tf.cast(tf.io.decode_raw(normalised, tf.uint8, fixed_length=8), tf.int64)
    digits = tf.where(codes >= ord("a"), codes - (ord("a") - 10), codes - ord("0"))
    return tf.reduce_sum(digits * tf.constant(_HEX_WEIGHTS, tf.int64), axis=-1)


def capped_ids(normalised: tf.Tensor, unusable: tf.Tensor, caps: Sequence[int]) -> tf.Tensor:
    """Capped ids (``preprocess.ids: modulo``, ``spark_jobs.capped_ids``): [n, 26] normalised
    values -> each one's hex value modulo its column's cap; 0 where ``unusable`` (missing, or
    not hex: such a row is refused anyway, as the preprocess rejects its line)."""
    ids = tf.math.floormod(hex_values(normalised), tf.constant(list(caps), tf.int64))
    return tf.where(unusable, tf.zeros_like(ids), ids)


def contiguous_ids(
    normalised: tf.Tensor, missing: tf.Tensor, vocabularies: Sequence, table_rows: Sequence[int]
) -> tf.Tensor:
    """Contiguous ids (dlrm_contracts.contiguous_ids): [n, 26] normalised values -> their ids;
    ``vocabularies`` (one hash table per column, default ``RARE_ID``) hold the dictionaries'
    ids, ``table_rows`` the tables' rows (the caps, or the highest id + 1)."""
    as_missing = tf.constant(f"{MISSING_VALUE:08x}")
    looked_up = tf.where(missing, as_missing, normalised)
    ids = tf.stack([vocabularies[j].lookup(looked_up[:, j]) for j in range(NUM_CATEGORICAL)], axis=1)
    return tf.math.floormod(ids, tf.constant(list(table_rows), tf.int64))


def split_lines(lines: tf.Tensor, has_label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Raw lines -> (string fields [n, 40] padded with "", per row: more than 40 fields).

    A line without its label (``has_label`` false for that row) is read as if the label field
    were there (and valid), so the same 40-field rules apply to both kinds of input.
    """
    lines = tf.strings.regex_replace(lines, "\n\\z", "")
    lines = tf.strings.regex_replace(lines, "\r\\z", "")
    lines = tf.where(has_label, lines, tf.strings.join(["0\t", lines]))
    ragged = tf.strings.split(lines, "\t")
    too_many = ragged.row_lengths() > NUM_FIELDS
    fields = ragged.to_tensor(default_value="", shape=[None, NUM_FIELDS])
    return fields, too_many


def first_reason(conditions: Sequence[tuple[str, tf.Tensor]]) -> tf.Tensor:
    """Per row, the name of the first condition that holds, or ""."""
    reason = tf.fill(tf.shape(conditions[0][1]), "")
    for name, holds in reversed(conditions):
        reason = tf.where(holds, name, reason)
    return reason


@dataclass(frozen=True)
class ServingWeights:
    """A checkpoint's model as the serving modules take it: whole tables (an iterable, so that
    each may be read as it is copied into its variable), both MLPs' weights, each table's
    [rows, 1] first-order weights (``dims.wide``; None without), the cross layers' weights
    (``dims.interaction`` dcn; None without)."""

    tables: Iterable[np.ndarray]
    bottom: dict[str, np.ndarray]
    top: dict[str, np.ndarray]
    wide: Sequence[np.ndarray] | None = None
    cross: dict[str, np.ndarray] | None = None


@dataclass(frozen=True)
class RawIds:
    """How a served model turns a raw value into its id: exactly one of ``vocabularies`` (a
    file per column) and ``caps`` (26 ints: the value modulo its column's cap);
    ``contiguous``: the vocabularies hold contiguous ids (line i: the value of id i)."""

    vocabularies: Sequence[Path] | None = None
    caps: Sequence[int] | None = None
    contiguous: bool = False


class ServingCore(tf.Module):
    """Whole tables, both MLPs, the cross layers of a DCN model and the wide weights: ids and
    numericals -> a click probability, with the trainer's own ops (so the same rounding)."""

    def __init__(self, dims: ModelDims, weights: ServingWeights, missing_integer: int):
        super().__init__(name="dlrm_serving")
        self.missing_integer = missing_integer
        self.tables = [
            tf.Variable(t, trainable=False, name=f"embedding_C{i + 1}") for i, t in enumerate(weights.tables)
        ]
        self.wide = [
            tf.Variable(w, trainable=False, name=f"wide_C{i + 1}") for i, w in enumerate(weights.wide or [])
        ]
        cross, top = weights.cross, weights.top
        self.bottom = self._mlp(NUM_INTEGER, dims.bottom_mlp, True, "bottom", weights.bottom)
        top_in = dims.top_input(NUM_CATEGORICAL + 1)
        self.cross = None
        if dims.interaction == "dcn":
            if cross is None:
                raise ValueError("a DCN model is served with its cross layers' weights (cross)")
            self.cross = CrossNet(top_in, dims.dcn_layers, dims.dcn_rank, 0, 0)
            for key, variable in self.cross.named_variables():
                variable.assign(cross[key])
        self.top = self._mlp(top_in, dims.top_mlp, False, "top", top)

    @staticmethod
    def _mlp(
        in_dim: int, sizes: tuple[int, ...], final_relu: bool, name: str, weights: dict[str, np.ndarray]
    ) -> MLP:
        """The trainer's MLP (same ops, so the same rounding) holding the checkpoint's weights."""
        mlp = MLP(in_dim, sizes, 0, 0, final_relu, name)
        for key, variable in mlp.named_variables():
            variable.assign(weights[key])
        return mlp

    def _probability_of_ids(self, integers: tf.Tensor, ids: Sequence[tf.Tensor]) -> tf.Tensor:
        """``ids``: per column [n] (one-hot) or [n, k] (multi-hot, pooled by sum)."""
        numerical = log_transform(integers)
        embedded = tf.stack([pooled_lookup(self.tables[j], ids[j]) for j in range(NUM_CATEGORICAL)], axis=1)
        bottom = self.bottom(numerical, tf.float32)
        features = tf.concat([bottom[:, None, :], embedded], axis=1)
        logits = self.top(interaction(features, self.cross, tf.float32), tf.float32)[:, 0]
        if self.wide:  # the top MLP's logit + the tables' weights, as in training
            # One reduction, not a chain of adds: graph rewriting may regroup an add_n
            # differently in each signature, and the signatures must agree to the bit.
            weights = tf.concat([pooled_lookup(w, ids[j]) for j, w in enumerate(self.wide)], axis=1)
            logits += tf.reduce_sum(weights, axis=1)
        return tf.sigmoid(logits)

    def _add_multi_hot_signature(self, multi_hot_sizes: Sequence[int]) -> None:
        """``serve_multi_hot``: rows of ids as the dataset holds them. A tf.function made per
        instance, so that the width of ``cat_ids`` is the model's and a request of another
        width is refused by the signature."""
        sizes = tuple(int(k) for k in multi_hot_sizes)
        self.multi_hot_offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        self.serve_multi_hot = tf.function(
            self._serve_multi_hot,
            autograph=False,
            input_signature=[
                tf.TensorSpec([None, NUM_INTEGER], tf.int64, name="int_features"),
                tf.TensorSpec([None, self.multi_hot_offsets[-1]], tf.int64, name="cat_ids"),
            ],
        )

    def _serve_multi_hot(self, int_features, cat_ids):
        """``cat_ids`` int64 [n, sum(k)]: C1's k1 ids, then C2's k2 ids, ... (a row of the
        dataset's cat_<i>.bin files side by side). A row with an id outside its table gets
        probability -1 and ``id_out_of_range``."""
        offsets = self.multi_hot_offsets
        ids, in_range = [], []
        for j in range(NUM_CATEGORICAL):
            column = cat_ids[:, offsets[j] : offsets[j + 1]]
            rows = tf.cast(tf.shape(self.tables[j])[0], tf.int64)
            ok = tf.reduce_all((column >= 0) & (column < rows), axis=1)
            in_range.append(ok)
            ids.append(tf.where(ok[:, None], column, tf.zeros_like(column)))
        in_range = tf.reduce_all(tf.stack(in_range, axis=1), axis=1)
        reason = first_reason([(ID_OUT_OF_RANGE, ~in_range)])
        probability = self._probability_of_ids(int_features, ids)
        return {
            "probability": tf.where(
                in_range, probability, tf.fill(tf.shape(probability), REJECTED_PROBABILITY)
            ),
            "reject_reason": reason,
        }


class ServingDLRM(ServingCore):
    """The core plus how a raw value becomes its id: one vocabulary lookup per column, or,
    for a model trained on capped ids, the value modulo its column's cap (``caps``, the
    tables' sizes), or (``contiguous``) a lookup by contiguous ids' rule. A multi-hot model also
    holds each multi-hot column's lookup table (``expansions``: one-hot id -> its row's k ids,
    the converter's materialization, dlrm_contracts/multi_hot.py), so raw values reach the
    same k ids the dataset held, and gets ``serve_multi_hot`` too."""

    def __init__(
        self,
        dims: ModelDims,
        weights: ServingWeights,
        missing_integer: int,
        raw_ids: RawIds,
        expansions: Sequence[np.ndarray | None] | None = None,
    ):
        vocabularies, caps, contiguous = raw_ids.vocabularies, raw_ids.caps, raw_ids.contiguous
        if (vocabularies is None) == (caps is None):
            raise ValueError("a served model takes its ids from vocabularies or from caps, one of the two")
        super().__init__(dims, weights, missing_integer)
        # plain ints: a constant of the graph, nothing to restore
        self.caps = None if caps is None else tuple(int(c) for c in caps)
        self.contiguous = contiguous
        self.table_rows = tuple(int(t.shape[0]) for t in self.tables)
        self.vocabularies = [
            tf.lookup.StaticHashTable(
                tf.lookup.TextFileInitializer(
                    str(path),
                    tf.string,
                    tf.lookup.TextFileIndex.WHOLE_LINE,
                    tf.int64,
                    tf.lookup.TextFileIndex.LINE_NUMBER,
                ),
                default_value=RARE_ID if contiguous else 0,
            )
            for path in vocabularies or []
        ]
        # column index -> its lookup table (multi-hot columns only)
        self.expansions = {
            str(j): tf.Variable(e, trainable=False, name=f"multi_hot_C{j + 1}")
            for j, e in enumerate(expansions or [])
            if e is not None
        }
        if expansions is not None:
            self._add_multi_hot_signature([1 if e is None else int(e.shape[1]) for e in expansions])

    def _ids(self, normalised: tf.Tensor, unusable: tf.Tensor, missing: tf.Tensor) -> tf.Tensor:
        if self.caps is not None:
            return capped_ids(normalised, unusable, self.caps)
        if self.contiguous:  # a non-hex value's row is refused whatever its id
            return contiguous_ids(normalised, missing, self.vocabularies, self.table_rows)
        ids = tf.stack(
            [self.vocabularies[j].lookup(normalised[:, j]) for j in range(NUM_CATEGORICAL)], axis=1
        )
        return tf.where(unusable, tf.zeros_like(ids), ids)

    def _probability(self, integers: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
        """``ids`` [n, 26] one-hot ids; a multi-hot column's become its row's k ids."""
        columns = [
            tf.gather(self.expansions[str(j)], ids[:, j]) if str(j) in self.expansions else ids[:, j]
            for j in range(NUM_CATEGORICAL)
        ]
        return self._probability_of_ids(integers, columns)

    def _score(self, integers: tf.Tensor, categoricals: tf.Tensor, reason: tf.Tensor) -> tf.Tensor:
        normalised, unusable, _ = normalise_categoricals(categoricals)
        ids = self._ids(normalised, unusable, tf.equal(categoricals, ""))
        probability = self._probability(integers, ids)
        return tf.where(
            tf.equal(reason, ""), probability, tf.fill(tf.shape(probability), REJECTED_PROBABILITY)
        )

    # The signatures branch on Python values only (the model's settings: caps, contiguous ids,
    # the wide term, multi-hot columns), so they are traced as written (autograph=False):
    # AutoGraph would rewrite every function they call, in the exporting process, for the same
    # graph.
    @tf.function(
        autograph=False,
        input_signature=[
            tf.TensorSpec([None, NUM_INTEGER], tf.int64, name="int_features"),
            tf.TensorSpec([None, NUM_CATEGORICAL], tf.string, name="cat_features"),
        ],
    )
    def serve_features(self, int_features, cat_features):
        _, _, cats_valid = normalise_categoricals(cat_features)
        reason = first_reason([(NON_HEX_CATEGORICAL, ~cats_valid)])
        return {"probability": self._score(int_features, cat_features, reason), "reject_reason": reason}

    @tf.function(
        autograph=False,
        input_signature=[
            tf.TensorSpec([None], tf.string, name="lines"),
            tf.TensorSpec([None], tf.bool, name="has_label"),
        ],
    )
    def serve_lines(self, lines, has_label):
        fields, too_many = split_lines(lines, has_label)
        label_text = fields[:, 0]
        bad_label = ~(tf.equal(label_text, "0") | tf.equal(label_text, "1"))
        integers, ints_valid = parse_integers(fields[:, 1 : 1 + NUM_INTEGER], self.missing_integer)
        categoricals = fields[:, 1 + NUM_INTEGER :]
        _, _, cats_valid = normalise_categoricals(categoricals)
        reason = first_reason(
            [
                (TOO_MANY_FIELDS, too_many),
                (BAD_LABEL, bad_label),
                (NON_INTEGER, ~ints_valid),
                (NON_HEX_CATEGORICAL, ~cats_valid),
            ]
        )
        scored = tf.equal(reason, "")
        label = tf.where(scored & has_label, tf.cast(tf.equal(label_text, "1"), tf.int32), -1)
        return {
            "probability": self._score(integers, categoricals, reason),
            "reject_reason": reason,
            "label": label,
        }
