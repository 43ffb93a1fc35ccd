"""Spark Column expressions that several modules of the job build the same way.

Kept in one place so the count pass, the dictionaries, the rejects and the SQL engine spell
them alike: a small Python mapping inlined in the plan as a map literal (read partition →
first line, day → file name, column → first id), and a value's normalised hex text.
pyspark is imported inside the functions, so importing this module starts no JVM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column


def literal_map(mapping: Mapping[Any, Any]) -> "Column":
    """``mapping`` as one SQL map literal (a few entries: it is part of the query plan)."""
    from pyspark.sql import functions as F

    return F.create_map(*[F.lit(x) for key, value in mapping.items() for x in (key, value)])


def literal_lookup(mapping: Mapping[Any, Any], key: "Column | str") -> "Column":
    """``mapping[key]`` for every row (null where the key is not in it); ``key`` a column or
    its name."""
    from pyspark.sql import functions as F

    return F.element_at(literal_map(mapping), F.col(key) if isinstance(key, str) else key)


def hex_value(value: "Column | str") -> "Column":
    """An integer categorical value as its normalised text: 8 lowercase hex digits, as the
    dictionaries store it (dlrm_contracts.hex_text.format_hex spells it the same in numpy)."""
    from pyspark.sql import functions as F

    return F.lpad(F.lower(F.hex(value)), 8, "0")
