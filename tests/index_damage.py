"""Damages to the dictionary index, for tests/test_index_damage.py.

Run as a script, in a process of its own so that a signal death or a hang is the test's failure
and not the test runner's:

    python tests/index_damage.py fuzz SEED COUNT DIR
        COUNT seeded random damages to index.json and to the range files of a small index
        built in DIR, each opened and looked up in this process; prints one JSON line: the
        outcome of each damage (refused, same ids, other ids) and any failure.
    python tests/index_damage.py spark KIND -- <python -m spark_jobs arguments>
        the preprocess command with the index damaged (KIND) once the dictionary tasks have
        sealed it, before the transform reads it.

A damage is "forged" when the checksums it invalidates are recomputed, as a hostile writer
would: then only the structural checks stand between the damage and the mapping, and the test
asks for a refusal or a lookup that ends (other ids are then possible, and counted).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_jobs.engines.arrow import dictionary_index as di
from spark_jobs.engines.arrow import index_checks

COLUMNS = ("C1", "C2", "C3")
FIX = "--stages preprocess --force"


def build(index_dir: Path, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """A sealed index of three columns: C1 in three ranges, C2 in two (the second keeps
    nothing), C3 keeps nothing. Returns the queries and the ids they must give."""
    rng = np.random.default_rng(seed)
    specs = {
        "C1": (np.array([0, 10**9, 3 * 10**9], np.uint32), 3000),
        "C2": (np.array([0, 2**31], np.uint32), 700),
        "C3": (np.zeros(1, np.uint32), 0),
    }
    queries, expected = [], []
    layouts, contents = {}, {}
    for name, (bounds, kept) in specs.items():
        top = 2**31 if name == "C2" else 2**32
        values = np.unique(rng.integers(0, top, kept, dtype=np.uint64)).astype(np.uint32)
        ids = (rng.permutation(len(values)) + 1).astype(np.int32)
        cut = np.concatenate([[0], np.searchsorted(values, bounds[1:]), [len(values)]])
        layouts[name] = di.ColumnLayout.of(bounds, np.diff(cut))
        contents[name] = (values, ids, cut)
        absent = rng.integers(0, 2**32, 500, dtype=np.int64)
        known = dict(zip(values.tolist(), ids.tolist()))
        query = np.concatenate([values.astype(np.int64), absent, [-1, 0, 2**32 - 1]])
        queries.append(query)
        expected.append([known.get(int(q), 0) for q in query])
    di.create_index(index_dir, layouts)
    for name, (values, ids, cut) in contents.items():
        for r in range(len(layouts[name].sizes)):
            di.write_region(
                str(index_dir),
                name,
                r,
                int(layouts[name].sizes[r]),
                values[cut[r] : cut[r + 1]],
                ids[cut[r] : cut[r + 1]],
            )
    di.seal_index(index_dir)
    width = max(len(q) for q in queries)
    padded = np.full((len(COLUMNS), width), -1, np.int64)
    want = np.zeros((len(COLUMNS), width), np.int32)
    for j, (q, e) in enumerate(zip(queries, expected)):
        padded[j, : len(q)], want[j, : len(e)] = q, e
    return padded, want


# ---------------------------------------------------------------- damages


def _meta(index_dir: Path) -> dict:
    return json.loads((index_dir / di.INDEX_JSON).read_text())


def _write_meta(index_dir: Path, meta, forge: bool) -> None:
    if forge and isinstance(meta, dict) and isinstance(meta.get("columns"), dict):
        meta["checksum"] = index_checks.meta_checksum(meta["columns"])
    (index_dir / di.INDEX_JSON).write_text(json.dumps(meta))


def _region_files(index_dir: Path) -> list[Path]:
    return sorted(index_dir.glob("*/*.slots"))


def _reseal_file(index_dir: Path, path: Path) -> None:
    """A forged range file: its new checksum recorded, and index.json's own recomputed."""
    meta = _meta(index_dir)
    if path.is_file() and path.stat().st_size:
        meta["columns"][path.parent.name]["checksums"][int(path.stem)] = di._file_checksum(path)
    _write_meta(index_dir, meta, forge=True)


def damage_json_bytes(rng: random.Random, index_dir: Path) -> str:
    path = index_dir / di.INDEX_JSON
    data = bytearray(path.read_bytes())
    how = rng.choice(["truncate", "flip", "garbage", "empty", "literal"])
    if how == "truncate":
        data = data[: rng.randrange(len(data))]
    elif how == "flip":
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif how == "garbage":
        data = bytearray(rng.randbytes(rng.randint(1, 3000)))
    elif how == "empty":
        data = bytearray()
    else:
        data = bytearray(rng.choice([b"null", b"[]", b"{}", b"1", b'"x"', b"[" * 100000]))
    path.write_bytes(bytes(data))
    return f"json-bytes:{how}"


_ODD_VALUES = [-1, -(2**63), 2**32, 2**63, 2**70, 1.5, "7", True, None, [], {}]


def damage_json_fields(rng: random.Random, index_dir: Path, forge: bool) -> str:
    meta = _meta(index_dir)
    column = rng.choice(COLUMNS)
    entry = meta["columns"][column]
    key = rng.choice(["bounds", "starts", "sizes", "checksums"])
    items = entry[key]
    how = rng.choice(
        ["shift", "odd", "drop", "append", "swap", "remove-key", "column", "version", "unseal", "page"]
    )
    if how == "shift":
        i = rng.randrange(len(items))
        if isinstance(items[i], int):
            items[i] += rng.choice([-512, -1, 1, 8, 512, 2**20])
        else:
            items[i] = None
    elif how == "odd":
        items[rng.randrange(len(items))] = rng.choice(_ODD_VALUES)
    elif how == "drop":
        items.pop(rng.randrange(len(items)))
    elif how == "append":
        items.append(rng.choice([0, 512, 2**32 - 1, 2**34]))
    elif how == "swap" and len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        items[i], items[j] = items[j], items[i]
    elif how == "remove-key":
        del entry[key]
    elif how == "column":
        del meta["columns"][column]
    elif how == "version":
        meta["format_version"] = rng.choice([2, 4, "3", None])
    elif how == "unseal":
        meta.pop("checksum")
    elif how == "page":  # a range grown by a page, the starts after it moved
        sizes = entry["sizes"]
        i = rng.randrange(len(sizes))
        sizes[i] += 512
        entry["starts"] = [sum(sizes[:k]) for k in range(len(sizes))]
    _write_meta(index_dir, meta, forge and how != "unseal")
    return f"json-fields:{key}:{how}"


def damage_region(rng: random.Random, index_dir: Path, forge: bool) -> str:
    files = _region_files(index_dir)
    path = rng.choice(files)
    data = bytearray(path.read_bytes())
    how = rng.choice(
        [
            "flip-key",
            "flip-id",
            "flip-any",
            "truncate",
            "extend",
            "zero",
            "full",
            "missing",
            "directory",
            "swap",
            "extra",
            "same-bytes",
        ]
    )
    slots = np.frombuffer(bytes(data), np.uint64)
    filled = np.flatnonzero(slots)
    if how in ("flip-key", "flip-id"):
        s = int(rng.choice(filled))
        bit = rng.randrange(32) + (32 if how == "flip-id" else 0)
        data[8 * s + bit // 8] ^= 1 << (bit % 8)
    elif how == "flip-any":
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif how == "truncate":
        data = data[: rng.choice([0, 8, len(data) - 8, len(data) - 1, len(data) - 4096])]
    elif how == "extend":
        data += bytes(rng.choice([1, 8, 4096]))
    elif how == "zero":
        data = bytearray(len(data))
    elif how == "full":  # no empty slot left: a probe for an absent value never
        full = np.frombuffer(rng.randbytes(len(data)), np.uint64) | np.uint64(1)  # meets one
        data = bytearray(full.tobytes())
    elif how == "missing":
        path.unlink()
        data = None
    elif how == "directory":
        path.unlink()
        path.mkdir()
        data = None
    elif how == "swap":
        others = [f for f in files if f != path and f.stat().st_size == len(data)]
        if others:
            other = rng.choice(others)
            other_bytes = other.read_bytes()
            other.write_bytes(bytes(data))
            data = bytearray(other_bytes)
    elif how == "extra":  # a file where a range keeps nothing
        path = index_dir / "C2" / "00001.slots"
        data = bytearray(rng.randbytes(4096))
    if data is not None:
        path.write_bytes(bytes(data))
    if forge:
        _reseal_file(index_dir, path)
    return f"region:{how}"


# ---------------------------------------------------------------- the fuzz


def outcome(index_dir: Path, queries: np.ndarray, want: np.ndarray) -> str:
    """refused (one line naming a file of the index and the fix), same or other ids; any
    other exception propagates."""
    try:
        index = di.DictionaryIndex(str(index_dir), COLUMNS)
    except index_checks.DictionaryIndexError as error:
        message = str(error)
        if "\n" in message or str(index_dir) not in message or FIX not in message:
            raise AssertionError(f"not one line naming the file and the fix: {message!r}") from None
        return "refused"
    out = np.zeros(queries.shape, np.int32)
    index.lookup_into(queries, out)
    return "same" if np.array_equal(out, want) else "other ids"


def fuzz(seed: int, count: int, root: Path) -> dict:
    pristine = root / "pristine"
    queries, want = build(pristine)
    assert outcome(pristine, queries, want) == "same"
    rng = random.Random(seed)
    results, failures = {}, []
    for n in range(count):
        work = root / f"damaged-{n % 2}"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(pristine, work)
        forge = rng.random() < 0.4
        target = rng.random()
        if target < 0.2:
            kind, forge = damage_json_bytes(rng, work), False
        elif target < 0.55:
            kind = damage_json_fields(rng, work, forge)
        else:
            kind = damage_region(rng, work, forge)
        key = f"{'forged ' if forge else ''}{kind}"
        try:
            got = outcome(work, queries, want)
        except Exception as error:  # noqa: BLE001 (reported, then failed)
            failures.append(f"{n} {key}: {type(error).__name__}: {error}"[:400])
            continue
        if got == "other ids" and not forge:
            failures.append(f"{n} {key}: other ids, no error")
        results.setdefault(key, {}).setdefault(got, 0)
        results[key][got] += 1
    return {"results": results, "failures": failures}


# ---------------------------------------------------------------- a real preprocess run


def damage_sealed(kind: str, index_dir: Path) -> None:
    """One damage of a sealed index as found in a real run: a flipped key in the largest range
    file (same size, other bytes), or index.json cut short."""
    if kind == "flip-key":
        path = max(_region_files(index_dir), key=lambda p: p.stat().st_size)
        slots = np.fromfile(path, np.uint64)
        s = int(np.flatnonzero(slots)[0])
        slots[s] ^= np.uint64(1)
        slots.tofile(path)
    elif kind == "index-json":
        path = index_dir / di.INDEX_JSON
        path.write_bytes(path.read_bytes()[:-20])
    else:
        raise ValueError(kind)


def run_damaged_preprocess(kind: str, argv: list[str]) -> int:
    """``python -m spark_jobs argv`` with the index damaged right after it is sealed."""
    from spark_jobs.cli import main
    from spark_jobs.engines.arrow.engine import ArrowEngine

    write = ArrowEngine.__dict__["write_dictionaries"]  # dispatches on the numbering once bound

    def write_then_damage(self, numbering, dict_dir, index_dir):
        kept = write.__get__(self, ArrowEngine)(numbering, dict_dir, index_dir)
        damage_sealed(kind, Path(index_dir))
        return kept

    ArrowEngine.write_dictionaries = write_then_damage
    return main(argv)


if __name__ == "__main__":
    if sys.argv[1] == "fuzz":
        print(json.dumps(fuzz(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))))
    elif sys.argv[1] == "spark":
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        sys.exit(run_damaged_preprocess(sys.argv[2], sys.argv[sys.argv.index("--") + 1 :]))
    else:
        sys.exit(f"unknown mode {sys.argv[1]}")
