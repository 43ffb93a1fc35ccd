"""Both engines keep spark_jobs.engine.Engine: every method of the contract, with its
parameters in the same order and with the same defaults, and its attributes.

The Protocol is structural: the type checker holds both engines to it
(spark_jobs/engine_conformance.py), and this checks the same calling shape at run time, so a
drifted method (a parameter added to one engine only, a return the caller ignores) is caught by
the suite as well as by mypy.
"""

from __future__ import annotations

import inspect

import pytest

from spark_jobs.engine import AfterPrevious, ByCount, ByFirstAppearance, Engine, Numbering
from spark_jobs.engines.arrow.engine import ArrowEngine
from spark_jobs.engines.sql.engine import SqlEngine

METHODS = [
    name for name, member in vars(Engine).items() if inspect.isfunction(member) and not name.startswith("_")
]


def _parameters(function) -> list[tuple[str, object, object]]:
    """(name, kind, default) of each parameter; annotations are strings (postponed) and the
    engines may spell them differently, so only the calling shape is compared."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def _returns(function) -> str:
    return inspect.signature(function).return_annotation


def test_the_contract_names_every_phase():
    assert set(METHODS) == {
        "count",
        "count_statistics",
        "write_rejects",
        "count_totals",
        "finish_counts",
        "use_previous_dictionaries",
        "write_dictionaries",
        "write_splits",
        "close",
    }


@pytest.mark.parametrize("engine", [ArrowEngine, SqlEngine], ids=["arrow", "sql"])
@pytest.mark.parametrize("method", METHODS)
def test_an_engine_keeps_each_method_of_the_contract(engine, method):
    assert callable(getattr(engine, method, None)), f"{engine.__name__} lacks {method}"
    assert _parameters(getattr(engine, method)) == _parameters(getattr(Engine, method))
    # what a phase returns is the contract's: None where the caller takes nothing back
    assert (_returns(getattr(engine, method)) == "None") == (_returns(getattr(Engine, method)) == "None")


@pytest.mark.parametrize("engine", [ArrowEngine, SqlEngine], ids=["arrow", "sql"])
def test_an_engine_names_itself_and_its_lookups(engine):
    assert isinstance(engine.name, str) and engine.name in ("arrow", "sql")
    assert isinstance(engine.lookups, str) and engine.lookups


@pytest.mark.parametrize("engine", [ArrowEngine, SqlEngine], ids=["arrow", "sql"])
def test_an_engine_implements_every_numbering_and_refuses_others(engine, tmp_path):
    """The dictionaries phase is one method; which numbering runs is the argument's type (the
    mode's steps chose it), so each engine has an implementation for each of the contract's
    numberings and no branch on the mode."""
    assert set(Numbering.__args__) == {ByCount, AfterPrevious, ByFirstAppearance}
    registry = vars(engine)["write_dictionaries"].dispatcher.registry
    for numbering in Numbering.__args__:
        assert registry[numbering] is not registry[object], f"{engine.__name__}: {numbering.__name__}"
    with pytest.raises(TypeError, match="no numbering str"):
        object.__new__(engine).write_dictionaries("frequency", tmp_path, tmp_path)
