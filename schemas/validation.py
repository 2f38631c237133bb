"""Checks of an artifact against its contract: the exact pyarrow schema, then the Great
Expectations 1.x suite (ephemeral context, no files written, progress bars off)."""

from __future__ import annotations

import functools
import logging
from typing import Any

import pyarrow as pa

from schemas.contracts import Contract

# GX reports each failing row by its index; we show at most this many per expectation.
MAX_ROWS_SHOWN = 10


class ContractViolation(ValueError):
    """An artifact that breaks its contract. The message names the artifact, the column(s) and
    the offending rows (0-based row indices in the artifact) with their values."""


@functools.lru_cache(maxsize=1)
def _gx_batch_definition() -> Any:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = ctx.data_sources.add_pandas("harnessrl").add_dataframe_asset(name="artifact")
    return asset.add_batch_definition_whole_dataframe("whole")


_SUITES: dict[tuple[str, int, str], Any] = {}


def _resolved(contract: Contract) -> list[tuple[Any, ...]]:
    """The contract's expectations with each ``in_set``'s values read now, as a tuple (a
    registry's values are the names registered at this moment)."""
    return [(kind, col, tuple(args[0])) if kind == "in_set" else (kind, col, *args)
            for kind, col, *args in contract.expectations]


def _suite(contract: Contract) -> Any:
    expectations = _resolved(contract)
    key = (contract.name, contract.version, repr(expectations))  # a registry grown since: another suite
    if key not in _SUITES:
        _SUITES[key] = _build_suite(contract, expectations)
    return _SUITES[key]


def _build_suite(contract: Contract, expectations: list[tuple[Any, ...]]) -> Any:
    import great_expectations as gx
    import great_expectations.expectations as gxe

    suite = gx.ExpectationSuite(name=f"{contract.name}.v{contract.version}")
    for exp in expectations:
        kind, col, *args = exp
        if kind == "not_null":
            e = gxe.ExpectColumnValuesToNotBeNull(column=col)
        elif kind == "unique":
            e = gxe.ExpectColumnValuesToBeUnique(column=col)
        elif kind == "between":
            e = gxe.ExpectColumnValuesToBeBetween(column=col, min_value=args[0], max_value=args[1])
        elif kind == "in_set":
            e = gxe.ExpectColumnValuesToBeInSet(column=col, value_set=list(args[0]))
        elif kind == "compound_unique":
            e = gxe.ExpectCompoundColumnsToBeUnique(column_list=list(col))
        else:
            raise ValueError(f"contract {contract.name}: unknown expectation kind {kind!r}")
        suite.add_expectation(e)
    return suite


def check_schema(contract: Contract, table: pa.Table) -> None:
    """Raise :class:`ContractViolation` unless ``table.schema`` has exactly the contract's
    column names, order and types (metadata ignored)."""
    want, got = contract.schema, table.schema
    missing = [n for n in want.names if n not in got.names]
    extra = [n for n in got.names if n not in want.names]
    if missing or extra:
        raise ContractViolation(
            f"artifact {contract.name!r} v{contract.version}: missing columns {missing}, unexpected columns {extra}"
        )
    for f in want:
        g = got.field(f.name)
        if not g.type.equals(f.type):
            raise ContractViolation(
                f"artifact {contract.name!r} v{contract.version}: column {f.name!r} has type {g.type}, expected {f.type}"
            )
    if got.names != want.names:
        raise ContractViolation(f"artifact {contract.name!r}: column order {got.names} != contract order {want.names}")


def check_rows(contract: Contract, num_rows: int) -> None:
    """Raise :class:`ContractViolation` when a whole artifact of ``num_rows`` rows is empty and its
    contract says it may not be (``Contract.may_be_empty``): one line naming the artifact and the
    contract's likely cause. Called on the whole artifact (a write, a stream's commit), never on
    one row group."""
    if num_rows == 0 and not contract.may_be_empty:
        raise ContractViolation(f"{contract.name}: 0 rows ({contract.empty_cause})")


def check_expectations(contract: Contract, table: pa.Table) -> None:
    """Run the contract's Great Expectations suite over ``table``.

    An empty table passes every expectation (each is a map over rows); whether the artifact may be
    empty at all is :func:`check_rows`'s question.

    Raises:
        ContractViolation: naming every failed expectation with its column(s), the offending row
            indices and values (first :data:`MAX_ROWS_SHOWN` of each).
    """
    if not contract.expectations or table.num_rows == 0:
        return
    scalar_cols = [f.name for f in contract.schema if not pa.types.is_list(f.type)]
    df = table.select(scalar_cols).to_pandas()
    batch = _gx_batch_definition().get_batch(batch_parameters={"dataframe": df})
    result = batch.validate(_suite(contract), result_format="COMPLETE")
    if result.success:
        return
    problems = []
    for r in result.results:
        if r.success:
            continue
        kw = r.expectation_config.kwargs
        col = kw.get("column") or kw.get("column_list")
        rows = (r.result.get("unexpected_index_list") or [])[:MAX_ROWS_SHOWN]
        values = (r.result.get("partial_unexpected_list") or [])[:MAX_ROWS_SHOWN]
        if r.exception_info and r.exception_info.get("raised_exception"):
            detail = r.exception_info.get("exception_message")
        else:
            detail = f"rows {rows} values {values}"
        problems.append(f"{r.expectation_config.type} on column {col!r}: {detail}")
    raise ContractViolation(
        f"artifact {contract.name!r} v{contract.version} fails {len(problems)} expectation(s):\n  "
        + "\n  ".join(sorted(problems))
    )
