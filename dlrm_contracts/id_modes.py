"""How a run gives its categorical ids (``preprocess.ids``), modelled once.

Four modes, each a frozen :class:`IdMode` that answers the questions the wings ask, so that
no caller compares the mode's name: the preprocess job (what it counts, which dictionaries it
writes, whether the transform reads values as hex numbers), the pipeline (what a stage's key
records, whether the tables grow run after run), the converters and the trainer (whether a
threshold may be raised from the binary dataset), the export and serving (how a raw value
becomes its id). The name stays what the config file and the records (``preprocess.json``,
``dataset.json``) hold; :func:`id_mode` turns it back into its mode.

- ``frequency`` (the reference's way): every run numbers the kept values 1..k by count
  descending, so a higher threshold is a prefix of the ids.
- ``stable``: the workdir's dictionaries are append-only; a value keeps its id in every later
  run, so the tables only grow and the threshold cannot change.
- ``modulo`` (capped ids, ``spark_jobs.capped_ids``): a value's id is its hex value modulo its
  column's cap; nothing is counted, no dictionary written, no threshold applies.
- ``contiguous`` (``dlrm_contracts.contiguous_ids``): ids by first appearance in dictionaries
  of their own, optionally capped; no value counts are kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlrm_contracts.contiguous_ids import DICTIONARIES_DIR as CONTIGUOUS_DICTIONARIES_DIR
from dlrm_contracts.contiguous_ids import MISSING_VALUE, RARE_ID
from dlrm_contracts.thresholds import ThresholdSpec

# Under the parquet directory: frequency and stable ids' value -> id tables. Named here, where
# the modes say which directory is theirs, and re-exported by dlrm_contracts.layout (which the
# config, validating with these modes, does not import: it brings the storage layer).
DICTIONARIES_DIR = "dictionaries"

# How a threshold other than the one the ids were made at may be read (rethreshold, the
# trainer's read): any higher one (ids ordered by count), only the own one, or none at all.
THRESHOLD_ANY = "any"
THRESHOLD_OWN = "own"
THRESHOLD_NONE = "none"

# How a served model maps a raw value to its id (the export's ``fingerprint.json`` "ids"):
# a vocabulary file per column, the hex value modulo the table's size, or the contiguous
# dictionaries read by ``dlrm_contracts.contiguous_ids``' rule.
SERVED_BY_VOCABULARY = "vocabulary"
SERVED_BY_MODULO = "modulo"
SERVED_BY_CONTIGUOUS = "contiguous"


class UnknownIdModeError(ValueError):
    """A name that is none of the modes (a record written by something else, or a typo)."""


@dataclass(frozen=True)
class IdMode:
    """One way of giving ids and what follows from it."""

    name: str  # as in preprocess.ids and the records
    description: str  # what messages call these ids
    # the count pass keeps every value's count (counts/, days.json, the histogram)
    counts_values: bool
    # the directory under parquet/ the value -> id tables are written to (None: no tables);
    # dlrm_contracts.layout.dictionaries_under turns it into their path
    dictionaries_dir: str | None
    # the transform reads a categorical as a hexadecimal number (not as a dictionary key)
    hex_values: bool
    # the dictionaries are append-only across runs: tables only grow, a previous model's rows
    # keep their values, and the threshold is fixed for the workdir
    grows_tables: bool
    caps_required: bool  # preprocess.caps must be set
    caps_allowed: bool  # preprocess.caps may be set
    threshold_applies: bool  # preprocess.frequency_threshold decides which values get ids
    # which thresholds a dataset of these ids may be read or rethresholded at (THRESHOLD_*):
    # any higher one, only its own, or none (no threshold may be asked of it at all)
    other_thresholds: str
    # why no other threshold may be read, and what to do instead (the refusals' words)
    why_threshold_fixed: str
    threshold_remedy: str
    served_by: str  # SERVED_BY_*
    # supported with a workdir URL (stable ids extend their dictionaries in place)
    on_url_workdir: bool
    # records made before the setting existed omit it (a stage's key, dataset.json's extra)
    default: bool = False
    # How a value is read through the dictionaries (the transform's rule, the served model's):
    # the value a missing categorical is looked up as (None: missing is id 0, not looked up),
    # and the id of a value the dictionaries do not have (rare, or never numbered)
    missing_value: int | None = None
    rare_id: int = 0

    @property
    def writes_dictionaries(self) -> bool:
        """Whether the mode has value -> id tables: a dictionary pass runs (a progress plan
        has no such phase when not) and the transform looks ids up in them, where without
        them each id comes from its value and its column's cap."""
        return self.dictionaries_dir is not None

    @property
    def capped(self) -> bool:
        """Ids computed from the value and its column's cap alone (no dictionary)."""
        return self.served_by == SERVED_BY_MODULO

    @property
    def contiguous(self) -> bool:
        """Ids numbered by first appearance, read through the contiguous dictionaries."""
        return self.served_by == SERVED_BY_CONTIGUOUS

    @property
    def in_dataset_identity(self) -> bool:
        """Whether a dataset's identity (a checkpoint's record of it) names the mode: those
        whose ids are not read through ``parquet/dictionaries`` as a vocabulary, so that the
        export and a warm start know; the others' identities stay what they were."""
        return self.served_by != SERVED_BY_VOCABULARY

    @property
    def raisable(self) -> bool:
        """Whether a higher threshold is a prefix of the ids (ordered by count), so that data
        made at a lower threshold serves it without preprocessing again."""
        return self.other_thresholds == THRESHOLD_ANY

    @property
    def other_thresholds_readable(self) -> bool:
        """Whether any threshold at all may be asked of a dataset of these ids (stable: its
        own; modulo and contiguous: none, not even the one they were made at)."""
        return self.other_thresholds != THRESHOLD_NONE

    def threshold_refusal(self, wanted: ThresholdSpec, own: ThresholdSpec | None) -> str | None:
        """None when a dataset of these ids made at ``own`` may be read at ``wanted``; else
        what its ids are and why not, for a refusal (the caller adds what to do instead)."""
        if self.readable_at(wanted, own):
            return None
        mismatch = f": threshold {wanted} is not its own, {own}" if self.other_thresholds_readable else ""
        return f"{self.description}, {self.why_threshold_fixed}{mismatch}"

    def readable_at(self, wanted: ThresholdSpec, own: ThresholdSpec | None) -> bool:
        """Whether a dataset whose ids were made at threshold ``own`` may be read (or
        rethresholded) at ``wanted``: only frequency ids are ordered by count, so that a
        higher threshold is a prefix of them."""
        if self.other_thresholds == THRESHOLD_ANY:
            return True
        return self.other_thresholds == THRESHOLD_OWN and own is not None and wanted == own


FREQUENCY = IdMode(
    name="frequency",
    description="ids by frequency (preprocess.ids: frequency)",
    counts_values=True,
    dictionaries_dir=DICTIONARIES_DIR,
    hex_values=False,
    grows_tables=False,
    caps_required=False,
    caps_allowed=False,
    threshold_applies=True,
    other_thresholds=THRESHOLD_ANY,
    why_threshold_fixed="",
    threshold_remedy="",
    served_by=SERVED_BY_VOCABULARY,
    on_url_workdir=True,
    default=True,
)
STABLE = IdMode(
    name="stable",
    description="stable ids (preprocess.ids: stable)",
    counts_values=True,
    dictionaries_dir=DICTIONARIES_DIR,
    hex_values=False,
    grows_tables=True,
    caps_required=False,
    caps_allowed=False,
    threshold_applies=True,
    other_thresholds=THRESHOLD_OWN,
    why_threshold_fixed="which are not ordered by count: no other threshold is a prefix of them",
    threshold_remedy="a stable workdir keeps its threshold; use a new workdir for another",
    served_by=SERVED_BY_VOCABULARY,
    on_url_workdir=False,
)
MODULO = IdMode(
    name="modulo",
    description="capped ids (preprocess.ids: modulo)",
    counts_values=False,
    dictionaries_dir=None,
    hex_values=True,
    grows_tables=False,
    caps_required=True,
    caps_allowed=True,
    threshold_applies=False,
    other_thresholds=THRESHOLD_NONE,
    why_threshold_fixed="which no threshold applies to: every value keeps its id modulo its column's cap",
    threshold_remedy="change preprocess.caps and run the preprocess stage instead",
    served_by=SERVED_BY_MODULO,
    on_url_workdir=True,
)
CONTIGUOUS = IdMode(
    name="contiguous",
    description="contiguous ids (preprocess.ids: contiguous)",
    counts_values=False,
    dictionaries_dir=CONTIGUOUS_DICTIONARIES_DIR,
    hex_values=True,
    grows_tables=False,
    caps_required=False,
    caps_allowed=True,
    threshold_applies=True,
    other_thresholds=THRESHOLD_NONE,
    why_threshold_fixed="numbered by first appearance, not by count: no other threshold is a prefix of them",
    threshold_remedy="change preprocess.frequency_threshold and run the preprocess stage instead",
    served_by=SERVED_BY_CONTIGUOUS,
    on_url_workdir=False,
    missing_value=MISSING_VALUE,
    rare_id=RARE_ID,
)

ID_MODES: dict[str, IdMode] = {m.name: m for m in (FREQUENCY, STABLE, MODULO, CONTIGUOUS)}
ID_MODE_NAMES: tuple[str, ...] = tuple(ID_MODES)


def id_mode(name: str) -> IdMode:
    """The mode of a ``preprocess.ids`` name; one clear error for any other."""
    try:
        return ID_MODES[name]
    except (KeyError, TypeError):
        raise UnknownIdModeError(
            f"preprocess.ids {name!r} is not one of {', '.join(ID_MODE_NAMES)}"
        ) from None


def recorded_mode(record: object) -> IdMode:
    """The mode a record names under ``"ids"`` (``preprocess.json``, ``dataset.json``'s extra, a
    dataset identity): a record without one is of the default mode. A name that is no mode
    raises :class:`UnknownIdModeError`."""
    name = record.get("ids") if isinstance(record, dict) else None
    return FREQUENCY if name is None else id_mode(name)


def recorded_or_default(record: object) -> IdMode:
    """Like :func:`recorded_mode`, but a damaged or foreign record (an unknown name) reads as
    the default mode, for readers that only ask what it says when it says something known."""
    try:
        return recorded_mode(record)
    except UnknownIdModeError:
        return FREQUENCY


__all__ = [
    "CONTIGUOUS",
    "FREQUENCY",
    "ID_MODES",
    "ID_MODE_NAMES",
    "MODULO",
    "STABLE",
    "IdMode",
    "UnknownIdModeError",
    "id_mode",
    "recorded_mode",
    "recorded_or_default",
]
