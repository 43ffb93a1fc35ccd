"""``run_preprocess`` (what ``python -m spark_jobs`` runs) with its input and workdir in a bucket
of a real S3-compatible server (the session's moto server): the published splits, the
dictionaries and the records equal a local run's byte for byte, a rerun at another threshold
reuses the counts, a run killed between a split's files and its commit marker leaves readers
nothing of that split and is recovered by the next run, and what a URL cannot take is refused
in one line."""

from __future__ import annotations


import pytest

from dlrm_contracts import object_commit, workdir_io
from dlrm_contracts.config import PreprocessConfig
from dlrm_contracts.layout import SUCCESS, WorkdirLayout
from dlrm_contracts.schema import SPLITS
from dlrm_contracts.storage import resolve
from spark_fixtures import BAD_LINES, random_days, spark_config, spark_session, write_days
from spark_jobs.preprocess import clean_outputs, run_preprocess
from spark_store_helpers import published_bytes as _published, run_arrow as _run, stable_summary as _summary

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def store(moto_s3):
    """The moto server reached by Spark's Python workers too; a bucket for this module."""
    session = spark_session()
    environment = moto_s3.environment()
    session.sparkContext.environment.update(environment)
    yield moto_s3.bucket("spark-jobs")
    for key in environment:
        session.sparkContext.environment.pop(key, None)


@pytest.fixture(scope="module")
def raw(tmp_path_factory, moto_s3, store):
    """Three small days (one with rejected lines) on disk, and the same files in the bucket."""
    days = random_days(381, 3, 300)
    days[1] += BAD_LINES["bad_label"][:2]
    local = write_days(tmp_path_factory.mktemp("raw"), days)
    client = moto_s3.client()
    for path in sorted(local.glob("day_*")):
        client.upload_file(str(path), store, f"raw/{path.name}")
    return local, f"s3://{store}/raw"


def _versions(final) -> list[str]:
    return [e.name for e in final.iterdir() if e.name.startswith(object_commit.VERSION_PREFIX)]


@pytest.fixture(scope="module")
def local_run(raw, tmp_path_factory) -> tuple[dict, dict]:
    """A local workdir's run at threshold 3: (published files, summary)."""
    workdir = tmp_path_factory.mktemp("local")
    _run(raw[0], workdir, "3")
    published = _published(workdir)
    assert published["rejects"], "the input has rejected lines"
    return published, _summary(workdir)


def test_bucket_run_publishes_the_local_run_s_bytes_and_reruns_at_another_threshold(raw, store, local_run):
    url = f"s3://{store}/work"
    first = _run(raw[1], url, "2")
    assert first["days_counted"] == [0, 1, 2]
    layout = WorkdirLayout.at(url)
    assert workdir_io.exists(layout.parquet / SUCCESS)
    assert object_commit.is_committed(layout.parquet / "train")
    assert not (layout.parquet / ".splits-staging").files()
    # the engine wrote every split straight into the run's one version: nothing was copied
    markers = [object_commit.read_marker(layout.parquet / s) for s in SPLITS]
    assert len({m["version"] for m in markers if m}) == 1
    at_2 = _published(url)
    assert at_2 != local_run[0]

    # a new threshold: no day counted again (as locally), the bytes of a local run at it
    again = _run(raw[1], url, "3")
    assert again["days_counted"] == [] and again["days_reused"] == [0, 1, 2]
    assert _published(url) == local_run[0]
    reused = {"days_counted": [0, 1, 2], "days_reused": []}  # the local run counted them
    assert {**_summary(url), **reused} == local_run[1]
    for name in (*SPLITS, "dictionaries"):  # the superseded versions are gone
        assert len(_versions(layout.parquet / name)) == 1, name

    clean_outputs(url)  # the job's outputs go, the counts stay
    assert not layout.parquet.files() and not layout.rejects.files()
    assert workdir_io.exists(layout.counts / "days.json")


def test_a_run_killed_before_its_marker_is_recovered_by_the_next(raw, store, local_run, monkeypatch):
    url = f"s3://{store}/killed"
    layout = WorkdirLayout.at(url)
    train = layout.parquet / "train"
    real = object_commit.write_marker

    def killed(final, version, files):
        if final.name == "train":  # the train split's files are up, its marker is not
            raise KeyboardInterrupt("killed")
        real(final, version, files)

    monkeypatch.setattr(object_commit, "write_marker", killed)
    with pytest.raises(KeyboardInterrupt):
        _run(raw[1], url, "3")
    monkeypatch.setattr(object_commit, "write_marker", real)
    assert not workdir_io.exists(layout.parquet / SUCCESS)
    assert len(_versions(train)) == 1 and train.files()  # its files are there ...
    assert workdir_io.published_dir(train) is None  # ... and no reader trusts them
    assert workdir_io.published_files(train) == []

    # the next run counts nothing again (days.json was written before the transform),
    # publishes every split and deletes the killed run's version
    again = _run(raw[1], url, "3")
    assert again["days_counted"] == []
    assert _published(url) == local_run[0]
    assert workdir_io.exists(layout.parquet / SUCCESS)
    assert len(_versions(train)) == 1

    # killed again, now with a publication in place: readers keep it, the killed run's files
    # lie beside it unnamed (the next publication deletes them, as above)
    published = {p.name: p.read_bytes() for p in workdir_io.published_files(train)}
    monkeypatch.setattr(object_commit, "write_marker", killed)
    with pytest.raises(KeyboardInterrupt):
        _run(raw[1], url, "2")
    monkeypatch.setattr(object_commit, "write_marker", real)
    assert not workdir_io.exists(layout.parquet / SUCCESS)
    assert len(_versions(train)) == 2
    assert {p.name: p.read_bytes() for p in workdir_io.published_files(train)} == published


@pytest.mark.parametrize("ids", ["stable", "contiguous"])
def test_stable_and_contiguous_ids_at_a_url_are_refused_before_anything_is_written(raw, store, ids):
    from spark_jobs.errors import PreprocessConfigError

    url = f"s3://{store}/{ids}"
    with pytest.raises(PreprocessConfigError, match=f"ids: {ids} needs a workdir on a"):
        run_preprocess(raw[1], url, spark_config(), PreprocessConfig(frequency_threshold="2", ids=ids))
    assert not resolve(url).files()


def test_the_sql_engine_without_spark_s_s3_connector_is_refused_in_one_line(raw, store, tmp_path):
    """This Spark has no hadoop-aws: a URL for the SQL engine is exit 2 naming the settings,
    before the workdir is touched (not a Java stack trace from its first read)."""
    from dlrm_contracts.errors import ExitCode
    from spark_jobs.errors import PreprocessConfigError

    url = f"s3://{store}/sql"
    for input_dir, workdir in ((raw[1], url), (raw[0], url), (raw[1], tmp_path / "work")):
        with pytest.raises(PreprocessConfigError, match="hadoop-aws") as error:
            run_preprocess(
                input_dir, workdir, spark_config(), PreprocessConfig(frequency_threshold="2", engine="sql")
            )
        assert error.value.code == ExitCode.USAGE and "\n" not in str(error.value)
    assert not resolve(url).files() and not (tmp_path / "work").exists()


def test_a_workdir_in_a_missing_bucket_is_one_line_at_the_lock(moto_s3):
    """The job's first write at a workdir URL is its lock: a bucket that does not exist is a
    usage error (exit 2) naming it, not a traceback."""
    from dlrm_contracts.errors import ExitCode
    from dlrm_contracts.lock import workdir_lock
    from dlrm_contracts.storage import StorageError

    lock = workdir_lock("s3://no-such-bucket-i38/work", "spark_jobs")
    with pytest.raises(StorageError, match="the bucket no-such-bucket-i38 does not exist") as error:
        lock.__enter__()
    assert error.value.code == ExitCode.USAGE
