"""``python -m trainer --mode export``: the run's checkpoint + the dictionaries -> one SavedModel.

A model trained on capped ids (``preprocess.ids: modulo``, recorded in its checkpoint's dataset
identity) needs no dictionaries: its SavedModel computes each value's id from the value and
its column's cap, the table's size (trainer.serving.capped_ids), and holds no vocabulary.
One trained on contiguous ids (``preprocess.ids: contiguous``) ships the contiguous
dictionaries (``parquet/contiguous_dictionaries``) as its vocabularies, read by their rule
(dlrm_contracts.contiguous_ids, trainer.serving.contiguous_ids).

The run's checkpoint is ``best_checkpoint``: the best validation AUC's with early stopping,
else the latest.


Writes a new version ``DIR/export/<N>/`` (N one more than the newest; TensorFlow Serving's
layout, so a server watching ``DIR/export`` picks it up without a restart): the SavedModel
(tables, MLPs, preprocessing, one vocabulary asset per column) and its ``fingerprint.json``.
The checkpoint may come from any number of ranks: tables are reassembled whole from their
column slices (``CheckpointReader``). The size is checked before anything is read, so a model
too big for one process is refused with a message instead of running out of memory halfway.
A version is written into a temporary directory beside it, loaded back and made to score a
few lines (a version that does not is refused), and renamed into place, so a server never sees
a partial or broken one. It is then recorded as verified in ``DIR/export/serving.json``
(dlrm_contracts.serving_state), and all but the newest ``export.keep_versions`` are deleted,
except the pinned, the served and the newest verified versions.

A damaged run checkpoint (a truncated ``.npz``, a ``meta.json`` that is not JSON) is skipped
for the newest intact checkpoint of the same run, as training resumes from it; with none
intact the export fails naming the damaged file.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.parquet as pq

from dlrm_contracts.atomic import publish, remove_stale_temporaries, temporary_sibling
from dlrm_contracts.binary_format import (
    MULTI_HOT_DISTRIBUTION_KEY,
    MULTI_HOT_KEYS,
    MULTI_HOT_SEED_KEY,
    MULTI_HOT_SIZES_KEY,
)
from dlrm_contracts.config import ExportConfig
from dlrm_contracts.contiguous_ids import FIRST_ID
from dlrm_contracts.dataset_identity import (
    DICTIONARIES_FINGERPRINT_KEY,
    IDENTITY_KEY,
    dictionaries_fingerprint,
    identity_mode,
    trained_on,
)
from dlrm_contracts.id_modes import FREQUENCY, IdMode
from dlrm_contracts.layout import (
    CHECKPOINT_META,
    DATASET_JSON,
    EXPORT_FINGERPRINT,
    WorkdirLayout,
    complete_checkpoints,
    export_versions,
)
from dlrm_contracts.model_digest import DIGEST_KEY, saved_model_digest
from dlrm_contracts.multi_hot import DEFAULT_SEED, MultiHotError, MultiHotSpec, iter_tables
from dlrm_contracts.serving_state import ServingState, protected_versions, read_state, write_state
from dlrm_contracts.schema import CAT_COLUMNS, NUM_INTEGER
from dlrm_contracts.table_sizes import VOCABULARY_LINE_BYTES, embedding_bytes
from trainer.checkpoint import CheckpointError, CheckpointReader, best_checkpoint
from trainer.dictionary_lineage import extension
from trainer.model import ModelDims

if TYPE_CHECKING:
    from trainer.serving import ServingWeights

FINGERPRINT = EXPORT_FINGERPRINT
# Memory of one kept value in a serving process's hash table (std::string key + int64 value +
# bucket), a generous estimate; used only for the size check.
HASH_ENTRY_BYTES = 64
# A present value the check of a new version scores when the model has no vocabulary to take
# one from (capped ids): the highest 8-digit value, so the fold of all 8 digits is exercised.
CAPPED_TEST_VALUE = "ffffffff"


class ExportError(ValueError):
    """An export that cannot be made (no checkpoint, dictionaries that do not fit, too big)."""


# New dictionaries mean new ids: the model must be trained again on what they give.
REBUILD_DICTIONARIES = (
    "the dictionaries are damaged; rebuild them and the model with "
    "--stages preprocess,convert,train,eval,export --force"
)


def check_dataset_identity(
    checkpoint: Path, meta: dict, dictionaries: Path
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The checkpoint's dataset identity, once it is shown to be the dictionaries' own or
    extended by them; and, when extended, what the extension adds (else None).

    A new preprocess run (a new day) rewrites the dictionaries; with ids by frequency the ids
    move, and exporting an older checkpoint with them would serve every value with another
    value's embedding row. With stable ids a later run of the same lineage only appends
    (trainer/dictionary_lineage.py): every row the checkpoint has keeps its value, and the
    values added since are left out of the vocabularies (``write_vocabularies`` writes the
    table's rows only), so the served model reads them as id 0, the rare value, as the model
    saw any value it had no row for.
    """
    identity = meta.get(IDENTITY_KEY)
    recorded = identity.get(DICTIONARIES_FINGERPRINT_KEY) if isinstance(identity, dict) else None
    if recorded is None:
        raise ExportError(
            f"{checkpoint / 'meta.json'} records no dictionaries its ids belong to "
            "(saved before checkpoints recorded their dataset, or trained on a "
            "dataset converted without parquet/dictionaries beside it): train it "
            "again on the current dataset (--stages convert,train,eval,export)"
        )
    current = dictionaries_fingerprint(dictionaries)
    if current == recorded:
        return identity, None
    extended, why_not = extension(meta, dictionaries)
    if extended is not None:
        return identity, extended
    raise ExportError(
        f"checkpoint {checkpoint.name} was trained on another preprocess "
        f"run's dictionaries than those in {dictionaries}, and they do not extend "
        f"its own ({why_not}): exporting would pair its embedding rows with other "
        "values. Train on the current dataset first "
        "(--stages convert,train,eval,export)"
    )


def export_size(
    table_sizes: list[int], embedding_dim: int, vocabularies: bool = True, values: int | None = None
) -> dict[str, int]:
    """Bytes of the export: on disk (tables + vocabularies) and in a serving process.
    ``vocabularies`` False: a model of capped ids, which has none; ``values``: the values the
    vocabularies hold when not one per table row (contiguous ids ship every value)."""
    tables = embedding_bytes(table_sizes, embedding_dim, 4)
    if values is None:
        values = int(sum(max(0, s - 1) for s in table_sizes)) if vocabularies else 0
    return {
        "tables_bytes": tables,
        "vocabulary_bytes": values * VOCABULARY_LINE_BYTES,
        "disk_bytes": tables + values * VOCABULARY_LINE_BYTES,  # as table_sizes.export_bytes
        "serving_memory_bytes": tables + values * HASH_ENTRY_BYTES,
    }


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_export_fits(
    table_sizes: list[int],
    embedding_dim: int,
    config: ExportConfig,
    multi_hot_bytes: int = 0,
    vocabularies: bool = True,
    values: int | None = None,
) -> dict:
    """Refuse, before reading any table, an export that would not fit in this process.

    The exporting process holds every table once plus one more while it is copied in, and the
    vocabularies as hash tables while the SavedModel is traced (and a multi-hot model's
    lookup tables, ``multi_hot_bytes``).
    """
    size = export_size(table_sizes, embedding_dim, vocabularies, values)
    largest = max(table_sizes) * embedding_dim * 4
    needed = size["serving_memory_bytes"] + largest + multi_hot_bytes
    if config.max_memory_mb > 0:
        limit, where = int(config.max_memory_mb * 2**20), f"export.max_memory_mb = {config.max_memory_mb:g}"
    else:
        available = _available_memory()
        limit = int(0.8 * available) if available else None
        where = "80% of this machine's available memory"
    if limit is not None and needed > limit:
        raise ExportError(
            f"the export needs about {needed / 2**30:.2f} GiB in one process (tables "
            f"{size['tables_bytes'] / 2**30:.2f} GiB, largest table {largest / 2**30:.2f} GiB, "
            f"vocabularies {size['serving_memory_bytes'] - size['tables_bytes']:,} B as hash "
            f"tables), more than {where} ({limit / 2**30:.2f} GiB). Every table is exported whole "
            "(no sharded export): export on a machine with more memory, or train at a higher "
            "frequency threshold (`run_pipeline.sh plan` prints the export size per threshold)"
        )
    return {**size, "estimated_peak_bytes": needed}


def write_vocabularies(dictionaries: Path, table_sizes: list[int], out_dir: Path) -> list[Path]:
    """One text file per column: line i holds the value of id i (line 0 a header).

    Only the values the trained table has rows for are written (a table trained at a higher
    threshold is a prefix of the ids), so every other value maps to id 0 as in training.
    """
    from trainer.serving import VOCABULARY_HEADER

    _check_dictionary_folders(dictionaries, table_sizes)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for column, size in zip(CAT_COLUMNS, table_sizes):
        folder = dictionaries / f"column={column}"
        # no folder: a table of id 0 alone (_check_dictionary_folders refused any other)
        ids, values = _read_dictionary(folder, column)
        if not np.array_equal(ids, np.arange(1, len(ids) + 1)):
            raise ExportError(
                f"the dictionary of {column} in {folder} does not hold ids 1..k exactly once each"
            )
        if len(ids) < size - 1:
            raise ExportError(
                f"the dictionary of {column} has {len(ids)} values but the "
                f"checkpoint's table has {size} rows: the dictionaries in "
                f"{dictionaries} do not belong to this model (preprocess again)"
            )
        path = out_dir / f"{column}.vocab"
        with open(path, "w", encoding="ascii") as fh:
            fh.write(VOCABULARY_HEADER + "\n")
            kept = values[: size - 1]
            if len(kept):
                fh.write("\n".join(kept.tolist()) + "\n")
        paths.append(path)
    return paths


def write_contiguous_vocabularies(dictionaries: Path, out_dir: Path) -> list[Path]:
    """Contiguous ids' vocabularies: line i holds the value of id i, lines 0 and 1 (no value's:
    the rare id 1 is the lookup's default) a header. Every value is written, as the transform
    looks every one up: with caps, ids beyond a table's rows are taken modulo them
    (trainer.serving.contiguous_ids)."""
    from trainer.serving import CONTIGUOUS_RARE_LINE, VOCABULARY_HEADER

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for column in CAT_COLUMNS:
        ids, values = _read_dictionary(dictionaries / f"column={column}", column)
        if not np.array_equal(ids, np.arange(FIRST_ID, FIRST_ID + len(ids))):
            raise ExportError(
                f"the contiguous dictionary of {column} in {dictionaries} does not hold ids "
                f"{FIRST_ID}..k exactly once each: {REBUILD_DICTIONARIES}"
            )
        path = out_dir / f"{column}.vocab"
        with open(path, "w", encoding="ascii") as fh:
            fh.write(f"{VOCABULARY_HEADER}\n{CONTIGUOUS_RARE_LINE}\n")
            if len(values):
                fh.write("\n".join(values.tolist()) + "\n")
        paths.append(path)
    return paths


def _dictionary_rows(dictionaries: Path) -> int:
    """The values of every column's dictionary, from the parquet footers (nothing else read)."""
    rows = 0
    for path in sorted(dictionaries.rglob("*.parquet")):
        try:
            rows += pq.ParquetFile(path).metadata.num_rows
        except (OSError, ValueError) as exc:  # pyarrow's errors are both
            raise ExportError(
                f"the dictionary file {path} cannot be read ({exc}): {REBUILD_DICTIONARIES}"
            ) from None
    return rows


def _read_dictionary(folder: Path, column: str) -> tuple[np.ndarray, np.ndarray]:
    """One column's dictionary as (ids, values) by id; none when its folder is absent (a
    column with no value)."""
    if not folder.is_dir():
        return np.zeros(0, np.int64), np.zeros(0, object)
    try:
        table = pq.read_table(folder, columns=["value", "id"])
    except (OSError, ValueError) as exc:  # pyarrow's errors are both
        raise ExportError(
            f"the dictionary of {column} in {folder} cannot be read ({exc}): {REBUILD_DICTIONARIES}"
        ) from None
    ids = table.column("id").to_numpy()
    values = np.asarray(table.column("value").to_pylist(), dtype=object)
    order = np.argsort(ids, kind="stable")
    return ids[order], values[order]


def _mlp_weights(
    reader: CheckpointReader, name: str, sizes: tuple[int, ...], in_dim: int
) -> dict[str, np.ndarray]:
    out = {}
    for i, (fan_in, fan_out) in enumerate(zip((in_dim,) + sizes[:-1], sizes)):
        out[f"{name}/{i}/kernel"] = reader.value(f"{name}/{i}/kernel", (fan_in, fan_out))
        out[f"{name}/{i}/bias"] = reader.value(f"{name}/{i}/bias", (fan_out,))
    return out


def _test_auc(layout: WorkdirLayout, step: int) -> float | None:
    """The test AUC the trainer reported for this checkpoint's step, if any."""
    for name in ("summary_eval.json", "summary_train.json"):
        try:
            summary = json.loads((layout.logs / name).read_text())
        except (OSError, ValueError):
            continue
        if summary.get("step") == step and summary.get("test_auc") is not None:
            return summary["test_auc"]
    return None


def _dataset_description(dataset: Path, identity: dict[str, Any]) -> dict[str, Any]:
    """The dataset the checkpoint was trained on (its identity); the path and rows of the one
    at ``dataset`` only when it is that dataset."""
    try:
        info = json.loads((dataset / DATASET_JSON).read_text())
    except (OSError, ValueError):
        info = {}
    same = isinstance(info, dict) and info.get("source_fingerprint") == identity.get("source_fingerprint")
    return {
        "path": str(dataset) if same else None,
        "source_fingerprint": identity.get("source_fingerprint"),
        DICTIONARIES_FINGERPRINT_KEY: identity.get(DICTIONARIES_FINGERPRINT_KEY),
        "rows": info.get("splits") if same else None,
        "threshold_spec": identity.get("threshold_spec"),
    }


def _check_dictionary_folders(dictionaries: Path, sizes: list[int]) -> None:
    """Name a missing column's dictionary before anything else is said about them."""
    for column, size in zip(CAT_COLUMNS, sizes):
        folder = dictionaries / f"column={column}"
        if size > 1 and not folder.is_dir():
            raise ExportError(
                f"the dictionary of {column} is missing ({folder} does not exist): {REBUILD_DICTIONARIES}"
            )


@dataclass(frozen=True)
class _Source:
    """What a version is made from: the checkpoint, the model it holds, its dataset's identity,
    and the export's size (checked against memory before anything is read)."""

    checkpoint: Path
    meta: dict[str, Any]
    dims: ModelDims
    sizes: list[int]
    identity: dict[str, Any]
    size: dict[str, int]
    # trained on earlier dictionaries of the same stable lineage: what the current ones add
    extended: dict[str, Any] | None = None
    # the materialization of the multi-hot rows the model was trained on (None: one-hot)
    multi_hot: MultiHotSpec | None = None
    # how the ids it was trained on were given (its dataset identity): capped ids' caps are
    # the table sizes and the export ships no vocabulary; contiguous ids' vocabularies are the
    # contiguous dictionaries
    ids: IdMode = FREQUENCY

    @property
    def capped(self) -> bool:
        return self.ids.capped

    @property
    def contiguous(self) -> bool:
        return self.ids.contiguous

    @property
    def signatures(self) -> list[str]:
        """The SavedModel's signatures: a multi-hot model also takes its rows of ids."""
        rows = ["serve_multi_hot"] if self.multi_hot is not None else []
        return ["serve_features", "serve_lines", "serving_default", *rows]


def _fingerprint(
    layout: WorkdirLayout,
    dataset: Path,
    source: _Source,
    saved_model: Path,
    config: ExportConfig,
    version: int,
) -> dict[str, Any]:
    """What the export was made from and what it holds (fingerprint.json)."""
    description = _dataset_description(dataset, source.identity)
    meta = source.meta
    return {
        "format_version": 1,
        "version": version,
        "dataset": description,
        # null, or the lineage and the values per table the served model reads as id 0
        "dictionaries_extended": source.extended,
        "threshold_spec": description["threshold_spec"],
        "checkpoint": str(source.checkpoint),
        "checkpoint_step": int(meta["step"]),
        "trained_ranks": (meta.get("placement") or {}).get("world"),
        "test_auc": _test_auc(layout, int(meta["step"])),
        "dims": source.dims.meta(),
        "table_sizes": source.sizes,
        # how a raw value becomes its id: "vocabulary" (a file per column in assets/),
        # "modulo" (its hex value modulo its column's cap, the table size) or "contiguous" (a
        # file per column, read by dlrm_contracts.contiguous_ids' rule)
        "ids": source.ids.served_by,
        "signatures": source.signatures,
        # only for a multi-hot model: its materialization (serve_multi_hot's cat_ids holds
        # multi_hot_sizes[i] ids of column i)
        **(
            {k: v for k, v in source.meta["dims"].items() if k in MULTI_HOT_KEYS}
            if source.multi_hot is not None
            else {}
        ),
        "missing_integer": config.missing_integer,
        "size": source.size,
        "saved_model_bytes": sum(
            p.stat().st_size for p in saved_model.rglob("*") if p.is_file() and p.name != FINGERPRINT
        ),
        # what the score stage and the serving image check before loading (model_digest.py)
        DIGEST_KEY: saved_model_digest(saved_model),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def next_version(export_dir: Path) -> int:
    """One more than the newest version (1 for the first): versions only increase, so the
    newest directory is always the newest model, which is what a server loads."""
    found = export_versions(export_dir)
    return found[-1][0] + 1 if found else 1


def prune_versions(export_dir: Path, keep: int, state: ServingState | None = None) -> list[int]:
    """Delete all but the newest ``keep`` versions, never one ``state`` protects (pinned,
    served, newest verified); returns the versions deleted.

    The oldest go first: a server may still be unloading the previous newest one.
    """
    found = export_versions(export_dir)
    kept = {v for v, _ in found[-max(1, keep) :]}
    kept |= protected_versions(state or read_state(export_dir), [v for v, _ in found])
    removed = []
    for version, path in found:
        if version not in kept:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(version)
    return removed


def export_model(workdir: str | Path, dataset: str | Path, config: ExportConfig) -> dict[str, Any]:
    """Write a new version ``DIR/export/<N>``: the run's checkpoint and the dictionaries as one
    SavedModel, with its fingerprint.json.

    Args:
        workdir: the workdir holding the checkpoints and the preprocess dictionaries.
        dataset: the dataset the checkpoint was trained on (recorded in the fingerprint).
        config: the memory limit and the integer that reads as missing.

    Returns:
        The fingerprint written beside the SavedModel, plus seconds, its path, the versions
        deleted and the version served now (the CLI's JSON summary).
    """
    started = time.perf_counter()
    layout = WorkdirLayout.at(workdir)
    best = best_checkpoint(layout.checkpoints)
    if best is None:
        raise ExportError(f"no complete checkpoint under {layout.checkpoints}: train first")
    dictionaries = _dictionaries_of(layout, best)
    if dictionaries is not None and not dictionaries.is_dir():
        raise ExportError(f"no dictionaries at {dictionaries}: the preprocess stage writes them")
    state = read_state(layout.export)  # a damaged record is refused before anything is written
    damaged: list[str] = []
    for checkpoint in [best, *_older_of_same_run(layout, best, Path(dataset))]:
        try:
            final, fingerprint = _export_checkpoint(layout, checkpoint, Path(dataset), config)
            break
        except CheckpointError as exc:
            damaged.append(getattr(exc, "damage", str(exc)))
    else:
        raise ExportError(
            f"{damaged[0]}, and no older checkpoint of this run is intact: train "
            "again (--stages train,eval,export --force)"
        )
    for what in damaged:
        print(
            f"trainer: warning: {what}: exported the newest intact checkpoint of the run, "
            f"{fingerprint['checkpoint']}",
            file=sys.stderr,
            flush=True,
        )
    state.verified[int(fingerprint["version"])] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_state(layout.export, state)  # verified before anything is pruned
    removed = prune_versions(layout.export, config.keep_versions, state)
    record = write_state(layout.export, state)
    return {
        **fingerprint,
        "seconds": round(time.perf_counter() - started, 2),
        "saved_model": str(final),
        "removed_versions": removed,
        "served_version": record["served_version"],
        "damaged_checkpoints": damaged,
    }


def _dictionaries_of(layout: WorkdirLayout, checkpoint: Path) -> Path | None:
    """The dictionaries a checkpoint's model is served with: None for capped ids, the
    contiguous dictionaries for contiguous ids, else parquet/dictionaries (also when its
    meta.json is damaged: the damage is reported where the checkpoint is read)."""
    try:
        meta = json.loads((checkpoint / CHECKPOINT_META).read_text())
    except (OSError, ValueError):
        meta = None
    identity = meta.get(IDENTITY_KEY) if isinstance(meta, dict) else None
    return layout.dictionaries_of(identity_mode(identity))


def _older_of_same_run(layout: WorkdirLayout, newest: Path, dataset: Path) -> list[Path]:
    """The complete checkpoints before ``newest`` trained on ``dataset``, newest first: where
    training would resume if ``newest`` were damaged (none when the dataset cannot be read)."""
    from trainer.data import open_dataset

    try:
        identity = open_dataset(dataset, verify="none").identity
    except (OSError, ValueError):  # DatasetError is a ValueError: no fallback without it
        return []
    older = []
    for _, path in reversed(complete_checkpoints(layout.checkpoints)):
        if path == newest:
            continue
        try:
            meta = json.loads((path / CHECKPOINT_META).read_text())
        except (OSError, ValueError):
            continue
        if not (isinstance(meta, dict) and identity and trained_on(meta, identity)):
            break
        older.append(path)
    return older


def _export_checkpoint(
    layout: WorkdirLayout, checkpoint: Path, dataset: Path, config: ExportConfig
) -> tuple[Path, dict[str, Any]]:
    """One checkpoint exported as the next version; CheckpointError when it is damaged."""
    reader = CheckpointReader(checkpoint)
    try:
        source = _checked_source(layout, checkpoint, reader.meta, config)
        return _write_version(layout, reader, source, dataset, config)
    finally:
        reader.close()


def _checked_source(
    layout: WorkdirLayout, checkpoint: Path, meta: dict[str, Any], config: ExportConfig
) -> _Source:
    """The checkpoint's model, refused before anything is written when its dictionaries are
    missing or not the ones it was trained with, or it would not fit in memory."""
    sizes = [int(s) for s in meta.get("table_sizes", [])]
    dims_meta = meta.get("dims") or {}
    if len(sizes) != len(CAT_COLUMNS) or not dims_meta:
        raise CheckpointError(f"{checkpoint / 'meta.json'} names no table sizes or dims")
    dims = ModelDims.from_meta(dims_meta)
    ids = identity_mode(meta.get(IDENTITY_KEY))
    dictionaries = _dictionaries_of(layout, checkpoint)
    if dictionaries is None:  # capped: the ids are the values' own, no dictionary to check
        identity, extended = meta[IDENTITY_KEY], None
    else:
        if not ids.contiguous:  # a contiguous column always has its folder (missing is a value)
            _check_dictionary_folders(dictionaries, sizes)
        identity, extended = check_dataset_identity(checkpoint, meta, dictionaries)
    multi_hot = multi_hot_spec(checkpoint, dims_meta, sizes)
    # the wide weights are one more column of every table; a multi-hot column adds its
    # lookup table (table rows x k int32)
    size = check_export_fits(
        sizes,
        dims.embedding_dim + int(dims.wide),
        config,
        sum(multi_hot.table_bytes(c) for c in range(len(sizes))) if multi_hot is not None else 0,
        vocabularies=not ids.capped,
        values=_dictionary_rows(dictionaries) if ids.contiguous and dictionaries is not None else None,
    )
    return _Source(checkpoint, meta, dims, sizes, identity, size, extended, multi_hot, ids)


def multi_hot_spec(checkpoint: Path, dims_meta: dict[str, Any], sizes: list[int]) -> MultiHotSpec | None:
    """The materialization a multi-hot checkpoint was trained on (its dims record the
    dataset's sizes, seed and distribution; the draws depend on the table sizes too), so that
    the export turns a raw value's one-hot id into the same row of ids; None when one-hot."""
    if MULTI_HOT_SIZES_KEY not in dims_meta:
        return None
    try:
        return MultiHotSpec(
            tuple(sizes),
            tuple(dims_meta[MULTI_HOT_SIZES_KEY]),
            int(dims_meta.get(MULTI_HOT_SEED_KEY, DEFAULT_SEED)),
            str(dims_meta.get(MULTI_HOT_DISTRIBUTION_KEY, "uniform")),
        )
    except (MultiHotError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"{checkpoint / 'meta.json'} records a multi-hot layout that cannot be materialized ({exc})"
        ) from None


def _write_version(
    layout: WorkdirLayout, reader: CheckpointReader, source: _Source, dataset: Path, config: ExportConfig
) -> tuple[Path, dict[str, Any]]:
    """The next version, written beside its final name and renamed into place; returns its
    path and fingerprint."""
    layout.export.mkdir(parents=True, exist_ok=True)
    version = next_version(layout.export)
    final = layout.export / str(version)
    remove_stale_temporaries(final)  # left by an export of this version that was killed
    # Inside DIR/export (one filesystem: the rename is atomic); a server ignores the name.
    temporary = temporary_sibling(final)
    try:
        vocabularies = None
        if source.contiguous:
            vocabularies = write_contiguous_vocabularies(
                layout.dictionaries_of(source.ids), temporary / "vocabularies"
            )
        elif not source.capped:
            vocabularies = write_vocabularies(layout.dictionaries, source.sizes, temporary / "vocabularies")
        saved_model = temporary / "model"
        _save(reader, source, vocabularies, saved_model, config)
        verify_saved_model(saved_model, capped_ids=source.capped, contiguous_ids=source.contiguous)
        fingerprint = _fingerprint(layout, dataset, source, saved_model, config, version)
        (saved_model / FINGERPRINT).write_text(json.dumps(fingerprint, indent=1) + "\n")
        # on disk, renamed to a new name (never replacing a version a server loaded), the
        # rename on disk: only then may pruning delete older versions
        publish(saved_model, final)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return final, fingerprint


def verify_saved_model(saved_model: Path, capped_ids: bool = False, contiguous_ids: bool = False) -> None:
    """Load the SavedModel as a server would and score a few lines through both signatures:
    a probability in [0, 1], the same from both, for a line of missing values and for one of
    each column's first known value (``capped_ids``: a model with no vocabulary, every hex
    value has an id: CAPPED_TEST_VALUE; ``contiguous_ids``: the first value after the
    vocabulary's two header lines). Refused (ExportError) otherwise, before the version is
    renamed into place, so that a server never loads a model that cannot answer."""
    import tensorflow as tf

    from dlrm_contracts.schema import NUM_CATEGORICAL

    known = []
    for column in CAT_COLUMNS:
        if capped_ids:
            known.append(CAPPED_TEST_VALUE)
            continue
        lines = (saved_model / "assets" / f"{column}.vocab").read_text(encoding="ascii").split("\n")
        first = 2 if contiguous_ids else 1
        known.append(lines[first] if len(lines) > first and lines[first] else "")
    rows = [([""] * NUM_INTEGER, [""] * NUM_CATEGORICAL), (["1"] * NUM_INTEGER, known)]
    lines = ["\t".join(["0", *ints, *cats]) for ints, cats in rows]
    try:
        model = tf.saved_model.load(str(saved_model))
        by_line = model.signatures["serve_lines"](
            lines=tf.constant(lines), has_label=tf.constant([True] * len(lines))
        )
        by_features = model.signatures["serve_features"](
            int_features=tf.constant(
                [[-(2**63) if not v else int(v) for v in ints] for ints, _ in rows], tf.int64
            ),
            cat_features=tf.constant([cats for _, cats in rows]),
        )
        probability = by_line["probability"].numpy()
        reasons = by_line["reject_reason"].numpy().tolist()
        agree = np.array_equal(probability, by_features["probability"].numpy())
    except (tf.errors.OpError, ValueError, KeyError, OSError) as exc:
        raise ExportError(
            f"the new version does not load and score in TensorFlow "
            f"({type(exc).__name__}: {exc}); nothing was written"
        ) from None
    if (
        reasons != [b""] * len(rows)
        or not agree
        or not np.all(np.isfinite(probability) & (probability >= 0) & (probability <= 1))
    ):
        raise ExportError(
            f"the new version scores test lines wrongly (probabilities "
            f"{probability.tolist()}, reasons {reasons}, signatures agree: {agree}); "
            "nothing was written"
        )


def _weights(reader: CheckpointReader, dims: ModelDims, sizes: list[int]) -> ServingWeights:
    """The checkpoint's model as the serving modules take it: tables (a generator: each one is
    read, copied into its variable and released before the next), MLPs, wide weights and
    cross layers."""
    from trainer.model import cross_sizes, wide_key
    from trainer.serving import ServingWeights

    top_in = dims.top_input(len(CAT_COLUMNS) + 1)
    return ServingWeights(
        tables=(
            reader.value(f"table/{t}/0-{dims.embedding_dim}", (rows, dims.embedding_dim))
            for t, rows in enumerate(sizes)
        ),
        bottom=_mlp_weights(reader, "bottom", dims.bottom_mlp, NUM_INTEGER),
        top=_mlp_weights(reader, "top", dims.top_mlp, top_in),
        wide=(
            [reader.value(wide_key(t, dims.embedding_dim), (rows, 1)) for t, rows in enumerate(sizes)]
            if dims.wide
            else None
        ),
        cross=(
            {
                name: reader.value(name, shape)
                for name, shape in cross_sizes(top_in, dims.dcn_layers, dims.dcn_rank).items()
            }
            if dims.interaction == "dcn"
            else None
        ),
    )


def _save(
    reader: CheckpointReader,
    source: _Source,
    vocabularies: list[Path] | None,
    out: Path,
    config: ExportConfig,
) -> None:
    import tensorflow as tf

    from trainer.serving import RawIds, ServingDLRM

    expansions = None
    if source.multi_hot is not None:  # one lookup table per multi-hot column
        built = dict(iter_tables(source.multi_hot))
        expansions = [built.get(c) for c in range(len(source.sizes))]
    raw_ids = RawIds(vocabularies, source.sizes if source.capped else None, source.contiguous)
    module = ServingDLRM(
        source.dims, _weights(reader, source.dims, source.sizes), config.missing_integer, raw_ids, expansions
    )
    lines = module.serve_lines.get_concrete_function()
    # serving_default: what TensorFlow Serving answers when a request names no signature.
    signatures = {
        "serve_features": module.serve_features.get_concrete_function(),
        "serve_lines": lines,
        "serving_default": lines,
    }
    if expansions is not None:
        signatures["serve_multi_hot"] = module.serve_multi_hot.get_concrete_function()
    tf.saved_model.save(module, str(out), signatures=signatures)
