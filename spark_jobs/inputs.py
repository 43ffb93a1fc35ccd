"""Finding the day files of a raw input directory, fingerprinting them, sizing their lines.

Day files are ``day_<k>`` or ``day_<k>.gz`` for k = 0..N-1 (with a window of W days, the newest
W of them). A gap, a duplicate (``day_3`` and ``day_3.gz``), an empty file or fewer than two
days is an input error: training on a silently shortened log is worse than stopping.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from dlrm_contracts.content_sample import sampled_hash, sampled_hash_of
from dlrm_contracts.storage import Location, is_url, resolve
from spark_jobs.errors import PreprocessInputError

_DAY_NAME = re.compile(r"^day_(\d+)(\.gz)?$")


@dataclass(frozen=True)
class DayFile:
    day: int
    path: Path | Location  # a Location for a day file at a URL (dlrm_contracts.storage)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def gzipped(self) -> bool:
        return self.path.name.endswith(".gz")

    def size(self) -> int:
        """The file's bytes (at a URL: one HEAD request)."""
        if isinstance(self.path, Location):
            return self.path.size()
        return self.path.stat().st_size

    def fingerprint(self) -> str:
        """Name, size, mtime and a hash of a few sampled blocks: a replaced file is noticed
        even when it kept its size and had its mtime put back, for a few reads of it."""
        if isinstance(self.path, Location):
            with self.path.open_input() as fh:
                size = fh.size()
                digest = sampled_hash_of(lambda offset, length: fh.read_at(length, offset), size)
            return f"{self.name}:{size}:{self.path.mtime_ns()}:{digest}"
        st = self.path.stat()
        return f"{self.name}:{st.st_size}:{st.st_mtime_ns}:{sampled_hash(self.path)}"


def _check_link(path: Path, root: Path, link_roots: tuple[str, ...]) -> None:
    """A day file that is a symbolic link must point inside the input directory or one of
    ``link_roots`` (preprocess.input_link_roots)."""
    if not path.is_symlink():
        return
    target = path.resolve()
    allowed = [root.resolve(), *(Path(r).resolve() for r in link_roots)]
    if not any(target.is_relative_to(base) for base in allowed):
        roots = ", ".join(str(r) for r in allowed)
        raise PreprocessInputError(
            f"day file {path} is a symbolic link to {target}, outside the input directory "
            f"(allowed: {roots}): a link in a landing directory could make the job read any "
            "file; copy the file in, or add its directory to preprocess.input_link_roots"
        )


def discover_days(
    input_dir: str | Path, window_days: int | None = None, link_roots: tuple[str, ...] | list[str] = ()
) -> list[DayFile]:
    """The day files of ``input_dir`` ordered by day number, or a PreprocessInputError.

    ``window_days`` (``preprocess.window_days``): only the newest N days are the data, the
    one place the window is applied (the job, its progress and the preflight all call this).
    Older day files are ignored as they are (never read, checked or deleted): a scheduled job
    may archive them. The window itself must be whole: days k-N+1..k for the newest k, or
    0..k while fewer than N exist. A day file of the window that is a symbolic link must point
    inside ``input_dir`` or one of ``link_roots`` (preprocess.input_link_roots).
    """
    if is_url(input_dir):
        return _discover_days_at_url(resolve(input_dir), window_days)
    root = Path(input_dir)
    if not root.is_dir():
        raise PreprocessInputError(f"input directory {root} does not exist or is not a directory")
    by_day: dict[int, list[Path]] = {}
    for path in root.iterdir():
        match = _DAY_NAME.match(path.name)
        if match and path.is_file():
            by_day.setdefault(int(match.group(1)), []).append(path)
    if not by_day:
        raise PreprocessInputError(f"no day files (day_0, day_1, ... or day_<k>.gz) in {root}")
    days = _whole_window(by_day, window_days, root)
    for day in days:
        _check_link(day.path, root, tuple(link_roots))
        if day.path.stat().st_size == 0:
            raise PreprocessInputError(f"day file {day.path} is empty")
        if day.gzipped:
            with open(day.path, "rb") as fh:
                if fh.read(2) != b"\x1f\x8b":
                    raise PreprocessInputError(
                        f"day file {day.path} is not gzip-compressed "
                        "(no gzip header); decompress it or drop '.gz'"
                    )
    return days


def _whole_window(by_day: dict, window_days: int | None, root) -> list[DayFile]:
    """The window's day files in day order, or the error naming a duplicate or a gap."""
    first = 0 if window_days is None else max(0, max(by_day) - window_days + 1)
    by_day = {d: paths for d, paths in by_day.items() if d >= first}
    duplicates = {d: ps for d, ps in by_day.items() if len(ps) > 1}
    if duplicates:
        day, paths = min(duplicates.items())
        names = " and ".join(sorted(p.name for p in paths))
        raise PreprocessInputError(f"day {day} is given twice in {root}: {names}; keep one")
    missing = sorted(set(range(first, max(by_day) + 1)) - set(by_day))
    if missing:
        listed = ", ".join(f"day_{d}" for d in missing[:5])
        scope = (
            f"days must run from day_0 to day_{max(by_day)} without gaps"
            if window_days is None
            else f"the window of {window_days} days (preprocess.window_days) is day_{first} to "
            f"day_{max(by_day)}, without gaps"
        )
        raise PreprocessInputError(f"missing day file(s) {listed} in {root}: {scope}")
    if len(by_day) < 2:
        raise PreprocessInputError(
            f"only one day file in {root}: need at least two "
            "(train days, then the last day for test/validation)"
        )
    return [DayFile(d, by_day[d][0]) for d in sorted(by_day)]


def _discover_days_at_url(root: Location, window_days: int | None) -> list[DayFile]:
    """:func:`discover_days` for an input at a URL (one listing, then per day file of the
    window a size and a 2-byte read for .gz); object stores have no symbolic links."""
    by_day: dict[int, list[Location]] = {}
    for entry in root.iterdir():
        match = _DAY_NAME.match(entry.name)
        if match and entry.is_file():
            by_day.setdefault(int(match.group(1)), []).append(entry)
    if not by_day:
        raise PreprocessInputError(f"no day files (day_0, day_1, ... or day_<k>.gz) in {root}")
    days = _whole_window(by_day, window_days, root)
    for day in days:
        if day.path.size() == 0:
            raise PreprocessInputError(f"day file {day.path} is empty")
        if day.gzipped and day.path.read_range(0, 2) != b"\x1f\x8b":
            raise PreprocessInputError(
                f"day file {day.path} is not gzip-compressed (no gzip header); decompress it or drop '.gz'"
            )
    return days


def bytes_per_line(path: Path | Location, sample_bytes: int) -> float:
    """Bytes of the file per line, from its first ``sample_bytes`` (compressed bytes for .gz).

    A file no longer than the sample is counted whole, so its estimate is its line count.
    Raises UnreadableSample for a gzip file that is truncated or corrupt within the sample.
    """
    if isinstance(path, Location):
        chunk = path.read_range(0, sample_bytes)  # one ranged request
    else:
        with open(path, "rb") as fh:
            chunk = fh.read(sample_bytes)
    whole = len(chunk) < sample_bytes
    if path.name.endswith(".gz"):
        lines, read, ends_open = _gunzip_sample(path, chunk, whole, SAMPLE_TEXT_RATIO * sample_bytes)
    else:
        lines, read, ends_open = chunk.count(b"\n"), len(chunk), not chunk.endswith(b"\n")
    lines += 1 if whole and read and ends_open else 0
    return read / lines if lines else float(read)


# Text a gzip sample may inflate to, per compressed byte: Criteo text compresses about 5:1,
# deflate at most about 1000:1 (a day of zeros), so a bomb is cut short, not inflated whole.
SAMPLE_TEXT_RATIO = 16
_PIECE = 1 << 20


class UnreadableSample(ValueError):
    """A day file whose sample cannot be decompressed; the message names the file."""


def _gunzip_sample(path: Path, chunk: bytes, whole: bool, max_text: int) -> tuple[int, int, bool]:
    """(lines, compressed bytes they came from, whether the text ends without '\\n') of the
    sample, inflated a piece at a time up to ``max_text`` bytes of text; a whole file must end
    its gzip stream (else it is truncated)."""
    stream = zlib.decompressobj(wbits=47)  # gzip or zlib header, detected
    lines, text, data, last = 0, 0, chunk, b"\n"
    try:
        while text < max_text:
            piece = stream.decompress(data, _PIECE)
            lines, text, last = lines + piece.count(b"\n"), text + len(piece), piece[-1:] or last
            data = stream.unconsumed_tail
            if stream.eof or (not data and len(piece) < _PIECE):
                break
    except zlib.error as exc:
        raise UnreadableSample(f"{path} is not a readable gzip file (corrupt: {exc})") from None
    if text >= max_text and not stream.eof:  # cut short: the bytes that made this text
        return lines, len(chunk) - len(stream.unconsumed_tail), False
    if whole and chunk and not stream.eof:
        raise UnreadableSample(
            f"{path} is not a readable gzip file (truncated: its stream ends "
            f"before the end-of-stream marker, at {len(chunk):,} bytes)"
        )
    return lines, len(chunk), last != b"\n"
