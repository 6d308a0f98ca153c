"""The "parquet" exporter: a profile's Chrome trace as typed columns in one Parquet file.

The file holds exactly the trace that the "chrome" exporter writes, as the columns of
``polyprof.formats.columnar`` (one row per event; the top-level keys in the file's metadata), so
``polyprof convert trace.parquet trace.json`` gives back the Chrome trace, and DuckDB, pandas or
polars read the events without parsing JSON. Needs pyarrow (``pip install 'polyprof[analysis]'``).

The path must end in ``.parquet`` (``polyprof.runtime.exporting.check_export_suffix``): ``polyprof convert``
and ``polyprof report`` tell a Parquet trace by that suffix.

Options: ``compression`` (``zstd``, the default, ``snappy``, ``gzip``, ``lz4``, ``brotli`` or
``none``).
"""

from __future__ import annotations

from typing import Any

import orjson

from polyprof.base.config import ProfileConfig
from polyprof.base.fileio import check_writable_path
from polyprof.base.trace import Trace
from polyprof.formats.columnar import (
    DEFAULT_COMPRESSION,
    check_compression,
    pyarrow_modules,
    write_parquet_trace,
)
from polyprof.hooks.components import Capabilities, Exporter
from polyprof.hooks.hookspecs import hookimpl
from polyprof.runtime.chrome_trace import chrome_trace_bytes
from polyprof.runtime.exporting import check_export_suffix

EXPORTER_NAME = "parquet"
VALID_OPTIONS = ("compression",)


class ParquetTraceExporter(Exporter):
    """Writes the Chrome trace as a Parquet trace (``.parquet``)."""

    name = EXPORTER_NAME
    suffixes = (".parquet",)

    def export(self, trace: Trace, path: str, **options: Any) -> str:
        unknown = sorted(set(options) - set(VALID_OPTIONS))
        if unknown:
            raise TypeError(
                f"unknown option(s) {unknown} for the {EXPORTER_NAME!r} exporter; "
                f"valid options: {list(VALID_OPTIONS)}"
            )
        compression = check_compression(options.get("compression", DEFAULT_COMPRESSION))
        check_export_suffix(EXPORTER_NAME, path)
        path = check_writable_path(path)
        pyarrow_modules()  # fail before the trace is rendered when pyarrow is missing
        # The chrome exporter's own text, parsed: the file holds exactly its trace (memory: the text,
        # the document and the columns at once, several times the chrome export's peak)
        doc = orjson.loads(chrome_trace_bytes(trace, path))
        return write_parquet_trace(doc, path, compression=compression)


@hookimpl(trylast=True)
def polyprof_make_exporter(config: ProfileConfig, name: str) -> Exporter | None:
    return ParquetTraceExporter() if name == EXPORTER_NAME else None


@hookimpl(trylast=True)
def polyprof_capabilities() -> Capabilities:
    return Capabilities(exporters=(EXPORTER_NAME,))


__all__ = ["ParquetTraceExporter"]
