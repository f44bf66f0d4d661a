"""Reader for VisoGender (Hall et al., NeurIPS 2023 Datasets & Benchmarks; repository ``oxai/visogender``), used by
SocialCounterfactuals §5.3 (Table 3).

Files (reference notes B9): URL-only, tab-separated, one header line.

* Occupation-Object, ``data/visogender_data/OO/OO_Visogender_10052025.tsv`` (230 rows), columns
  :data:`OO_COLUMNS`.
* Occupation-Participant, ``data/visogender_data/OP/OP_Visogender_11012024.tsv`` (460 rows), columns
  :data:`OP_COLUMNS`.

Perceived genders are ``masculine`` / ``feminine``. A URL of ``NA`` (or empty) means no image was found; such rows
are kept with ``url`` None. Rows that are entirely empty are skipped.

Images: the user downloads them into one folder; ``image_name`` (a :meth:`str.format` pattern, default
``"{idx}.*"``, i.e. ``OO_1.jpg``) maps a row to its file, with the fields ``{idx}`` (the IDX column), ``{line}``
(1-based line number), ``{context}`` (OO / OP), ``{occupation}``, ``{basename}`` and ``{stem}`` of the URL. A glob
must match one file; a missing file gives ``image_path`` None (see :func:`counterfactory.data.pata.resolve_image`).

:func:`read_visogender` returns one row per image with columns :data:`COLUMNS`: ``context``, ``idx``, ``sector``,
``specialisation``, ``occupation``, ``other`` (the object for OO, the participant for OP), ``url``, ``licence``,
``occupation_gender``, ``participant_gender`` (None for OO), ``error_codes``, ``annotator``, ``line``,
``image_path``.
"""

from __future__ import annotations

import csv
import io
import logging
import os
from pathlib import Path

import pandas as pd

from ..errors import input_error
from ..settings import schema_default
from .pata import _url_basename, resolve_image

log = logging.getLogger(__name__)

URL_COLUMN = "URL type (Type NA if can't find)"
OO_COLUMNS = ["IDX", "Sector", "Specialisation", "Occupation", "Object", URL_COLUMN, "LICENSE OK?",
              "Occupation_perceived_gender", "Error codes", "Annotator"]
OP_COLUMNS = ["IDX", "Sector", "Specialisation", "Occupation", "Participant", URL_COLUMN, "Licence",
              "Occupation_perceived_gender", "Participant_perceived_gender", "Error codes", "Annotator"]
GENDERS = ("masculine", "feminine")
COLUMNS = ["context", "idx", "sector", "specialisation", "occupation", "other", "url", "licence",
           "occupation_gender", "participant_gender", "error_codes", "annotator", "line", "image_path"]
DEFAULT_IMAGE_NAME = schema_default("social_counterfactuals.probing.visogender.image_name")
FIX = "use the official OO/OP TSV of github.com/oxai/visogender (tab-separated, header {header})"


def _context_of(header: list[str]) -> str | None:
    if header == OO_COLUMNS:
        return "OO"
    if header == OP_COLUMNS:
        return "OP"
    return None


def read_visogender(path: str | Path, image_dir: str | Path | None = None,
                    image_name: str = DEFAULT_IMAGE_NAME, context: str | None = None) -> pd.DataFrame:
    """Read an OO or OP TSV (the context is recognised from the header; ``context`` checks it). Malformed input is
    an :class:`InputError` naming the file, the line and the fix."""
    path = Path(path)
    if not path.is_file():
        raise input_error(path, None, "VisoGender TSV not found",
                          "download OO_Visogender_*.tsv / OP_Visogender_*.tsv from github.com/oxai/visogender")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise input_error(path, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                          FIX.format(header="OO/OP")) from exc
    records = list(csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE))
    if not records:
        raise input_error(path, "line 1", "empty file", FIX.format(header="OO/OP"))
    header = [h.strip() for h in records[0]]
    while header and header[-1] == "":
        header.pop()
    found = _context_of(header)
    if found is None:
        raise input_error(path, "line 1 (header)", f"columns {header} are neither the OO columns {OO_COLUMNS} nor "
                          f"the OP columns {OP_COLUMNS}", FIX.format(header="as listed"))
    if context is not None and context.upper() != found:
        raise input_error(path, "line 1 (header)", f"is a {found} file but {context.upper()} was expected",
                          f"pass the {context.upper()} TSV here")
    cols = OO_COLUMNS if found == "OO" else OP_COLUMNS
    fix = FIX.format(header="\\t".join(cols))
    rows = []
    for lineno, rec in enumerate(records[1:], start=2):
        if not any(v.strip() for v in rec):
            continue
        where = f"line {lineno}"
        if len(rec) > len(cols) and not any(v.strip() for v in rec[len(cols):]):
            rec = rec[:len(cols)]
        if len(rec) != len(cols):
            raise input_error(path, where, f"has {len(rec)} tab-separated fields, the header has {len(cols)}", fix)
        r = dict(zip(cols, (v.strip() for v in rec)))
        if not r["IDX"]:
            raise input_error(path, where, "empty IDX", fix)
        if not r["Occupation"]:
            raise input_error(path, where, f"{r['IDX']}: empty Occupation", fix)
        genders = {"Occupation_perceived_gender": r["Occupation_perceived_gender"].lower()}
        if found == "OP":
            genders["Participant_perceived_gender"] = r["Participant_perceived_gender"].lower()
        for col, g in genders.items():
            if g not in GENDERS:
                raise input_error(path, where, f"{r['IDX']}: {col} is {g!r}, not masculine or feminine", fix)
        url = r[URL_COLUMN]
        url = None if url.upper() in ("", "NA", "N/A") else url
        base = _url_basename(url) if url else ""
        fields = {"idx": r["IDX"], "line": lineno, "context": found, "occupation": r["Occupation"],
                  "basename": base, "stem": os.path.splitext(base)[0]}
        rows.append({
            "context": found, "idx": r["IDX"], "sector": r["Sector"], "specialisation": r["Specialisation"],
            "occupation": r["Occupation"], "other": r["Object" if found == "OO" else "Participant"], "url": url,
            "licence": r["LICENSE OK?" if found == "OO" else "Licence"],
            "occupation_gender": genders["Occupation_perceived_gender"],
            "participant_gender": genders.get("Participant_perceived_gender"),
            "error_codes": r["Error codes"] or None, "annotator": r["Annotator"], "line": lineno,
            "image_path": resolve_image(image_dir, image_name, fields),
        })
    if not rows:
        raise input_error(path, None, "has a header but no rows", fix)
    frame = pd.DataFrame(rows, columns=COLUMNS)
    dup = frame["idx"].duplicated()
    if dup.any():
        i = int(dup.to_numpy().nonzero()[0][0])
        raise input_error(path, f"line {frame['line'].iloc[i]}", f"IDX {frame['idx'].iloc[i]!r} appears twice", fix)
    if image_dir is not None:
        log.info("VisoGender %s: %d of %d images found in %s", found, int(frame["image_path"].notna().sum()),
                 len(frame), image_dir)
    return frame


def load_visogender(oo_tsv: str | Path | None = None, op_tsv: str | Path | None = None,
                    image_dir: str | Path | None = None, image_name: str = DEFAULT_IMAGE_NAME) -> pd.DataFrame:
    """Both contexts in one frame (either file may be omitted, not both)."""
    parts = []
    if oo_tsv is not None:
        parts.append(read_visogender(oo_tsv, image_dir, image_name, context="OO"))
    if op_tsv is not None:
        parts.append(read_visogender(op_tsv, image_dir, image_name, context="OP"))
    if not parts:
        raise ValueError("load_visogender: give the OO TSV, the OP TSV or both")
    return pd.concat(parts, ignore_index=True)
